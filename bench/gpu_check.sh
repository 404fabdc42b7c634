#!/usr/bin/env bash
# One command for a GPU machine: build and install fastload, run the GPU tests with
# FASTLOAD_REQUIRE_CUDA=1 (a missing or unusable GPU fails them), the rest of the suite, then the
# GPU benchmark. Everything is tee'd into ${OUT:-/tmp}/gpu_check.log (the benchmark's figures also
# into bench_gpu.json beside it). Exits non-zero if the build or the GPU tests failed (or the rest
# of the suite); the benchmark runs in any case. BENCH_ARGS passes options to the benchmark
# (e.g. BENCH_ARGS=--quick).
set -u -o pipefail
cd "$(dirname "$0")/.."

LOG_DIR="${OUT:-/tmp}"
mkdir -p "$LOG_DIR"
LOG="$LOG_DIR/gpu_check.log"

run_all() {
    local status=0 build_rc cuda_rc suite_rc bench_rc
    echo "== date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "== nvidia-smi"
    if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi; else echo "nvidia-smi: not found"; fi
    echo "== tree: $(git describe --always --dirty 2>/dev/null || echo 'not a git checkout')"
    python3 -c 'import sys, torch, numpy
print("python", sys.version.split()[0], "| torch", torch.__version__, "CUDA", torch.version.cuda,
      "| numpy", numpy.__version__, "| cuda available:", torch.cuda.is_available(),
      "|", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
    # The stand-in driver of the CPU test suite must not replace the real one here.
    unset FASTLOAD_LIBCUDA
    export PYTHONUNBUFFERED=1

    echo "== build and install"
    timeout "${BUILD_TIMEOUT:-1200}" python3 -m pip install --no-build-isolation --no-deps . ; build_rc=$?

    echo "== GPU tests (FASTLOAD_REQUIRE_CUDA=1)"
    FASTLOAD_REQUIRE_CUDA=1 timeout "${TEST_TIMEOUT:-1200}" python3 -m pytest tests/cuda -v ; cuda_rc=$?

    echo "== the rest of the suite (not slow)"
    timeout "${TEST_TIMEOUT:-1200}" python3 -m pytest -x -q -m "not slow" --ignore=tests/cuda ; suite_rc=$?

    echo "== GPU benchmark"
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
    timeout "${BENCH_TIMEOUT:-1800}" python3 bench/bench_gpu.py --json "$LOG_DIR/bench_gpu.json" ${BENCH_ARGS:-} ; bench_rc=$?

    echo "== summary: build rc=$build_rc, GPU tests rc=$cuda_rc, rest of the suite rc=$suite_rc, benchmark rc=$bench_rc"
    echo "== log: $LOG"
    [ "$build_rc" -eq 0 ] && [ "$cuda_rc" -eq 0 ] && [ "$suite_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] || status=1
    return $status
}

run_all 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
