// JPEG through libjpeg-turbo's libjpeg API: the header alone, then only what a crop needs: the
// DCT-domain scale M/8 (jpeg's scale_num / scale_denom), the crop's iMCU columns
// (jpeg_crop_scanline), its rows (jpeg_skip_scanlines, then the decode stops). Grayscale comes
// out as RGB(X); CMYK and YCCK are converted the way PIL's convert("RGB") converts them.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "image/resample.h"

namespace fastload::image {

struct JpegHeader {
  int width = 0, height = 0;
  int components = 0;
  bool cmyk = false;  // CMYK or YCCK (converted to RGB after the decode)
};

class JpegDecoder {
 public:
  JpegDecoder();
  ~JpegDecoder();
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  // Reads the header of the JPEG in [data, data + size) (which must outlive decode()). Throws
  // ImageError with libjpeg's message.
  JpegHeader read_header(const uint8_t* data, size_t size);
  // The image's size decoded at scale eighths/8 (1..8).
  void scaled_size(int eighths, int* width, int* height) const;
  // Decodes at least columns [x0, x1) and rows [y0, y1) of the image scaled by eighths/8 into
  // `buffer` (RGBX, with kRegionSlack bytes after) and says where they are; stops reading after
  // row y1. Throws ImageError.
  PixelRegion decode(int eighths, int x0, int x1, int y0, int y1, std::vector<uint8_t>& buffer);
  // Lets go of the current image (after read_header or decode).
  void reset();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// libjpeg-turbo's version, e.g. "2.1.5".
std::string jpeg_library_version();

}  // namespace fastload::image
