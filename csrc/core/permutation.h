// A seeded pseudo-random permutation of [0, n), evaluated position by position in O(1) memory.
#pragma once
#include <cstdint>

#include "core/bit_mix.h"  // mix32, mix64

namespace fastload {

// A keyed bijection on [0, 2^bits) (an unbalanced, alternating Feistel network), restricted to
// [0, n) by cycle-walking: re-apply until the value lands inside. Because the walk starts inside
// [0, n) and the network is a bijection, the walk always ends and the restriction is a bijection.
// 2^bits < 2n, so a position costs fewer than two network evaluations on average.
class Permutation {
 public:
  Permutation() = default;
  Permutation(uint64_t n, uint64_t seed, uint64_t stream);

  uint64_t size() const { return n_; }
  uint64_t operator()(uint64_t position) const;       // P[position]; position < size()
  uint64_t inverse(uint64_t value) const;              // the position whose P is value
  // out[i] = P[first + i] for i < count: the batch-sized hot loop.
  void fill(uint64_t first, int64_t count, int64_t* out) const;
  // out[i] = P[first + i * step] for i < count (positions < size()).
  void fill_strided(uint64_t first, uint64_t step, int64_t count, int64_t* out) const;

  static constexpr int kRounds = 6;  // network() in permutation.cpp unrolls exactly these

 private:
  uint64_t forward(uint64_t x) const;
  uint64_t backward(uint64_t x) const;

  uint64_t n_ = 0;
  int right_bits_ = 0;
  // Halves are at most 32 bits for any 64-bit n, so rounds run on 32-bit lanes (SIMD-friendly).
  uint32_t left_mask_ = 0, right_mask_ = 0;
  uint32_t keys_[kRounds] = {};
};

}  // namespace fastload
