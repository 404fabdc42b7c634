// Keyed Feistel permutation with cycle-walking; see permutation.h.
#include "core/permutation.h"

#include "core/cpu_cache.h"

namespace fastload {

namespace {
int ceil_log2(uint64_t n) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  return bits;
}

uint32_t low_mask(int bits) { return bits >= 32 ? ~uint32_t{0} : ((uint32_t{1} << bits) - 1); }

// The batch loops have no data-dependent branch, so they vectorise. Each body is compiled twice,
// for AVX2 (8 lanes of 32-bit multiplies) and for the baseline, and chosen at run time
// (cpu_has_avx2, cpu_cache.h).
//
// Each round xors one half with a keyed hash of the other, so each round is its own inverse and
// the network is a bijection for any split of the bits.
struct Network {
  int right_bits;
  uint32_t left_mask, right_mask;
  uint32_t k[Permutation::kRounds];
};

// Even rounds change the left half, odd rounds the right. Forward runs the rounds in order,
// backward in reverse; the loop is unrolled, so each round's half and key are compile-time choices.
template <bool kBackward>
__attribute__((always_inline)) inline uint64_t network(const Network& f, uint64_t x) {
  uint32_t left = static_cast<uint32_t>(x >> f.right_bits);
  uint32_t right = static_cast<uint32_t>(x) & f.right_mask;
#pragma GCC unroll 6  // Permutation::kRounds (a pragma takes no named constant)
  for (int i = 0; i < Permutation::kRounds; ++i) {
    const int r = kBackward ? Permutation::kRounds - 1 - i : i;
    if (r % 2 == 0)
      left ^= mix32(right ^ f.k[r]) & f.left_mask;
    else
      right ^= mix32(left ^ f.k[r]) & f.right_mask;
  }
  return (static_cast<uint64_t>(left) << f.right_bits) | right;
}

__attribute__((always_inline)) inline uint64_t network_forward(const Network& f, uint64_t x) {
  return network<false>(f, x);
}
inline uint64_t network_backward(const Network& f, uint64_t x) { return network<true>(f, x); }

// Positions first, first + step, first + 2*step, ...: a rank's share of a step-based stream
// (every world_size-th position) takes the same vector loop as a contiguous range.
struct Contiguous {
  uint64_t at(uint64_t first, int64_t i) const { return first + static_cast<uint64_t>(i); }
};
struct Strided {
  uint64_t step;
  uint64_t at(uint64_t first, int64_t i) const { return first + static_cast<uint64_t>(i) * step; }
};

// out[i] = forward(position i of the range from first)
template <typename Range>
__attribute__((always_inline)) inline void forward_range_body(const Network f, Range range, uint64_t first,
                                                              int64_t count, int64_t* __restrict out) {
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(network_forward(f, range.at(first, i)));
}

// values[i] = forward(values[i])
__attribute__((always_inline)) inline void forward_values_body(const Network f, int64_t count,
                                                               uint64_t* __restrict values) {
  for (int64_t i = 0; i < count; ++i) values[i] = network_forward(f, values[i]);
}

// Values per vector pass (8 lanes of 32 bits with AVX2). Counts are rounded up to whole passes:
// the vector loop's scalar tail costs several times a pass (a mixture's short runs of rows and
// every cycle-walking pass end in one), and the extra lanes are computed on values nobody reads.
constexpr int64_t kLanes = 8;
constexpr int64_t kChunk = 256;  // a multiple of kLanes

inline int64_t whole_passes(int64_t count) { return (count + kLanes - 1) / kLanes * kLanes; }

// out[i] = P[first + i] for i < count: the network over the range, then cycle-walking of the
// values outside [0, n). One body per instruction set, so that the key broadcasts happen once
// per call rather than once per pass.
template <typename Range>
__attribute__((always_inline)) inline void fill_body(const Network f, Range range, uint64_t n, uint64_t first,
                                                     int64_t count, int64_t* __restrict out) {
  uint64_t values[kChunk];
  int64_t where[kChunk];
  for (int64_t begin = 0; begin < count; begin += kChunk) {
    const int64_t len = count - begin < kChunk ? count - begin : kChunk;
    int64_t* chunk = out + begin;
    const uint64_t at = range.at(first, begin);
    const int64_t whole = len / kLanes * kLanes;
    forward_range_body(f, range, at, whole, chunk);
    if (whole < len) {  // the last, partial pass into a scratch vector
      int64_t tail[kLanes];
      forward_range_body(f, range, range.at(at, whole), kLanes, tail);
      for (int64_t i = whole; i < len; ++i) chunk[i] = tail[i - whole];
    }
    // 2^bits < 2n, so fewer than half the values land outside [0, n). Those are walked in
    // vectorised passes over a compacted list, each pass leaving fewer than half behind again,
    // until one vector holds the rest.
    // Branch-free compaction: whether a value is outside [0, n) is a coin flip for the branch
    // predictor. A value still outside is written back too, and overwritten once it lands.
    int64_t pending = 0;
    for (int64_t i = 0; i < len; ++i) {
      values[pending] = static_cast<uint64_t>(chunk[i]);
      where[pending] = i;
      pending += static_cast<uint64_t>(chunk[i]) >= n;
    }
    while (pending > kLanes) {
      const int64_t padded = whole_passes(pending);  // <= kChunk
      for (int64_t j = pending; j < padded; ++j) values[j] = 0;
      forward_values_body(f, padded, values);
      int64_t still = 0;
      for (int64_t j = 0; j < pending; ++j) {
        chunk[where[j]] = static_cast<int64_t>(values[j]);
        values[still] = values[j];
        where[still] = where[j];
        still += values[j] >= n;
      }
      pending = still;
    }
    if (pending > 0) {
      // The last few values walk together in one vector, each lane stepping until it lands: no
      // compaction and no loop of variable length per step (a mixture's short runs end here).
      uint64_t v[kLanes];
      for (int64_t j = 0; j < kLanes; ++j) v[j] = j < pending ? values[j] : 0;  // 0 < n: landed
      for (;;) {
        uint64_t outside = 0;
        for (int64_t j = 0; j < kLanes; ++j) {
          const uint64_t w = network_forward(f, v[j]);
          v[j] = v[j] >= n ? w : v[j];
          outside |= v[j] >= n;
        }
        if (!outside) break;
      }
      for (int64_t j = 0; j < pending; ++j) chunk[where[j]] = static_cast<int64_t>(v[j]);
    }
  }
}

#if defined(__x86_64__)
template <typename Range>
__attribute__((target("avx2"))) void fill_avx2(const Network& f, Range range, uint64_t n, uint64_t first,
                                               int64_t count, int64_t* out) {
  fill_body(f, range, n, first, count, out);
}
#endif

template <typename Range>
void fill_any(const Network& f, Range range, uint64_t n, uint64_t first, int64_t count, int64_t* out) {
#if defined(__x86_64__)
  if (cpu_has_avx2()) return fill_avx2(f, range, n, first, count, out);
#endif
  fill_body(f, range, n, first, count, out);
}
}  // namespace

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t stream) : n_(n) {
  const int bits = ceil_log2(n);
  right_bits_ = bits / 2;  // the left half takes the extra bit when bits is odd
  right_mask_ = low_mask(right_bits_);
  left_mask_ = low_mask(bits - right_bits_);
  uint64_t k = mix64(seed ^ 0x6a09e667f3bcc909ULL) ^ mix64(stream + 0x3c6ef372fe94f82bULL);
  for (int r = 0; r < kRounds; ++r) {
    k = mix64(k + 0x9e3779b97f4a7c15ULL);
    keys_[r] = static_cast<uint32_t>(k >> 32);
  }
}

namespace {
static_assert(Permutation::kRounds == 6, "network() unrolls six rounds, network_of() copies six keys");
Network network_of(int right_bits, uint32_t left_mask, uint32_t right_mask, const uint32_t* k) {
  return {right_bits, left_mask, right_mask, {k[0], k[1], k[2], k[3], k[4], k[5]}};
}
}  // namespace

uint64_t Permutation::forward(uint64_t x) const {
  return network_forward(network_of(right_bits_, left_mask_, right_mask_, keys_), x);
}

uint64_t Permutation::backward(uint64_t x) const {
  return network_backward(network_of(right_bits_, left_mask_, right_mask_, keys_), x);
}

uint64_t Permutation::operator()(uint64_t position) const {
  uint64_t x = forward(position);
  while (x >= n_) x = forward(x);
  return x;
}

uint64_t Permutation::inverse(uint64_t value) const {
  uint64_t x = backward(value);
  while (x >= n_) x = backward(x);
  return x;
}

void Permutation::fill(uint64_t first, int64_t count, int64_t* out) const {
  fill_any(network_of(right_bits_, left_mask_, right_mask_, keys_), Contiguous{}, n_, first, count, out);
}

void Permutation::fill_strided(uint64_t first, uint64_t step, int64_t count, int64_t* out) const {
  fill_any(network_of(right_bits_, left_mask_, right_mask_, keys_), Strided{step}, n_, first, count, out);
}

}  // namespace fastload
