// What the copy loops need to know of the CPU. The size of its last-level cache, which decides when a batch copy should write around
// the cache (see gather.cpp): a destination that fits stays cached for the next batch into the
// same recycled buffer and for the training step that reads it; one that does not only evicts.
#pragma once
#include <cstdint>

namespace fastload {

// Bytes of the largest cache CPU 0 reports in sysfs (on AMD, one CCX's L3: the cache the
// collation threads actually share, not the whole package's total that sysconf reports).
// kDefaultLastLevelCacheBytes where sysfs says nothing (containers without /sys, other OSes).
int64_t last_level_cache_bytes();

constexpr int64_t kDefaultLastLevelCacheBytes = int64_t{32} << 20;

// Whether the CPU runs AVX2 (x86-64; false elsewhere), read once. The build targets the
// baseline ISA, so code that uses AVX2 is compiled for it apart and chosen by this check: an
// explicit check rather than target_clones, whose ifunc resolver runs before sanitizer runtimes
// start and crashes instrumented builds.
bool cpu_has_avx2();

// Parses a sysfs cache size ("32768K", "1M", "512"); 0 if unreadable. Exposed for tests.
int64_t parse_cache_size(const char* text);

}  // namespace fastload
