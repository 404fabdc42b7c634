#!/usr/bin/env bash
# Builds and runs the C++ tests twice -- under ThreadSanitizer, and under AddressSanitizer +
# UndefinedBehaviorSanitizer -- and prints one summary line "N passed, M failed" (test cases over
# every binary of both builds). Exits non-zero if a build fails, a check fails, or a sanitizer
# reports. Works from any directory.
#
#   the core (csrc/core/*.cpp), one binary per header tested, sharing core_fixtures.h:
#     test_sampler      permutation.h, sampler.h (the sampling contract)
#     test_gather       gather.h, cpu_cache.h
#     test_thread_pool  thread_pool.h
#     test_buffer_pool  buffer_pool.h
#     test_engine       engine.h (threads, buffers, epochs, errors)
#     test_pipeline     pipeline.h as a native consumer uses it
#     test_fork_guard   fork_guard.h
#     test_lazy_mappings  lazy_mappings.h (files mapped on demand)
#     test_stream       step-based sampling (mixture schedule, stream plans, mixed sources)
#     test_arrow        arrow_source.h (arrays built by hand; the row-group cache from threads)
#   test_images    the decode stage (csrc/image/*.cpp) with libjpeg and libpng: images decoded on
#                  the engine's threads, bad files, every prefix of a file, crops of every kind;
#                  left out (and said so) where the libjpeg or libpng headers are missing
#   test_tar       tar_index.h, npy_header.h, tar_source.h: tars built byte by byte (ustar, PAX, GNU
#                  long names), every prefix and corrupted header byte, TarSource filled from threads
#   test_packing   packing_plan.h, pack_epoch.h, pack_plan.h, pack_source.h (fl.Pack)
#   test_transfer  the core and the CUDA layer (csrc/cuda/*.cpp) with tests/cpp/test_transfer.cpp,
#                  run against the stand-in driver (tests/fake_cuda/fake_libcuda.cpp), built here
#                  under the same sanitizer (a TSan-instrumented .so for the TSan build) and
#                  named by FASTLOAD_LIBCUDA
#
#   bash tests/cpp/run_sanitizers.sh            # both builds
#   SANITIZERS=tsan bash tests/cpp/run_sanitizers.sh    # only one (tsan | asan)
#   bash tests/cpp/run_sanitizers.sh engine     # only cases whose name contains "engine"
#
# Needs g++ with its sanitizer runtimes (Debian/Ubuntu: libtsan2, libasan8, libubsan1, which
# come with g++-12) and python3 (tests/fake_cuda/build.py).
set -u -o pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
build="${FASTLOAD_SANITIZER_BUILD_DIR:-$repo/build/sanitizers}"
cxx="${CXX:-g++}"
python="${PYTHON:-python3}"
filter="${1:-}"
builds="${SANITIZERS:-tsan asan}"
run_timeout="${FASTLOAD_SANITIZER_RUN_TIMEOUT:-170}"  # seconds per binary (cases have a 60 s watchdog)

mkdir -p "$build"
# -fno-var-tracking: line numbers in sanitizer reports stay; without it the larger test files take
# over a minute each to compile under ASan + UBSan.
common=(-std=c++17 -O1 -g -fno-var-tracking -pthread -Wall -Wextra -I"$repo/csrc")
core_sources=("$repo"/csrc/core/*.cpp)
cuda_sources=("$repo"/csrc/cuda/*.cpp)
# Each binary is tests/cpp/<name>.cpp linked with the core; cuda_binaries also with the CUDA layer.
core_binaries=(test_sampler test_gather test_thread_pool test_buffer_pool test_engine test_pipeline test_fork_guard
               test_lazy_mappings test_stream test_arrow test_packing)
cuda_binaries=(test_transfer)
image_sources=("$repo"/csrc/image/*.cpp)
image_binaries=(test_images test_tar)
image_flags=(-DFASTLOAD_WITH_LIBJPEG -DFASTLOAD_WITH_LIBPNG)
image_libs=(-ljpeg -lpng)
if ! printf '#include <cstdio>\n#include <jpeglib.h>\n#include <png.h>\nint main(){return 0;}\n' \
    | "$cxx" -x c++ - -fsyntax-only 2>/dev/null; then
  echo "=== test_images and test_tar left out: the libjpeg or libpng headers are missing (Debian: libjpeg-dev libpng-dev)"
  image_sources=()
  image_binaries=()
fi
binaries=("${core_binaries[@]}" "${cuda_binaries[@]}" "${image_binaries[@]}")

flags_for() {
  case "$1" in
    tsan) echo "-fsanitize=thread" ;;
    asan) echo "-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" ;;
  esac
}

# The stand-in driver's sanitizer, as tests/fake_cuda/build.py spells it.
fake_sanitizer_for() {
  case "$1" in
    tsan) echo "thread" ;;
    asan) echo "address,undefined" ;;
  esac
}

# Compiles every translation unit of a build in parallel (one object each, the core's and the CUDA
# layer's shared by every binary) and the stand-in driver beside them, then links. Leaves the
# stand-in's path in $dir/libcuda.path.
compile() {
  local name="$1" dir="$build/$1" pids=() rc=0 src binary
  mkdir -p "$dir"
  obj() { echo "$dir/$(basename "${1%.cpp}").o"; }
  local test_sources=()
  for binary in "${binaries[@]}"; do test_sources+=("$here/$binary.cpp"); done
  # shellcheck disable=SC2046
  for src in "${core_sources[@]}" "${cuda_sources[@]}" "${image_sources[@]}" "${test_sources[@]}"; do
    "$cxx" "${common[@]}" "${image_flags[@]}" $(flags_for "$name") -c "$src" -o "$(obj "$src")" &
    pids+=($!)
  done
  "$python" "$repo/tests/fake_cuda/build.py" "$dir" --sanitize "$(fake_sanitizer_for "$name")" \
    > "$dir/libcuda.path" &
  pids+=($!)
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  [ "$rc" -eq 0 ] || return 1
  local core_objs=() cuda_objs=() image_objs=()
  for src in "${core_sources[@]}"; do core_objs+=("$(obj "$src")"); done
  for src in "${cuda_sources[@]}"; do cuda_objs+=("$(obj "$src")"); done
  for src in "${image_sources[@]}"; do image_objs+=("$(obj "$src")"); done
  pids=()
  for binary in "${core_binaries[@]}"; do
    # shellcheck disable=SC2046
    "$cxx" "${common[@]}" $(flags_for "$name") "${core_objs[@]}" "$dir/$binary.o" -o "$dir/$binary" &
    pids+=($!)
  done
  for binary in "${cuda_binaries[@]}"; do
    # shellcheck disable=SC2046
    "$cxx" "${common[@]}" $(flags_for "$name") "${core_objs[@]}" "${cuda_objs[@]}" "$dir/$binary.o" \
      -ldl -o "$dir/$binary" &
    pids+=($!)
  done
  for binary in "${image_binaries[@]}"; do
    # shellcheck disable=SC2046
    "$cxx" "${common[@]}" $(flags_for "$name") "${core_objs[@]}" "${image_objs[@]}" "$dir/$binary.o" \
      "${image_libs[@]}" -o "$dir/$binary" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  return "$rc"
}

# Runs one binary of one build; prints its cases (the stand-in's own "MISUSE" lines, which the
# deliberate-misuse cases provoke, stay in the log only) and adds to the totals.
run_binary() {
  local name="$1" binary="$2" log="$build/$1/$2.log" rc pass fail runs crashed t0
  t0=$(date +%s)
  local sanitizer_env
  if [ "$name" = tsan ]; then
    sanitizer_env=(TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}")
  else
    sanitizer_env=(ASAN_OPTIONS="detect_leaks=1 ${ASAN_OPTIONS:-}"
                   UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}")
  fi
  env "${sanitizer_env[@]}" FASTLOAD_LIBCUDA="$(cat "$build/$name/libcuda.path")" \
    timeout -k 5 "$run_timeout" "$build/$name/$binary" ${filter:+"$filter"} 2>&1 \
    | tee "$log" | grep -v '^fake_libcuda MISUSE'
  rc=${PIPESTATUS[0]}
  pass=$(grep -c '^\[ PASS \]' "$log")
  fail=$(grep -c '^\[ FAIL \]' "$log")
  runs=$(grep -c '^\[ RUN  \]' "$log")
  # A case that started and never reported ended the process (sanitizer halt, crash, timeout).
  crashed=$((runs - pass - fail))
  if [ "$crashed" -gt 0 ]; then
    echo "=== $name/$binary: a case did not finish (exit status $rc): counted as failed"
    fail=$((fail + crashed))
  fi
  # A sanitizer report, or a non-zero exit with no failed case (e.g. a leak report at exit).
  if grep -qE '^(WARNING: ThreadSanitizer|==[0-9]+==ERROR: (Address|Leak)Sanitizer|.*runtime error: )' "$log" \
      || { [ "$rc" -ne 0 ] && [ "$fail" -eq 0 ]; }; then
    [ "$fail" -eq 0 ] && fail=1
    echo "=== $name/$binary: sanitizer report or abnormal exit (status $rc)"
  fi
  [ "$rc" -eq 124 ] && echo "=== $name/$binary: timed out after $run_timeout s"
  echo "=== $name/$binary: $pass passed, $fail failed in $(( $(date +%s) - t0 )) s (exit status $rc)"
  total_pass=$((total_pass + pass))
  total_fail=$((total_fail + fail))
  { [ "$rc" -ne 0 ] || [ "$fail" -ne 0 ]; } && status=1
  return 0
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
  for binary in "${binaries[@]}"; do run_binary "$name" "$binary"; done
done

echo "=== total time $(( $(date +%s) - start_all )) s"
echo "$total_pass passed, $total_fail failed"
exit "$status"
