// Keyed Feistel permutation with cycle-walking; see permutation.h.
#include "core/permutation.h"

namespace fastload {

namespace {
int ceil_log2(uint64_t n) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  return bits;
}

uint32_t low_mask(int bits) { return bits >= 32 ? ~uint32_t{0} : ((uint32_t{1} << bits) - 1); }

// One network evaluation. Each round xors one half with a keyed hash of the other, so each
// round is its own inverse and the network is a bijection for any split of the bits. Free
// function over plain values so the batch loop below can be vectorised.
inline uint64_t feistel(uint64_t x, int right_bits, uint32_t left_mask, uint32_t right_mask,
                        const uint32_t* keys, int rounds, bool reverse) {
  uint32_t left = static_cast<uint32_t>(x >> right_bits);
  uint32_t right = static_cast<uint32_t>(x) & right_mask;
  for (int i = 0; i < rounds; ++i) {
    const int r = reverse ? rounds - 1 - i : i;
    if (r & 1)
      right ^= mix32(left ^ keys[r]) & right_mask;
    else
      left ^= mix32(right ^ keys[r]) & left_mask;
  }
  return (static_cast<uint64_t>(left) << right_bits) | right;
}

// The branch-free first pass over a batch of positions. The body is compiled twice, for AVX2
// (8 lanes of 32-bit multiplies) and for the baseline, and chosen at run time. An explicit check
// rather than target_clones: its ifunc resolver runs before sanitizer runtimes start and crashes
// instrumented builds.
__attribute__((always_inline)) inline void forward_batch_body(
    uint64_t first, int64_t count, int right_bits, uint32_t left_mask, uint32_t right_mask,
    const uint32_t* __restrict keys, int64_t* __restrict out) {
  const uint32_t k0 = keys[0], k1 = keys[1], k2 = keys[2], k3 = keys[3], k4 = keys[4],
                 k5 = keys[5];
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t x = first + static_cast<uint64_t>(i);
    uint32_t left = static_cast<uint32_t>(x >> right_bits);
    uint32_t right = static_cast<uint32_t>(x) & right_mask;
    left ^= mix32(right ^ k0) & left_mask;
    right ^= mix32(left ^ k1) & right_mask;
    left ^= mix32(right ^ k2) & left_mask;
    right ^= mix32(left ^ k3) & right_mask;
    left ^= mix32(right ^ k4) & left_mask;
    right ^= mix32(left ^ k5) & right_mask;
    out[i] = static_cast<int64_t>((static_cast<uint64_t>(left) << right_bits) | right);
  }
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) void forward_batch_avx2(uint64_t first, int64_t count,
                                                        int right_bits, uint32_t left_mask,
                                                        uint32_t right_mask, const uint32_t* keys,
                                                        int64_t* out) {
  forward_batch_body(first, count, right_bits, left_mask, right_mask, keys, out);
}
#endif

void forward_batch(uint64_t first, int64_t count, int right_bits, uint32_t left_mask,
                   uint32_t right_mask, const uint32_t* keys, int64_t* out) {
#if defined(__x86_64__)
  static const bool has_avx2 = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  if (has_avx2)
    return forward_batch_avx2(first, count, right_bits, left_mask, right_mask, keys, out);
#endif
  forward_batch_body(first, count, right_bits, left_mask, right_mask, keys, out);
}
static_assert(Permutation::kRounds == 6, "forward_batch unrolls six rounds");
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

uint64_t Permutation::forward(uint64_t x) const {
  return feistel(x, right_bits_, left_mask_, right_mask_, keys_, kRounds, false);
}

uint64_t Permutation::backward(uint64_t x) const {
  return feistel(x, right_bits_, left_mask_, right_mask_, keys_, kRounds, true);
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
  // 2^bits < 2n, so fewer than half the values need walking; walk them one by one afterwards.
  forward_batch(first, count, right_bits_, left_mask_, right_mask_, keys_, out);
  for (int64_t i = 0; i < count; ++i) {
    uint64_t x = static_cast<uint64_t>(out[i]);
    if (x < n_) continue;
    do x = forward(x); while (x >= n_);
    out[i] = static_cast<int64_t>(x);
  }
}

}  // namespace fastload
