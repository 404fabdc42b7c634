// numpy's SeedSequence (its entropy pool of four 32-bit words, mixed by its hash) and PCG64
// (numpy's seeding: generate_state(4, uint64) as the 128-bit state and increment); see
// sample_rng.h. tests/test_images_crop.py checks every word against numpy itself.
#include "image/sample_rng.h"

#include <cstddef>

namespace fastload::image {

namespace {

constexpr uint32_t kInitA = 0x43b0d7e5, kMultA = 0x931e8875, kInitB = 0x8b51f9dd, kMultB = 0x58f38ded;
constexpr uint32_t kMixMultL = 0xca01f9dd, kMixMultR = 0x4973f715;
constexpr int kXShift = 16;  // half of 32 bits
constexpr size_t kPool = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> kXShift;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  r ^= r >> kXShift;
  return r;
}

// A non-negative integer as SeedSequence reads it: its 32-bit words, least significant first
// (zero is one word).
size_t words_of(uint64_t v, uint32_t* out) {
  size_t n = 0;
  do {
    out[n++] = static_cast<uint32_t>(v);
    v >>= 32;
  } while (v != 0);
  return n;
}

}  // namespace

SampleRng::SampleRng(uint64_t seed, int64_t epoch, int64_t sample) {
  uint32_t entropy[8];
  size_t n = 0;
  n += words_of(seed, entropy + n);
  n += words_of(static_cast<uint64_t>(epoch), entropy + n);
  n += words_of(static_cast<uint64_t>(sample), entropy + n);
  n += words_of(0x5EED, entropy + n);

  uint32_t pool[kPool];
  uint32_t hash_const = kInitA;
  for (size_t i = 0; i < kPool; ++i) pool[i] = hashmix(i < n ? entropy[i] : 0, hash_const);
  for (size_t src = 0; src < kPool; ++src)
    for (size_t dst = 0; dst < kPool; ++dst)
      if (src != dst) pool[dst] = mix(pool[dst], hashmix(pool[src], hash_const));
  for (size_t src = kPool; src < n; ++src)
    for (size_t dst = 0; dst < kPool; ++dst) pool[dst] = mix(pool[dst], hashmix(entropy[src], hash_const));

  // generate_state(4, uint64): eight words cycled from the pool, paired little-endian.
  uint32_t words[8];
  uint32_t hc = kInitB;
  for (size_t i = 0; i < 8; ++i) {
    uint32_t v = pool[i % kPool];
    v ^= hc;
    hc *= kMultB;
    v *= hc;
    v ^= v >> kXShift;
    words[i] = v;
  }
  uint64_t val[4];
  for (size_t i = 0; i < 4; ++i) val[i] = static_cast<uint64_t>(words[2 * i]) | static_cast<uint64_t>(words[2 * i + 1]) << 32;

  // pcg64_set_seed: state = val[0]:val[1] (high:low), sequence = val[2]:val[3]; PCG's srandom.
  const unsigned __int128 init_state = static_cast<unsigned __int128>(val[0]) << 64 | val[1];
  const unsigned __int128 init_seq = static_cast<unsigned __int128>(val[2]) << 64 | val[3];
  state_ = 0;
  inc_ = init_seq << 1 | 1;
  next64();
  state_ += init_state;
  next64();
}

uint64_t SampleRng::next64() {
  constexpr unsigned __int128 kMultiplier =
      static_cast<unsigned __int128>(2549297995355413924ULL) << 64 | 4865540595714422341ULL;
  state_ = state_ * kMultiplier + inc_;
  const uint64_t xored = static_cast<uint64_t>(state_ >> 64) ^ static_cast<uint64_t>(state_);
  const unsigned rot = static_cast<unsigned>(state_ >> 122);
  return (xored >> rot) | (xored << ((64 - rot) & 63));
}

double SampleRng::uniform() { return static_cast<double>(next64() >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace fastload::image
