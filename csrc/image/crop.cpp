// The crop rules; see crop.h. The random crop is torchvision's RandomResizedCrop.get_params
// step by step (10 tries, then the central crop that fits `ratio`), with each uniform draw taken
// from SampleRng instead of torch's generator.
#include "image/crop.h"

#include "image/image_error.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace fastload::image {

double round_half_even(double x) { return std::nearbyint(x); }  // the default rounding mode: to even

bool CropPlan::padded(const ImageSpec& spec) const {
  return x.out0 > 0 || y.out0 > 0 || x.out1 < spec.width || y.out1 < spec.height;
}

namespace {

// An integer in [0, n) from one draw (torch.randint's range).
int draw_below(SampleRng& rng, int n) { return std::min(n - 1, static_cast<int>(rng.uniform() * n)); }

void random_box(const ImageSpec& spec, int width, int height, SampleRng& rng, int* i, int* j, int* h, int* w) {
  const double area = static_cast<double>(width) * height;
  const double log_min = std::log(spec.ratio_min), log_max = std::log(spec.ratio_max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * (spec.scale_min + (spec.scale_max - spec.scale_min) * rng.uniform());
    const double aspect = std::exp(log_min + (log_max - log_min) * rng.uniform());
    const double cw = round_half_even(std::sqrt(target_area * aspect));
    const double ch = round_half_even(std::sqrt(target_area / aspect));
    if (cw > 0 && cw <= width && ch > 0 && ch <= height) {
      *w = static_cast<int>(cw);
      *h = static_cast<int>(ch);
      *i = draw_below(rng, height - *h + 1);
      *j = draw_below(rng, width - *w + 1);
      return;
    }
  }
  // Fallback: the central crop, the whole image cut to the nearest allowed aspect ratio.
  const double in_ratio = static_cast<double>(width) / height;
  if (in_ratio < spec.ratio_min) {
    *w = width;
    *h = std::max(1, static_cast<int>(round_half_even(*w / spec.ratio_min)));  // 0 only for absurd ratios
  } else if (in_ratio > spec.ratio_max) {
    *h = height;
    *w = std::max(1, static_cast<int>(round_half_even(*h * spec.ratio_max)));
  } else {
    *w = width;
    *h = height;
  }
  *i = (height - *h) / 2;
  *j = (width - *w) / 2;
}

// One axis of Resize(resize) + CenterCrop(size): the image's `n` pixels resized to `resized`,
// `out` of them kept. Output pixel k is resized pixel k + shift: a crop inside the resized image
// is centred as torchvision's CenterCrop rounds it; a larger one is padded by
// floor((out - resized) / 2) before.
AxisPlan center_axis(int n, int64_t resized, int out) {
  AxisPlan a;
  a.shift = out <= resized ? static_cast<int64_t>(round_half_even((resized - out) / 2.0)) : -((out - resized) / 2);
  a.out0 = static_cast<int>(std::max<int64_t>(0, -a.shift));
  a.out1 = static_cast<int>(std::min<int64_t>(out, resized - a.shift));
  a.scale = static_cast<double>(n) / static_cast<double>(resized);
  a.clip1 = n;
  return a;
}

// One axis of the whole image (or a crop box `at`, `len` pixels) resized to `out` pixels.
AxisPlan box_axis(int at, int len, int out) {
  AxisPlan a;
  a.origin = at;
  a.scale = static_cast<double>(len) / out;
  a.out1 = out;
  a.clip0 = at;
  a.clip1 = at + len;
  return a;
}

}  // namespace

CropPlan plan_crop(const ImageSpec& spec, int width, int height, SampleRng& rng) {
  CropPlan p;
  switch (spec.crop) {
    case CropMode::kRandom: {
      int i, j, h, w;
      random_box(spec, width, height, rng, &i, &j, &h, &w);
      p.x = box_axis(j, w, spec.width);
      p.y = box_axis(i, h, spec.height);
      break;
    }
    case CropMode::kCenter: {
      // torchvision's Resize(int): the shorter side becomes `resize`, the longer one
      // int(resize * long / short).
      const bool wide = width > height;
      const int64_t shorter = wide ? height : width, longer = wide ? width : height;
      const int64_t resized_long =
          static_cast<int64_t>(static_cast<double>(spec.resize * longer) / static_cast<double>(shorter));
      p.x = center_axis(width, wide ? resized_long : spec.resize, spec.width);
      p.y = center_axis(height, wide ? spec.resize : resized_long, spec.height);
      break;
    }
    case CropMode::kNone:
      if (spec.own_size && (width != spec.width || height != spec.height))
        throw ImageError("crop=\"none\" without a size needs every image at one size: this one is " +
                         std::to_string(width) + "x" + std::to_string(height) + " (width x height), " +
                         "the first was " + std::to_string(spec.width) + "x" + std::to_string(spec.height) +
                         "; pass size= to resize them");
      p.x = box_axis(0, width, spec.width);
      p.y = box_axis(0, height, spec.height);
      break;
  }
  if (spec.flip > 0) p.flip = rng.uniform() < spec.flip;
  return p;
}

}  // namespace fastload::image
