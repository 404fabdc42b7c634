// Integer finalisers: every input bit reaches every output bit. The permutation's round function
// and key schedule (permutation.h) and the checksum's digest (checksum.cpp) are each this one
// xor-shift-multiply chain with their own shifts and multipliers.
#pragma once
#include <cstdint>

namespace fastload {

// x ^= x >> S1; x *= M1; x ^= x >> S2; x *= M2; x ^= x >> S3.
template <typename T, int S1, T M1, int S2, T M2, int S3>
constexpr T xorshift_multiply(T x) {
  x ^= x >> S1;
  x *= M1;
  x ^= x >> S2;
  x *= M2;
  x ^= x >> S3;
  return x;
}

// A 32-bit integer hash with low bias (two multiplies); the Feistel round function.
inline uint32_t mix32(uint32_t x) { return xorshift_multiply<uint32_t, 16, 0x7feb352dU, 15, 0x846ca68bU, 16>(x); }

// splitmix64 finaliser: the mixing function used for keys and rounds.
inline uint64_t mix64(uint64_t x) {
  return xorshift_multiply<uint64_t, 30, 0xbf58476d1ce4e5b9ULL, 27, 0x94d049bb133111ebULL, 31>(x);
}

}  // namespace fastload
