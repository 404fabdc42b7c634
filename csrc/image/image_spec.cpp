// ImageSpec::check; see image_spec.h.
#include "image/image_spec.h"

#include <cmath>
#include <stdexcept>

namespace fastload::image {

void ImageSpec::check() const {
  // The output of one image must stay well inside int32 offsets and a batch slot's bounds.
  constexpr int kMaxSide = 1 << 15;
  if (height <= 0 || width <= 0 || height > kMaxSide || width > kMaxSide)
    throw std::invalid_argument("fl.Image size must be positive and at most " + std::to_string(kMaxSide) +
                                " a side, got " + std::to_string(height) + "x" + std::to_string(width));
  if (!(scale_min > 0 && scale_min <= scale_max && std::isfinite(scale_max)))
    throw std::invalid_argument("fl.Image scale must be 0 < min <= max");
  if (!(ratio_min > 0 && ratio_min <= ratio_max && std::isfinite(ratio_max)))
    throw std::invalid_argument("fl.Image ratio must be 0 < min <= max");
  if (crop == CropMode::kCenter && (resize <= 0 || resize > kMaxSide))
    throw std::invalid_argument("fl.Image resize must be positive, got " + std::to_string(resize));
  if (!(flip >= 0 && flip <= 1)) throw std::invalid_argument("fl.Image flip must be a probability in [0, 1]");
  if (max_pixels <= 0) throw std::invalid_argument("fl.Image max_pixels must be positive");
}

}  // namespace fastload::image
