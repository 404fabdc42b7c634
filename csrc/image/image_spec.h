// What the decode stage makes of one encoded image: fl.Image as the native side holds it (the
// Python side checks the arguments; ImageSpec::check repeats the checks that guard memory).
#pragma once
#include <cstdint>
#include <string>

namespace fastload::image {

enum class CropMode : uint8_t {
  kRandom,  // torchvision's RandomResizedCrop, resized to the output size
  kCenter,  // shorter side resized to `resize`, then the central output-size crop (zero padded)
  kNone,    // the whole image, resized to the output size (or at its own size: `own_size`)
};

enum class Layout : uint8_t { kHWC, kCHW };

struct ImageSpec {
  int height = 0, width = 0;  // the output's size
  CropMode crop = CropMode::kRandom;
  double scale_min = 0.08, scale_max = 1.0;          // random: the crop's share of the area
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // random: the crop's width / height
  int resize = 0;                                    // center: the shorter side before the crop
  double flip = 0.0;                                 // probability of a horizontal flip
  Layout layout = Layout::kHWC;
  int64_t max_pixels = 89478485;  // PIL's Image.MAX_IMAGE_PIXELS: larger images are refused
  // crop="none" without a size: every image must be height x width (the first one's size).
  bool own_size = false;

  int64_t out_bytes() const { return static_cast<int64_t>(height) * width * 3; }
  // Throws std::invalid_argument naming the bad field.
  void check() const;
};

// What the decoder found and did for one image (tests and fl.Image.describe read it).
struct DecodeInfo {
  std::string format;       // "jpeg", "png", or the fallback's name for the format
  int width = 0, height = 0;  // the image's own size
  int scale_eighths = 8;    // the DCT scale the JPEG was decoded at (M/8); 8 for other formats
  int box_x = 0, box_y = 0, box_w = 0, box_h = 0;  // random crop: the crop box; else the whole image
  bool flipped = false;
  int decoded_x = 0, decoded_y = 0, decoded_w = 0, decoded_h = 0;  // the decoded region, scaled pixels
};

}  // namespace fastload::image
