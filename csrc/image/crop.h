// Where in the image the output comes from: the crop rules of fl.Image (torchvision's
// RandomResizedCrop, its evaluation Resize + CenterCrop, the whole image), drawn from the
// sample's stream (sample_rng.h), in the image's own pixel coordinates.
#pragma once
#include "image/image_spec.h"
#include "image/sample_rng.h"

namespace fastload::image {

// One axis of a plan: output pixel k in [out0, out1) is the filter centred at source coordinate
// origin + (k + shift + 0.5) * scale, reading only source pixels [clip0, clip1). Output pixels
// outside [out0, out1) are zero (a center crop larger than the resized image is padded, as
// torchvision's CenterCrop pads). Kept in this form (not as a fractional box) so that the
// filter's arithmetic is PIL's own, operation for operation.
struct AxisPlan {
  double origin = 0, scale = 1;
  int64_t shift = 0;
  int out0 = 0, out1 = 0;
  int clip0 = 0, clip1 = 0;
};

struct CropPlan {
  // Random crop: the crop box (origin = its corner, scale = box / output; the filter reads only
  // the box: torchvision crops, then resizes). Center crop: the whole image resized (origin 0,
  // scale = image / resized, shift = the crop's offset; the filter reads the whole image).
  AxisPlan x, y;
  bool flip = false;
  bool padded(const ImageSpec& spec) const;  // some of the output lies outside the window
};

// The draws, in order (a Python reference replays them with numpy's Generator.random()):
// random crop: up to 10 tries of (area share, log aspect), then, for the try that fits,
// (top, left); then, when spec.flip > 0, one draw for the flip (flipped when below spec.flip).
// Throws std::invalid_argument for crop="none" at the images' own size when this image differs.
CropPlan plan_crop(const ImageSpec& spec, int width, int height, SampleRng& rng);

// Python's round(): halves to even.
double round_half_even(double x);

}  // namespace fastload::image
