// The resize's forms under AddressSanitizer + UBSan (built and run by tests/test_images_resample.py):
// decoded regions allocated to their exact size plus kRegionSlack, random crops of every kind,
// sizes and layouts, each resized by the scalar, SSE2 and AVX2 forms: no read or write outside
// the region or the output, and the same bytes from every form. Prints "N runs, 0 mismatches".
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>
#include "image/crop.h"
#include "image/resample.h"
using namespace fastload::image;
int main(int argc, char** argv) {
  int bad = 0, runs = 0;
  for (int trial = 0; trial < (argc > 1 ? std::atoi(argv[1]) : 3000); ++trial) {
    srand(trial);
    const int W = 1 + rand() % 2000, H = 1 + rand() % 600;
    ImageSpec spec;
    spec.height = 1 + rand() % 300;
    spec.width = 1 + rand() % 300;
    spec.crop = static_cast<CropMode>(rand() % 3);
    if (spec.crop == CropMode::kCenter) spec.resize = 1 + rand() % 400;
    spec.flip = 0.5;
    spec.layout = rand() % 2 ? Layout::kHWC : Layout::kCHW;
    SampleRng rng(1, trial, trial);
    CropPlan p = plan_crop(spec, W, H, rng);
    AxisFilter fx, fy;
    make_axis_filter(p.x, 1.0, W, &fx);
    make_axis_filter(p.y, 1.0, H, &fy);
    const int rw = fx.src_end - fx.src_begin, rh = fy.src_end - fy.src_begin;
    const size_t stride = static_cast<size_t>(rw) * 4;
    std::vector<uint8_t> outs[3];
    for (int form = 0; form < 3; ++form) {
      std::unique_ptr<uint8_t[]> region(new uint8_t[stride * rh + kRegionSlack]);  // exact: ASan sees past it
      for (size_t i = 0; i < stride * rh + kRegionSlack; ++i) region[i] = static_cast<uint8_t>((i * 7 + trial) & 255);
      PixelRegion r{region.get(), static_cast<ptrdiff_t>(stride), fx.src_begin, fy.src_begin, rw, rh};
      set_resample_simd(static_cast<ResampleSimd>(form));
      outs[form].assign(static_cast<size_t>(spec.out_bytes()), 0);
      std::unique_ptr<uint8_t[]> out(new uint8_t[spec.out_bytes()]);
      std::memset(out.get(), 0, spec.out_bytes());
      OutputWindow w{out.get(), spec.height, spec.width, spec.layout, p.x.out0, p.y.out0, p.flip};
      ResampleScratch scratch;
      resample(r, fx, fy, scratch, w);
      std::memcpy(outs[form].data(), out.get(), spec.out_bytes());
    }
    ++runs;
    if (outs[0] != outs[1] || outs[0] != outs[2]) { ++bad; std::printf("mismatch at trial %d\n", trial); }
  }
  std::printf("%d runs, %d mismatches\n", runs, bad);
  return bad != 0;
}
