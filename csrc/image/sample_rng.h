// The per-sample random stream of the decode stage: numpy's SeedSequence([seed, epoch, sample,
// 0x5EED]) feeding a PCG64, the generator fl.sample_rng() returns, computed natively. A crop or
// flip drawn here is the one a Python reference draws with
// np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, sample, 0x5EED]))):
// a pure function of (seed, epoch, sample id), whatever thread draws it.
#pragma once
#include <cstdint>

namespace fastload::image {

class SampleRng {
 public:
  SampleRng(uint64_t seed, int64_t epoch, int64_t sample);
  uint64_t next64();  // PCG64 (XSL-RR 128/64), as numpy's PCG64.random_raw()
  double uniform();   // [0, 1) with 53 bits, as numpy's Generator.random()

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
};

}  // namespace fastload::image
