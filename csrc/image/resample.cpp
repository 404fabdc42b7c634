// The two-pass resize; see resample.h. Each pass has an AVX2 form (chosen at run time where the
// CPU has it), an SSE2 form (x86-64's baseline) and a scalar form; all compute the same integer
// sums, so they give the same bytes (tests/test_images_resample.py compares them).
#include "image/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <atomic>

#include "core/cpu_cache.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fastload::image {

namespace {

constexpr int kPrecision = 14;  // 16-bit weights: 1.0 is 16384, inside int16 with room to round
constexpr int32_t kHalf = 1 << (kPrecision - 1);

#if defined(__SSE2__)
// Weights k[0], k[1] in every 32-bit lane (the pair _mm_madd_epi16 multiplies adjacent lanes by).
inline __m128i pair_at(const int16_t* k) {
  int32_t two;
  std::memcpy(&two, k, 4);
  return _mm_set1_epi32(two);
}
#endif

inline uint8_t clip8(int32_t acc) {
  const int32_t v = acc >> kPrecision;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

double triangle(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// Horizontal pass over source rows [y_begin, y_end): the window's columns, RGBX, into `dst`
// (4 * out_n bytes a row). Weights come in pairs (taps is even, zero padded): a 16-byte load
// covers four taps, reading at most three pixels past the last one weighted (zero weights; the
// region's slack keeps the read inside it).
inline const uint8_t* source_row(const PixelRegion& src, int y) {
  return src.data + (y - src.y0) * src.stride - static_cast<ptrdiff_t>(src.x0) * 4;
}

void horizontal_scalar(const PixelRegion& src, const AxisFilter& fx, int y_begin, int y_end, uint8_t* dst) {
  const int n = fx.out_n, taps = fx.taps;
  for (int y = y_begin; y < y_end; ++y) {
    const uint8_t* row = source_row(src, y);
    uint8_t* d = dst + static_cast<size_t>(y - y_begin) * n * 4;
    for (int o = 0; o < n; ++o, d += 4) {
      const uint8_t* p = row + static_cast<ptrdiff_t>(fx.first[static_cast<size_t>(o)]) * 4;
      const int16_t* k = fx.coeffs.data() + static_cast<size_t>(o) * taps;
      const int count = fx.count[static_cast<size_t>(o)];
      int32_t s[4] = {kHalf, kHalf, kHalf, kHalf};
      for (int t = 0; t < count; ++t)
        for (int c = 0; c < 4; ++c) s[c] += p[t * 4 + c] * k[t];
      for (int c = 0; c < 4; ++c) d[c] = clip8(s[c]);
    }
  }
}

void vertical_row_scalar(const uint8_t* first, ptrdiff_t stride, const int16_t* k, int count, size_t bytes,
                         uint8_t* out) {
  for (size_t i = 0; i < bytes; ++i) {
    int32_t s = kHalf;
    for (int t = 0; t < count; ++t) s += first[t * stride + static_cast<ptrdiff_t>(i)] * k[t];
    out[i] = clip8(s);
  }
}

#if defined(__SSE2__)
// One output pixel: `count` taps from p with weights k, as 32-bit sums per channel (+ kHalf).
inline __m128i pixel_sums_sse2(const uint8_t* p, const int16_t* k, int count) {
  const __m128i zero = _mm_setzero_si128();
  __m128i acc = _mm_set1_epi32(kHalf);
  int t = 0;
  for (; t + 2 < count; t += 4) {
    // Four pixels -> 16-bit [r0 r1 g0 g1 b0 b1 x0 x1] and [r2 r3 ...], times (k0, k1), (k2, k3).
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + t * 4));
    const __m128i lo = _mm_unpacklo_epi8(v, zero), hi = _mm_unpackhi_epi8(v, zero);
    acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_unpacklo_epi16(lo, _mm_srli_si128(lo, 8)), pair_at(k + t)));
    acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_unpacklo_epi16(hi, _mm_srli_si128(hi, 8)), pair_at(k + t + 2)));
  }
  if (t < count) {  // one or two taps left: two pixels (the second weighted 0 when only one)
    const __m128i px = _mm_unpacklo_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + t * 4)), zero);
    acc = _mm_add_epi32(acc, _mm_madd_epi16(_mm_unpacklo_epi16(px, _mm_srli_si128(px, 8)), pair_at(k + t)));
  }
  return acc;
}

inline void store_pixel_sse2(__m128i acc, uint8_t* d) {
  acc = _mm_srai_epi32(acc, kPrecision);
  acc = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
  const int32_t packed = _mm_cvtsi128_si32(acc);
  std::memcpy(d, &packed, 4);
}

void horizontal_sse2(const PixelRegion& src, const AxisFilter& fx, int y_begin, int y_end, uint8_t* dst) {
  const int n = fx.out_n, taps = fx.taps;
  for (int y = y_begin; y < y_end; ++y) {
    const uint8_t* row = source_row(src, y);
    uint8_t* d = dst + static_cast<size_t>(y - y_begin) * n * 4;
    for (int o = 0; o < n; ++o, d += 4) {
      const uint8_t* p = row + static_cast<ptrdiff_t>(fx.first[static_cast<size_t>(o)]) * 4;
      store_pixel_sse2(pixel_sums_sse2(p, fx.coeffs.data() + static_cast<size_t>(o) * taps,
                                       fx.count[static_cast<size_t>(o)]), d);
    }
  }
}

// Vertical pass for one output row: `count` rows (`stride` apart, from `first`) weighted by `k`,
// `bytes` bytes of each (RGBX), into `out`. Rows are read in whole 16-byte vectors.
void vertical_row_sse2(const uint8_t* first, ptrdiff_t stride, const int16_t* k, int count, size_t bytes,
                       uint8_t* out) {
  const __m128i zero = _mm_setzero_si128();
  size_t i = 0;
  for (; i < bytes; i += 16) {
    __m128i s0 = _mm_set1_epi32(kHalf), s1 = s0, s2 = s0, s3 = s0;
    for (int t = 0; t < count; t += 2) {
      // Two rows byte by byte: [a0 b0 a1 b1 ...] -> 16-bit pairs, times (k0, k1) (k1 = 0 past the end).
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(first + t * stride + i));
      const bool pair = t + 1 < count;
      const __m128i b = pair ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(first + (t + 1) * stride + i)) : zero;
      const __m128i w = pair_at(k + t);  // k[t + 1] is 0 past the last tap
      const __m128i lo = _mm_unpacklo_epi8(a, b), hi = _mm_unpackhi_epi8(a, b);
      s0 = _mm_add_epi32(s0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), w));
      s1 = _mm_add_epi32(s1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), w));
      s2 = _mm_add_epi32(s2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), w));
      s3 = _mm_add_epi32(s3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), w));
    }
    s0 = _mm_srai_epi32(s0, kPrecision);
    s1 = _mm_srai_epi32(s1, kPrecision);
    s2 = _mm_srai_epi32(s2, kPrecision);
    s3 = _mm_srai_epi32(s3, kPrecision);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm_packus_epi16(_mm_packs_epi32(s0, s1), _mm_packs_epi32(s2, s3)));
  }
}
#endif

#if defined(__x86_64__)
// AVX2: the SSE2 sums, two at a time in the two 128-bit lanes (every AVX2 shuffle used here stays
// within its lane), so each output byte is the same integer sum: the bytes equal the SSE2 and
// scalar paths' (tests/test_images_resample.py).

// Horizontal: two source rows at once, row y in the low lane and row y + 1 in the high one, for
// the same output pixel: one lookup of its filter and one broadcast of each weight pair serve
// both rows, and each lane reads exactly what the SSE2 form reads for its row. An odd last row
// goes through the SSE2 form.
__attribute__((target("avx2"))) inline __m256i load2(const uint8_t* p0, const uint8_t* p1) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p0))),
                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(p1)), 1);
}

__attribute__((target("avx2"))) inline __m256i load2_low(const uint8_t* p0, const uint8_t* p1) {
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p0))),
                                 _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p1)), 1);
}

__attribute__((target("avx2"))) void horizontal_avx2(const PixelRegion& src, const AxisFilter& fx, int y_begin,
                                                     int y_end, uint8_t* dst) {
  const int n = fx.out_n, taps = fx.taps;
  const __m256i zero = _mm256_setzero_si256();
  int y = y_begin;
  for (; y + 1 < y_end; y += 2) {
    const uint8_t* row0 = source_row(src, y);
    const uint8_t* row1 = source_row(src, y + 1);
    uint8_t* d0 = dst + static_cast<size_t>(y - y_begin) * n * 4;
    uint8_t* d1 = d0 + static_cast<size_t>(n) * 4;
    for (int o = 0; o < n; ++o) {
      const ptrdiff_t at = static_cast<ptrdiff_t>(fx.first[static_cast<size_t>(o)]) * 4;
      const uint8_t* p0 = row0 + at;
      const uint8_t* p1 = row1 + at;
      const int16_t* k = fx.coeffs.data() + static_cast<size_t>(o) * taps;
      const int count = fx.count[static_cast<size_t>(o)];
      __m256i acc = _mm256_set1_epi32(kHalf);
      int t = 0;
      for (; t + 2 < count; t += 4) {
        const __m256i v = load2(p0 + t * 4, p1 + t * 4);
        const __m256i lo = _mm256_unpacklo_epi8(v, zero), hi = _mm256_unpackhi_epi8(v, zero);
        int32_t w01, w23;
        std::memcpy(&w01, k + t, 4);
        std::memcpy(&w23, k + t + 2, 4);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_unpacklo_epi16(lo, _mm256_srli_si256(lo, 8)),
                                                      _mm256_set1_epi32(w01)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_unpacklo_epi16(hi, _mm256_srli_si256(hi, 8)),
                                                      _mm256_set1_epi32(w23)));
      }
      if (t < count) {
        const __m256i px = _mm256_unpacklo_epi8(load2_low(p0 + t * 4, p1 + t * 4), zero);
        int32_t w01;
        std::memcpy(&w01, k + t, 4);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_unpacklo_epi16(px, _mm256_srli_si256(px, 8)),
                                                      _mm256_set1_epi32(w01)));
      }
      acc = _mm256_srai_epi32(acc, kPrecision);
      const __m256i packed = _mm256_packus_epi16(_mm256_packs_epi32(acc, acc), acc);
      const int32_t a = _mm256_extract_epi32(packed, 0), b = _mm256_extract_epi32(packed, 4);
      std::memcpy(d0 + o * 4, &a, 4);
      std::memcpy(d1 + o * 4, &b, 4);
    }
  }
  if (y < y_end) horizontal_sse2(src, fx, y, y_end, dst + static_cast<size_t>(y - y_begin) * n * 4);
}

// Vertical: 32 bytes a step (the SSE2 step's 16, twice); rows read in whole 32-byte vectors.
__attribute__((target("avx2"))) void vertical_row_avx2(const uint8_t* first, ptrdiff_t stride, const int16_t* k,
                                                       int count, size_t bytes, uint8_t* out) {
  const __m256i zero = _mm256_setzero_si256();
  for (size_t i = 0; i < bytes; i += 32) {
    __m256i s0 = _mm256_set1_epi32(kHalf), s1 = s0, s2 = s0, s3 = s0;
    for (int t = 0; t < count; t += 2) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + t * stride + i));
      const bool pair = t + 1 < count;
      const __m256i b =
          pair ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(first + (t + 1) * stride + i)) : zero;
      int32_t two;
      std::memcpy(&two, k + t, 4);
      const __m256i w = _mm256_set1_epi32(two);
      const __m256i lo = _mm256_unpacklo_epi8(a, b), hi = _mm256_unpackhi_epi8(a, b);
      s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), w));
      s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), w));
      s2 = _mm256_add_epi32(s2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), w));
      s3 = _mm256_add_epi32(s3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), w));
    }
    s0 = _mm256_srai_epi32(s0, kPrecision);
    s1 = _mm256_srai_epi32(s1, kPrecision);
    s2 = _mm256_srai_epi32(s2, kPrecision);
    s3 = _mm256_srai_epi32(s3, kPrecision);
    // Per lane, as SSE2: bytes [0, 16) of the step from lane 0's sums, [16, 32) from lane 1's.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i),
                        _mm256_packus_epi16(_mm256_packs_epi32(s0, s1), _mm256_packs_epi32(s2, s3)));
  }
}
#endif

std::atomic<int> g_simd_limit{static_cast<int>(ResampleSimd::kAvx2)};

ResampleSimd active_simd() {
  const int limit = g_simd_limit.load(std::memory_order_relaxed);
#if defined(__x86_64__)
  if (limit >= static_cast<int>(ResampleSimd::kAvx2) && cpu_has_avx2()) return ResampleSimd::kAvx2;
#endif
#if defined(__SSE2__)
  if (limit >= static_cast<int>(ResampleSimd::kSse2)) return ResampleSimd::kSse2;
#endif
  return ResampleSimd::kScalar;
}

void horizontal(ResampleSimd simd, const PixelRegion& src, const AxisFilter& fx, int y_begin, int y_end,
                uint8_t* dst) {
#if defined(__x86_64__)
  if (simd == ResampleSimd::kAvx2) return horizontal_avx2(src, fx, y_begin, y_end, dst);
#endif
#if defined(__SSE2__)
  if (simd == ResampleSimd::kSse2) return horizontal_sse2(src, fx, y_begin, y_end, dst);
#endif
  horizontal_scalar(src, fx, y_begin, y_end, dst);
}

void vertical_row(ResampleSimd simd, const uint8_t* first, ptrdiff_t stride, const int16_t* k, int count,
                  size_t bytes, uint8_t* out) {
#if defined(__x86_64__)
  if (simd == ResampleSimd::kAvx2) return vertical_row_avx2(first, stride, k, count, bytes, out);
#endif
#if defined(__SSE2__)
  if (simd == ResampleSimd::kSse2) return vertical_row_sse2(first, stride, k, count, bytes, out);
#endif
  vertical_row_scalar(first, stride, k, count, bytes, out);
}

// Writes one finished RGBX row of `n` pixels into row `y` of the output: RGB, flipped and in the
// output's layout. HWC rows are written front to back 4 bytes a pixel, each store's fourth byte
// overwritten by the next pixel (the last pixel is stored as 3 bytes).
void write_row(const OutputWindow& out, int y, int n, const uint8_t* rgbx) {
  const size_t plane = static_cast<size_t>(out.height) * out.width;
  // The output columns the window fills, left to right, and the row pixel for the first of them.
  const int left = out.flip ? out.width - out.x0 - n : out.x0;
  const int step = out.flip ? -1 : 1;
  const uint8_t* from = out.flip ? rgbx + static_cast<size_t>(n - 1) * 4 : rgbx;
  if (out.layout == Layout::kHWC) {
    uint8_t* d = out.data + (static_cast<size_t>(y) * out.width + left) * 3;
    for (int k = 0; k + 1 < n; ++k, d += 3, from += 4 * step) std::memcpy(d, from, 4);
    std::memcpy(d, from, 3);
    return;
  }
  for (int c = 0; c < 3; ++c) {
    uint8_t* d = out.data + c * plane + static_cast<size_t>(y) * out.width + left;
    const uint8_t* f = from + c;
    for (int k = 0; k < n; ++k, f += 4 * step) d[k] = *f;
  }
}

// Whether the vertical pass should run first: it then filters every source column of the output
// rows, and the horizontal pass (several times dearer per pixel) only the output rows, instead
// of every source row. Either order gives the same image up to the 8-bit rounding between passes.
bool vertical_first(const AxisFilter& fx, const AxisFilter& fy) {
  const double h_pixel = 2.0 + 1.5 * fx.taps, v_pixel = 0.5 * fy.taps;  // rough costs per pixel
  const double rows_in = fy.src_end - fy.src_begin, columns_in = fx.src_end - fx.src_begin;
  const double h_first = rows_in * fx.out_n * h_pixel + static_cast<double>(fy.out_n) * fx.out_n * v_pixel;
  const double v_first = fy.out_n * columns_in * v_pixel + static_cast<double>(fy.out_n) * fx.out_n * h_pixel;
  return v_first < h_first;
}

}  // namespace

void make_axis_filter(const AxisPlan& a, double s, int scaled_n, AxisFilter* f) {
  const int out_n = a.out1 - a.out0;
  const int clip0 = static_cast<int>(std::floor(a.clip0 * s));
  const int clip1 = std::min(scaled_n, static_cast<int>(std::ceil(a.clip1 * s)));
  if (out_n <= 0 || clip1 <= clip0) throw std::invalid_argument("resize: empty source or output interval");
  const int n = clip1 - clip0;
  const double origin = a.origin * s - clip0;  // 0 for a crop box at s = 1, exactly
  const double scale = a.scale * s;
  const double widen = std::max(scale, 1.0);
  const double support = widen;  // the triangle reaches 1 source pixel, widened by the downscale
  const double inverse = 1.0 / widen;
  f->out_n = out_n;
  f->taps = static_cast<int>(std::ceil(support)) * 2 + 2;  // even: weights are read in pairs
  f->first.assign(static_cast<size_t>(out_n), 0);
  f->count.assign(static_cast<size_t>(out_n), 0);
  f->coeffs.assign(static_cast<size_t>(out_n) * f->taps, 0);
  f->src_begin = clip1;
  f->src_end = clip0;
  std::vector<double> weights(static_cast<size_t>(f->taps));
  for (int o = 0; o < out_n; ++o) {
    const double center = origin + (static_cast<double>(a.out0 + o + a.shift) + 0.5) * scale;
    // C's truncation, as PIL's (int) casts: below 0 it rounds up, and 0 is the floor anyway.
    int lo = static_cast<int>(center - support + 0.5);
    int hi = static_cast<int>(center + support + 0.5);
    lo = std::max(lo, 0);
    hi = std::min(hi, n);
    if (hi <= lo) {  // the filter cut away entirely (a box at the clip's very edge): nearest pixel
      lo = std::min(std::max(static_cast<int>(std::floor(center)), 0), n - 1);
      hi = lo + 1;
    }
    const int count = std::min(hi - lo, f->taps);
    double sum = 0;
    for (int k = 0; k < count; ++k) {
      weights[static_cast<size_t>(k)] = triangle((k + lo - center + 0.5) * inverse);
      sum += weights[static_cast<size_t>(k)];
    }
    // Zero weights at either end are dropped: fewer taps, the same sums.
    int first = 0, last = count;
    while (first < last && weights[static_cast<size_t>(first)] == 0) ++first;
    while (last > first && weights[static_cast<size_t>(last - 1)] == 0) --last;
    if (first == last) first = 0, last = 1, weights[0] = sum = 1;
    int16_t* c = f->coeffs.data() + static_cast<size_t>(o) * f->taps;
    for (int k = first; k < last; ++k)
      c[k - first] = static_cast<int16_t>(std::floor(weights[static_cast<size_t>(k)] / sum * (1 << kPrecision) + 0.5));
    f->first[static_cast<size_t>(o)] = clip0 + lo + first;
    f->count[static_cast<size_t>(o)] = last - first;
    f->src_begin = std::min(f->src_begin, clip0 + lo + first);
    f->src_end = std::max(f->src_end, clip0 + lo + last);
  }
  f->identity = true;  // every output pixel one source pixel, weight 1
  for (int o = 0; o < out_n && f->identity; ++o)
    f->identity = f->count[static_cast<size_t>(o)] == 1 && f->first[static_cast<size_t>(o)] == f->src_begin + o &&
                  f->coeffs[static_cast<size_t>(o) * f->taps] == (1 << kPrecision);
}

void resample(const PixelRegion& src, const AxisFilter& fx, const AxisFilter& fy, ResampleScratch& scratch,
              const OutputWindow& out) {
  if (fx.src_begin < src.x0 || fx.src_end > src.x0 + src.width || fy.src_begin < src.y0 ||
      fy.src_end > src.y0 + src.height)
    throw std::logic_error("resize: the decoded region does not hold the pixels the filter reads");
  const int n = fx.out_n;
  const size_t row_bytes = static_cast<size_t>(n) * 4;
  const ResampleSimd simd = active_simd();
  scratch.line.resize(row_bytes + kRegionSlack);
  if (fx.identity || fy.identity || !vertical_first(fx, fy)) {
    // Horizontal pass first, over the rows the vertical pass reads.
    const uint8_t* rows;
    ptrdiff_t row_stride;
    if (fx.identity) {
      rows = src.data + (fy.src_begin - src.y0) * src.stride + static_cast<ptrdiff_t>(fx.src_begin - src.x0) * 4;
      row_stride = src.stride;
    } else {
      scratch.rows.resize(row_bytes * static_cast<size_t>(fy.src_end - fy.src_begin) + kRegionSlack);
      horizontal(simd, src, fx, fy.src_begin, fy.src_end, scratch.rows.data());
      rows = scratch.rows.data();
      row_stride = static_cast<ptrdiff_t>(row_bytes);
    }
    for (int o = 0; o < fy.out_n; ++o) {
      const uint8_t* line = rows + o * row_stride;
      if (!fy.identity) {
        const int16_t* k = fy.coeffs.data() + static_cast<size_t>(o) * fy.taps;
        const uint8_t* first = rows + (fy.first[static_cast<size_t>(o)] - fy.src_begin) * row_stride;
        vertical_row(simd, first, row_stride, k, fy.count[static_cast<size_t>(o)], row_bytes, scratch.line.data());
        line = scratch.line.data();
      }
      write_row(out, out.y0 + o, n, line);
    }
    return;
  }
  // Vertical pass first (fewer rows for the costlier horizontal pass): the columns the
  // horizontal pass reads, two output rows at a time (the AVX2 horizontal pass filters two rows
  // at once).
  const int columns = fx.src_end - fx.src_begin;
  const size_t column_bytes = static_cast<size_t>(columns) * 4;
  scratch.rows.resize(2 * column_bytes + kRegionSlack);
  scratch.line.resize(2 * row_bytes + kRegionSlack);
  PixelRegion two;
  two.data = scratch.rows.data();
  two.stride = static_cast<ptrdiff_t>(column_bytes);
  two.x0 = fx.src_begin;
  two.width = columns;
  const uint8_t* base = src.data + static_cast<ptrdiff_t>(fx.src_begin - src.x0) * 4;
  for (int o = 0; o < fy.out_n; o += 2) {
    const int rows = std::min(2, fy.out_n - o);
    for (int r = 0; r < rows; ++r) {  // row 0's whole-vector tail lands in row 1's bytes before row 1 is written
      const int16_t* k = fy.coeffs.data() + static_cast<size_t>(o + r) * fy.taps;
      const uint8_t* first = base + (fy.first[static_cast<size_t>(o + r)] - src.y0) * src.stride;
      vertical_row(simd, first, src.stride, k, fy.count[static_cast<size_t>(o + r)], column_bytes,
                   scratch.rows.data() + static_cast<size_t>(r) * column_bytes);
    }
    two.y0 = o;
    two.height = rows;
    horizontal(simd, two, fx, o, o + rows, scratch.line.data());
    for (int r = 0; r < rows; ++r) write_row(out, out.y0 + o + r, n, scratch.line.data() + static_cast<size_t>(r) * row_bytes);
  }
}

ResampleSimd set_resample_simd(ResampleSimd limit) {
  return static_cast<ResampleSimd>(g_simd_limit.exchange(static_cast<int>(limit)));
}

ResampleSimd resample_simd() { return active_simd(); }

}  // namespace fastload::image
