// The antialiased resize: a separable triangle (bilinear) filter widened by the downscale
// factor, the filter PIL's Image.resize(BILINEAR) applies and torchvision's Resize(antialias=True)
// reproduces; horizontal pass into 8-bit rows, then vertical pass, then the flip and the layout
// (HWC or CHW) on the way into the batch slot. Pixels are 4 bytes (RGBX) until that last step,
// so that both passes run on whole SSE2 / AVX2 vectors; weights are 14-bit fixed point (16-bit lanes),
// so a pixel may differ from PIL's 22-bit result by 1.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "image/crop.h"
#include "image/image_spec.h"

namespace fastload::image {

// Bytes a decoded region must hold past its last pixel: the vertical pass reads rows in whole
// 16- or 32-byte vectors, the horizontal pass a few pixels past a filter's last weight.
inline constexpr size_t kRegionSlack = 64;

// One axis: output pixel o reads source pixels [first[o], first[o] + count[o]) with weights
// coeffs[o * taps + k].
struct AxisFilter {
  int out_n = 0;
  int taps = 0;
  std::vector<int32_t> first, count;
  std::vector<int16_t> coeffs;
  int src_begin = 0, src_end = 0;  // the source pixels any output reads
  bool identity = false;           // output o is source pixel src_begin + o, unchanged
};

// The filter of one axis of a crop plan for the image scaled by `s` (DCT scaling; `scaled_n`
// pixels along the axis): window pixels [a.out0, a.out1), reading only the clip (scaled), the
// weights renormalised where the filter is cut. The coordinates are PIL's (relative to the clip,
// as PIL's are relative to its cropped image), operation for operation.
void make_axis_filter(const AxisPlan& a, double s, int scaled_n, AxisFilter* f);

// RGBX pixels [x0, x0 + width) x [y0, y0 + height) of a (possibly DCT-scaled) image, 4 bytes a
// pixel, with kRegionSlack readable bytes after the last row.
struct PixelRegion {
  const uint8_t* data = nullptr;
  ptrdiff_t stride = 0;  // bytes between rows
  int x0 = 0, y0 = 0, width = 0, height = 0;
};

// Where the resized window goes: rows [y0, y0 + fy.out_n) and columns [x0, x0 + fx.out_n) of a
// height x width x 3 output (column c lands at width - 1 - c when flipped).
struct OutputWindow {
  uint8_t* data = nullptr;
  int height = 0, width = 0;
  Layout layout = Layout::kHWC;
  int x0 = 0, y0 = 0;
  bool flip = false;
};

// Scratch memory reused from image to image.
struct ResampleScratch {
  std::vector<uint8_t> rows;  // the horizontal pass's output
  std::vector<uint8_t> line;  // one output row, RGBX
};

// Which vector instructions the passes use: the best the CPU has, up to a limit (tests compare
// them: every form gives the same bytes).
enum class ResampleSimd : int { kScalar = 0, kSse2 = 1, kAvx2 = 2 };
// Test instrument: caps the form used from now on (kAvx2: the best available); returns the old cap.
ResampleSimd set_resample_simd(ResampleSimd limit);
ResampleSimd resample_simd();  // the form in use

// `src` must hold every pixel the filters read.
void resample(const PixelRegion& src, const AxisFilter& fx, const AxisFilter& fy, ResampleScratch& scratch,
              const OutputWindow& out);

}  // namespace fastload::image
