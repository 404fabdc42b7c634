// PNG through libpng: the header alone, then rows up to the last one a crop needs (PNG rows are
// compressed in sequence: the rows above the crop are decoded and dropped, the decode stops
// after its last row; an interlaced PNG is decoded whole). Every colour type becomes RGB8 the way
// PIL's convert("RGB") does: palette looked up, gray replicated, alpha dropped (not blended),
// 16-bit samples cut to their high byte.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "image/resample.h"

namespace fastload::image {

struct PngHeader {
  int width = 0, height = 0;
  int bit_depth = 0, color_type = 0;
  bool interlaced = false;
};

class PngDecoder {
 public:
  PngDecoder();
  ~PngDecoder();
  PngDecoder(const PngDecoder&) = delete;
  PngDecoder& operator=(const PngDecoder&) = delete;

  // Reads the header of the PNG in [data, data + size) (which must outlive decode()). Throws
  // ImageError with libpng's message.
  PngHeader read_header(const uint8_t* data, size_t size);
  // Decodes rows [y0, y1), columns [x0, x1) into `buffer` (RGBX, with kRegionSlack bytes after).
  // Throws ImageError.
  PixelRegion decode(int x0, int x1, int y0, int y1, std::vector<uint8_t>& buffer);
  void reset();

  struct State;

 private:
  std::unique_ptr<State> state_;
};

// libpng's version, e.g. "libpng 1.6.39".
std::string png_library_version();

}  // namespace fastload::image
