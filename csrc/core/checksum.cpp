// Checksum64; see checksum.h.
#include "core/checksum.h"

#include <cstring>

#include "core/bit_mix.h"

namespace fastload {

namespace {
constexpr uint64_t kMul1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kMul2 = 0xC2B2AE3D27D4EB4FULL;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64): the digest is of LE words
  return v;
}
inline uint64_t mix(uint64_t acc, uint64_t word) { return rotl(acc + word * kMul2, 31) * kMul1; }
inline uint64_t finish(uint64_t h) {  // every input bit reaches every output bit (murmur3's fmix64)
  return xorshift_multiply<uint64_t, 33, 0xFF51AFD7ED558CCDULL, 33, 0xC4CEB9FE1A85EC53ULL, 33>(h);
}
}  // namespace

Checksum64::Checksum64() : lanes_{kMul1 + kMul2, kMul2, 0, 0 - kMul1} {}

void Checksum64::stripe(const unsigned char* p) {
  lanes_[0] = mix(lanes_[0], load64(p));
  lanes_[1] = mix(lanes_[1], load64(p + 8));
  lanes_[2] = mix(lanes_[2], load64(p + 16));
  lanes_[3] = mix(lanes_[3], load64(p + 24));
}

void Checksum64::update(const void* data, size_t bytes) {
  const unsigned char* p = static_cast<const unsigned char*>(data);
  length_ += bytes;
  if (tail_bytes_) {
    const size_t take = bytes < 32 - tail_bytes_ ? bytes : 32 - tail_bytes_;
    std::memcpy(tail_ + tail_bytes_, p, take);
    tail_bytes_ += take;
    p += take;
    bytes -= take;
    if (tail_bytes_ < 32) return;
    stripe(tail_);
    tail_bytes_ = 0;
  }
  for (; bytes >= 32; p += 32, bytes -= 32) stripe(p);
  std::memcpy(tail_, p, bytes);
  tail_bytes_ = bytes;
}

uint64_t Checksum64::digest() const {
  uint64_t h = rotl(lanes_[0], 1) + rotl(lanes_[1], 7) + rotl(lanes_[2], 12) + rotl(lanes_[3], 18);
  h = mix(h, length_);
  unsigned char last[32] = {};
  std::memcpy(last, tail_, tail_bytes_);
  for (size_t i = 0; i < tail_bytes_; i += 8) h = mix(h, load64(last + i));
  return finish(h);
}

}  // namespace fastload
