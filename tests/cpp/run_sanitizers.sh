#!/usr/bin/env bash
# Builds the C++ core (csrc/core/*.cpp) with tests/cpp/test_core.cpp twice -- under
# ThreadSanitizer, and under AddressSanitizer + UndefinedBehaviorSanitizer -- runs both, and
# prints one summary line "N passed, M failed" (test cases over both builds). Exits non-zero if a
# build fails, a check fails, or a sanitizer reports. Works from any directory.
#
#   bash tests/cpp/run_sanitizers.sh            # both builds
#   SANITIZERS=tsan bash tests/cpp/run_sanitizers.sh    # only one (tsan | asan)
#   bash tests/cpp/run_sanitizers.sh engine     # only cases whose name contains "engine"
#
# Needs g++ with its sanitizer runtimes (Debian/Ubuntu: libtsan2, libasan8, libubsan1, which
# come with g++-12).
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${FASTLOAD_SANITIZER_BUILD_DIR:-$repo/build/sanitizers}"
cxx="${CXX:-g++}"
filter="${1:-}"
builds="${SANITIZERS:-tsan asan}"
run_timeout="${FASTLOAD_SANITIZER_RUN_TIMEOUT:-170}"  # seconds per binary (cases have a 60 s watchdog)

mkdir -p "$build"
common=(-std=c++17 -O1 -g -pthread -Wall -Wextra -I"$repo/csrc")
sources=("$repo"/csrc/core/*.cpp "$repo/tests/cpp/test_core.cpp")

flags_for() {
  case "$1" in
    tsan) echo "-fsanitize=thread" ;;
    asan) echo "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" ;;
  esac
}

# Compile each build's translation units in parallel (objects per build), then link.
compile() {
  local name="$1" dir="$build/$1" objs=() pids=() rc=0 src obj
  mkdir -p "$dir"
  # shellcheck disable=SC2046
  for src in "${sources[@]}"; do
    obj="$dir/$(basename "${src%.cpp}").o"
    objs+=("$obj")
    "$cxx" "${common[@]}" $(flags_for "$name") -c "$src" -o "$obj" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ "$rc" -eq 0 ] || return 1
  # shellcheck disable=SC2046
  "$cxx" "${common[@]}" $(flags_for "$name") "${objs[@]}" -o "$dir/test_core"
}

total_pass=0
total_fail=0
status=0
start_all=$(date +%s)

for name in $builds; do
  case "$name" in tsan|asan) ;; *) echo "unknown build '$name' (tsan | asan)"; exit 2 ;; esac
  echo "=== $name: compiling"
  t0=$(date +%s)
  if ! compile "$name"; then
    echo "=== $name: COMPILATION FAILED"
    total_fail=$((total_fail + 1))
    status=1
    continue
  fi
  echo "=== $name: compiled in $(( $(date +%s) - t0 )) s; running"
  log="$build/$name/test_core.log"
  t0=$(date +%s)
  if [ "$name" = tsan ]; then
    env TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
      timeout -k 5 "$run_timeout" "$build/$name/test_core" ${filter:+"$filter"} 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  else
    env ASAN_OPTIONS="detect_leaks=1 ${ASAN_OPTIONS:-}" \
      UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}" \
      timeout -k 5 "$run_timeout" "$build/$name/test_core" ${filter:+"$filter"} 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
  fi
  pass=$(grep -c '^\[ PASS \]' "$log")
  fail=$(grep -c '^\[ FAIL \]' "$log")
  runs=$(grep -c '^\[ RUN  \]' "$log")
  # A case that started and never reported ended the process (sanitizer halt, crash, timeout).
  crashed=$((runs - pass - fail))
  if [ "$crashed" -gt 0 ]; then
    echo "=== $name: a case did not finish (exit status $rc): counted as failed"
    fail=$((fail + crashed))
  fi
  # A sanitizer report, or a non-zero exit with no failed case (e.g. a leak report at exit).
  if grep -qE '^(WARNING: ThreadSanitizer|==[0-9]+==ERROR: (Address|Leak)Sanitizer|.*runtime error: )' "$log" \
      || { [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; }; then
    [ "$fail" -eq 0 ] && fail=1
    echo "=== $name: sanitizer report or abnormal exit (status $rc)"
  fi
  [ "$rc" -ne 0 ] && [ "$rc" -eq 124 ] && echo "=== $name: timed out after $run_timeout s"
  echo "=== $name: $pass passed, $fail failed in $(( $(date +%s) - t0 )) s (exit status $rc)"
  total_pass=$((total_pass + pass))
  total_fail=$((total_fail + fail))
  { [ "$rc" -ne 0 ] || [ "$fail" -ne 0 ]; } && status=1
done

echo "=== total time $(( $(date +%s) - start_all )) s"
echo "$total_pass passed, $total_fail failed"
exit "$status"
