// Keyed Feistel permutation with cycle-walking; see permutation.h.
#include "core/permutation.h"

namespace fastload {

namespace {
int ceil_log2(uint64_t n) {
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  return bits;
}
}  // namespace

Permutation::Permutation(uint64_t n, uint64_t seed, uint64_t stream) : n_(n) {
  const int bits = ceil_log2(n);
  // Left half gets the extra bit when bits is odd; either split is a bijection.
  right_bits_ = bits / 2;
  const int left_bits = bits - right_bits_;
  right_mask_ = right_bits_ ? ((uint64_t{1} << right_bits_) - 1) : 0;
  left_mask_ = left_bits >= 64 ? ~uint64_t{0} : ((uint64_t{1} << left_bits) - 1);
  uint64_t k = mix64(seed ^ 0x6a09e667f3bcc909ULL) ^ mix64(stream + 0x3c6ef372fe94f82bULL);
  for (int r = 0; r < kRounds; ++r) {
    k = mix64(k + 0x9e3779b97f4a7c15ULL);
    keys_[r] = k;
  }
}

// Each round xors one half with a keyed hash of the other, so each round is its own inverse.
uint64_t Permutation::forward(uint64_t x) const {
  uint64_t left = x >> right_bits_, right = x & right_mask_;
  for (int r = 0; r < kRounds; ++r) {
    if (r & 1)
      right ^= mix64(left ^ keys_[r]) & right_mask_;
    else
      left ^= mix64(right ^ keys_[r]) & left_mask_;
  }
  return (left << right_bits_) | right;
}

uint64_t Permutation::backward(uint64_t x) const {
  uint64_t left = x >> right_bits_, right = x & right_mask_;
  for (int r = kRounds - 1; r >= 0; --r) {
    if (r & 1)
      right ^= mix64(left ^ keys_[r]) & right_mask_;
    else
      left ^= mix64(right ^ keys_[r]) & left_mask_;
  }
  return (left << right_bits_) | right;
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
  // First pass has no data-dependent branch so the compiler can keep it tight; the few values
  // that fell outside [0, n) are walked afterwards.
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int64_t>(forward(first + i));
  for (int64_t i = 0; i < count; ++i) {
    uint64_t x = static_cast<uint64_t>(out[i]);
    while (x >= n_) x = forward(x);
    out[i] = static_cast<int64_t>(x);
  }
}

}  // namespace fastload
