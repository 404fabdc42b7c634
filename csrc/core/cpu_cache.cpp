// Reads the last-level cache size and the AVX2 flag once; see cpu_cache.h.
#include "core/cpu_cache.h"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace fastload {

int64_t parse_cache_size(const char* text) {
  if (!text) return 0;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (end == text || value <= 0) return 0;
  while (*end == ' ') ++end;
  switch (std::toupper(static_cast<unsigned char>(*end))) {
    case 'K': return static_cast<int64_t>(value) << 10;
    case 'M': return static_cast<int64_t>(value) << 20;
    case 'G': return static_cast<int64_t>(value) << 30;
    default: return static_cast<int64_t>(value);
  }
}

namespace {
int64_t read_sysfs_largest_cache() {
  int64_t largest = 0;
  for (int index = 0; index < 16; ++index) {
    const std::string path = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/size";
    std::FILE* f = std::fopen(path.c_str(), "r");
    if (!f) continue;  // indices may have gaps; 16 covers every CPU we know of
    char text[64] = {};
    const bool read = std::fgets(text, sizeof text, f) != nullptr;
    std::fclose(f);
    if (read) {
      const int64_t bytes = parse_cache_size(text);
      if (bytes > largest) largest = bytes;
    }
  }
  return largest;
}
}  // namespace

// AVX2 is usable when the CPU has it (CPUID leaf 7) and the OS saves the YMM registers (XGETBV).
// Read here rather than through __builtin_cpu_supports, whose __cpu_model lives in the compiler's
// runtime library and cannot be linked into the shared module by every toolchain (zig's clang,
// which builds the manylinux wheel, refuses the relocation).
bool cpu_has_avx2() {
#if defined(__x86_64__)
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX)) return false;
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x6) != 0x6) return false;  // the OS saves both the XMM and the YMM state
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    return (b & bit_AVX2) != 0;
  }();
  return has;
#else
  return false;
#endif
}

int64_t last_level_cache_bytes() {
  static const int64_t bytes = [] {
    const int64_t found = read_sysfs_largest_cache();
    return found > 0 ? found : kDefaultLastLevelCacheBytes;
  }();
  return bytes;
}

}  // namespace fastload
