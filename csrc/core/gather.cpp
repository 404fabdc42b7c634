// The gather hot loop. Random rows miss the cache, so the loop prefetches rows a few ids ahead
// (memory-level parallelism), the batch's first rows before it starts, and copies common fixed
// sizes with inlined moves instead of calls.
#include "core/gather.h"

#include <cstring>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace fastload {

namespace {
constexpr int64_t kPrefetchAhead = 16;
constexpr int64_t kLine = 64;

inline void prefetch_row(const std::byte* p, int64_t bytes) {
  // The first lines start the misses; the hardware prefetcher follows a row's later lines.
  const int64_t lines = bytes < 4 * kLine ? (bytes + kLine - 1) / kLine : 4;
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(p + l * kLine, 0, 0);
}

template <int64_t kBytes>
void gather_fixed(const ColumnSpec& col, const int64_t* ids, int64_t count, std::byte* dst) {
  const std::byte* base = col.base;
  const int64_t pitch = col.pitch;
  for (int64_t i = 0; i < count && i < kPrefetchAhead; ++i) prefetch_row(base + ids[i] * pitch, kBytes);
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchAhead < count) prefetch_row(base + ids[i + kPrefetchAhead] * pitch, kBytes);
    std::memcpy(dst + i * kBytes, base + ids[i] * pitch, kBytes);
  }
}

#if defined(__x86_64__)
// Large rows fill batch buffers bigger than the caches, and several are in flight: ordinary
// stores would first read every destination line (read-for-ownership) and evict the source
// rows. Streaming stores write around the cache.
constexpr int64_t kStreamingRowBytes = 16 * 1024;

void copy_streaming(std::byte* dst, const std::byte* src, int64_t bytes) {
  const int64_t head = static_cast<int64_t>((16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, static_cast<size_t>(bytes - i));
}

void gather_streaming(const ColumnSpec& col, const int64_t* ids, int64_t count, std::byte* dst) {
  const std::byte* base = col.base;
  const int64_t pitch = col.pitch, bytes = col.row_bytes;
  for (int64_t i = 0; i < count; ++i) {
    if (i + 1 < count) prefetch_row(base + ids[i + 1] * pitch, bytes);
    copy_streaming(dst + i * bytes, base + ids[i] * pitch, bytes);
  }
  // Streaming stores are weakly ordered: make them visible before the batch is published.
  _mm_sfence();
}
#endif

void gather_any(const ColumnSpec& col, const int64_t* ids, int64_t count, std::byte* dst) {
  const std::byte* base = col.base;
  const int64_t pitch = col.pitch, bytes = col.row_bytes;
  for (int64_t i = 0; i < count && i < kPrefetchAhead; ++i) prefetch_row(base + ids[i] * pitch, bytes);
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchAhead < count) prefetch_row(base + ids[i + kPrefetchAhead] * pitch, bytes);
    std::memcpy(dst + i * bytes, base + ids[i] * pitch, static_cast<size_t>(bytes));
  }
}
}  // namespace

void gather_rows(const ColumnSpec& col, const int64_t* ids, int64_t count, std::byte* dst) {
  switch (col.row_bytes) {
    case 1: return gather_fixed<1>(col, ids, count, dst);
    case 2: return gather_fixed<2>(col, ids, count, dst);
    case 4: return gather_fixed<4>(col, ids, count, dst);
    case 8: return gather_fixed<8>(col, ids, count, dst);
    case 16: return gather_fixed<16>(col, ids, count, dst);
    case 32: return gather_fixed<32>(col, ids, count, dst);
    case 64: return gather_fixed<64>(col, ids, count, dst);
    case 128: return gather_fixed<128>(col, ids, count, dst);
    case 256: return gather_fixed<256>(col, ids, count, dst);
    case 512: return gather_fixed<512>(col, ids, count, dst);
    case 1024: return gather_fixed<1024>(col, ids, count, dst);
    case 2048: return gather_fixed<2048>(col, ids, count, dst);
    default:
#if defined(__x86_64__)
      if (col.row_bytes >= kStreamingRowBytes) return gather_streaming(col, ids, count, dst);
#endif
      return gather_any(col, ids, count, dst);
  }
}

}  // namespace fastload
