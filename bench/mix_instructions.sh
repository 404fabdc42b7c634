#!/usr/bin/env bash
# Instructions per batch of the core's engine (bench/mix_instructions.cpp) under callgrind: the
# difference between a run of LO and one of HI batches over HI - LO, so set-up drops out.
#
#   bash bench/mix_instructions.sh [MODE...] [-- OPTIONS]   # modes: epoch one mix1 mix3 mix3eq (default: one mix1 mix3)
#   LO=500 HI=1500 BUILD=build/instructions bash bench/mix_instructions.sh one mix3 -- --batch 256
#
# Built with the flags of the core library in CMakeLists.txt (-O3). Needs g++ and valgrind.
set -eu -o pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
build="${BUILD:-$repo/build/instructions}"
lo="${LO:-500}"
hi="${HI:-1500}"
modes=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do modes+=("$1"); shift; done
[ $# -gt 0 ] && shift
[ ${#modes[@]} -eq 0 ] && modes=(one mix1 mix3)
mkdir -p "$build"
binary="$build/mix_instructions"
if [ ! -x "$binary" ] || [ -n "$(find "$repo/csrc/core" "$here/mix_instructions.cpp" -newer "$binary" -print -quit)" ]; then
  "${CXX:-g++}" -std=c++17 -O3 -pthread -I"$repo/csrc" "$here/mix_instructions.cpp" "$repo"/csrc/core/*.cpp \
    -o "$binary"
fi
count() {  # instructions of one run: MODE BATCHES OPTIONS...
  local mode="$1" batches="$2" out="$build/callgrind.$1.$2.out"
  shift 2
  valgrind --tool=callgrind --callgrind-out-file="$out" "$binary" "$mode" "$batches" "$@" >/dev/null 2>&1
  callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !done {gsub(",", "", $1); print $1; done = 1}'
}
for m in "${modes[@]}"; do
  a=$(count "$m" "$lo" "$@")
  b=$(count "$m" "$hi" "$@")
  echo "$m $* : $(( (b - a) / (hi - lo) )) instructions per batch"
done
