#!/usr/bin/env bash
# The GPU check: one command on a GPU machine, each step bounded in time, so that a run lent for
# at most 10 minutes gives a true answer even when a step hangs.
#
#   bash bench/gpu_check.sh               the check (at most 9 minutes): build and install,
#                                         tests/cuda -m cuda with FASTLOAD_REQUIRE_CUDA=1, the rest of the
#                                         suite as CI runs it (no GPU visible, not slow), the
#                                         quick benchmark, a summary table
#   bash bench/gpu_check.sh --full-bench  a second call (at most 9 minutes): build and install,
#                                         then the full benchmark alone, and the summary
#
# Everything goes to ${OUT:-/tmp/fastload-gpu-check}: gpu_check.log (all output), bench_gpu.json
# (every benchmark round), summary.txt (the table printed at the end), junit_cuda.xml and
# junit_suite.xml (per-test results), steps.tsv (each step's status and time).
# Exits 0 only if every step passed.
#
# Environment: GPU_CHECK_SKIP_BUILD=1 uses the fastload already installed (CI's stand-in run);
# GPU_CHECK_TIMEOUT_<STEP> (seconds) overrides a step's bound, STEP one of ENVIRONMENT, BUILD,
# GPU_TESTS, SUITE, BENCHMARK; GPU_CHECK_TEST_TIMEOUT is the bound of one test (default 80 s);
# GPU_CHECK_SUITE_ARGS (space-separated paths or node ids) replaces the suite step's selection;
# BENCH_ARGS adds benchmark options.
set -u -o pipefail
cd "$(dirname "$0")/.."

MODE=check
case "${1:-}" in
    "" | --quick) ;;
    --full-bench) MODE=full-bench ;;
    -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown option '$1' (use --full-bench, or no option)" >&2; exit 2 ;;
esac

OUT_DIR="${OUT:-/tmp/fastload-gpu-check}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
STEPS="$OUT_DIR/steps.tsv"
PY="${PYTHON:-python3}"

# Bounds in seconds. The worst case, every step running into its bound and then ignoring SIGINT
# for KILL_AFTER seconds, is 540 s in either mode (check: 20 + 100 + 90 + 180 + 90 + 10 + 5 x 10;
# full bench: 20 + 100 + 380 + 10 + 3 x 10): the 10-minute limit of one call keeps a minute for
# start-up and copying results out. Measured on a 2-core machine: the build took 72 s of CPU (on
# 16 cores with ninja, well under 100 s of wall time); the not-slow suite ~270 s of wall time.
if [ "$MODE" = check ]; then
    DEFAULT_BENCH=90
else
    DEFAULT_BENCH=380
fi
T_ENVIRONMENT="${GPU_CHECK_TIMEOUT_ENVIRONMENT:-20}"
T_BUILD="${GPU_CHECK_TIMEOUT_BUILD:-100}"
T_GPU_TESTS="${GPU_CHECK_TIMEOUT_GPU_TESTS:-90}"
T_SUITE="${GPU_CHECK_TIMEOUT_SUITE:-180}"
T_BENCHMARK="${GPU_CHECK_TIMEOUT_BENCHMARK:-$DEFAULT_BENCH}"
T_TEST="${GPU_CHECK_TEST_TIMEOUT:-80}"
KILL_AFTER=10

# A bound per test: pytest-timeout where installed (the GPU machine has it); else pytest's own
# faulthandler_timeout dumps every thread's stack when a test runs too long, and the step's bound
# stops the run.
if "$PY" -c "import pytest_timeout" >/dev/null 2>&1; then
    TEST_TIMEOUT_OPTS=(-p timeout "--timeout=$T_TEST")
else
    TEST_TIMEOUT_OPTS=(-o "faulthandler_timeout=$T_TEST")
fi
# The suite on 4 processes where pytest-xdist is installed (the GPU machine has it) and there are
# cores for them: one process took ~270 s here (2 busy cores), more than its bound.
SUITE_PARALLEL=()
if [ "$(nproc)" -ge 8 ] && "$PY" -c "import xdist" >/dev/null 2>&1; then
    SUITE_PARALLEL=(-p xdist -n 4)
fi

now() { date +%s.%N; }

# step NAME BOUND COMMAND...: runs COMMAND under `timeout` (SIGINT first, so pytest still writes
# its report, then SIGKILL KILL_AFTER s later), records "name status rc seconds bound" in steps.tsv.
step() {
    local name=$1 bound=$2 start rc status seconds
    shift 2
    echo
    echo "== $name (bounded at ${bound} s): $*"
    start=$(now)
    timeout --signal=INT --kill-after="$KILL_AFTER" "$bound" "$@"
    rc=$?
    seconds=$(awk -v a="$start" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }')
    case $rc in
        0) status=ok ;;
        124 | 137) status=timeout ;;
        *) status=failed ;;
    esac
    printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$seconds" "$bound" >>"$STEPS"
    echo "== $name: $status (rc=$rc) in ${seconds} s"
    return "$rc"
}

skip() {
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" skipped - 0 0 >>"$STEPS"
    echo
    echo "== $1: skipped ($2)"
}

environment() {
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ); mode: $MODE; host: $(hostname), $(nproc) CPUs"
    echo "tree: $(git describe --always --dirty 2>/dev/null || echo 'not a git checkout (copied tree)')"
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
            >"$OUT_DIR/nvidia_smi.csv"
    else
        echo "nvidia-smi: not found"
    fi
    "$PY" bench/gpu_check_report.py environment --out "$OUT_DIR"
}

build() {
    CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" "$PY" -m pip install --no-build-isolation --no-deps . || return
    # From another directory: the installed package, not the source tree, must import.
    (cd / && "$PY" -c "import fastload, fastload._C; print('installed:', fastload.__file__)")
}

run_all() {
    local failed=0
    : >"$STEPS"
    # The stand-in driver of the CPU suite must not replace the real one (the suite's stand-in
    # tests set it themselves).
    unset FASTLOAD_LIBCUDA
    export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
    rm -f "$OUT_DIR/bench_gpu.json" "$OUT_DIR/junit_cuda.xml" "$OUT_DIR/junit_suite.xml" \
        "$OUT_DIR/environment.json" "$OUT_DIR/nvidia_smi.csv" "$OUT_DIR/summary.txt"

    # `timeout` runs programs, not shell functions: the steps that are functions run in a bash
    # that inherits them.
    export -f environment build
    export OUT_DIR PY MODE
    step environment "$T_ENVIRONMENT" bash -c environment || failed=1

    if [ "${GPU_CHECK_SKIP_BUILD:-0}" = 1 ]; then
        skip build "GPU_CHECK_SKIP_BUILD=1: the installed fastload is tested"
    else
        step build "$T_BUILD" bash -c build || failed=1
    fi

    if [ "$MODE" = check ]; then
        FASTLOAD_REQUIRE_CUDA=1 step "GPU tests" "$T_GPU_TESTS" \
            "$PY" -m pytest tests/cuda -m cuda -v -p no:cacheprovider "${TEST_TIMEOUT_OPTS[@]}" \
            --junitxml="$OUT_DIR/junit_cuda.xml" || failed=1

        # As CI runs it: no GPU visible, so device=None means the CPU and the stand-in driver's
        # tests (tests/cuda/test_standin_*.py, not marked cuda) run; no -x, so one failure does not
        # hide the rest.
        local suite_args=(-m "not slow and not cuda")
        # shellcheck disable=SC2206  # space-separated test paths or node ids
        [ -n "${GPU_CHECK_SUITE_ARGS:-}" ] && suite_args=($GPU_CHECK_SUITE_ARGS)
        CUDA_VISIBLE_DEVICES= step "rest of the suite" "$T_SUITE" \
            "$PY" -m pytest -q -p no:cacheprovider "${TEST_TIMEOUT_OPTS[@]}" "${SUITE_PARALLEL[@]}" \
            --junitxml="$OUT_DIR/junit_suite.xml" "${suite_args[@]}" || failed=1
    fi

    local bench_args=()
    [ "$MODE" = check ] && bench_args=(--quick)
    # shellcheck disable=SC2206  # BENCH_ARGS is a list of options
    bench_args+=(${BENCH_ARGS:-})
    step benchmark "$T_BENCHMARK" "$PY" bench/bench_gpu.py --json "$OUT_DIR/bench_gpu.json" \
        "${bench_args[@]}" || failed=1

    echo
    timeout 10 "$PY" bench/gpu_check_report.py summary --out "$OUT_DIR" --mode "$MODE" || failed=1
    echo "== results: $OUT_DIR (gpu_check.log, summary.txt, bench_gpu.json, junit_*.xml)"
    return "$failed"
}

run_all 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
