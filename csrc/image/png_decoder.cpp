// libpng glue; see png_decoder.h. libpng reports errors by longjmp to png_jmpbuf: each call that
// runs libpng sets it first, and only plain values live between it and libpng's frames.
#include "image/png_decoder.h"

#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "image/image_error.h"

namespace fastload::image {

struct PngDecoder::State {
  png_structp png = nullptr;
  png_infop info = nullptr;
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  PngHeader header;
  char message[256] = {0};
  std::vector<uint8_t> row;  // a full decoded row (rows above or beside the crop land here)
  std::vector<uint8_t> image;  // an interlaced image, whole
};

namespace {

[[noreturn]] void on_error(png_structp png, png_const_charp message) {
  auto* s = static_cast<PngDecoder::State*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof(s->message), "%s", message ? message : "unknown error");
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}  // ancillary chunks with bad CRCs are skipped, as PIL does

void read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* s = static_cast<PngDecoder::State*>(png_get_io_ptr(png));
  if (n > s->size - s->pos) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, s->data + s->pos, n);
  s->pos += n;
}

}  // namespace

PngDecoder::PngDecoder() : state_(std::make_unique<State>()) {}

PngDecoder::~PngDecoder() { reset(); }

void PngDecoder::reset() {
  State& s = *state_;
  if (s.png) png_destroy_read_struct(&s.png, s.info ? &s.info : nullptr, nullptr);
  s.png = nullptr;
  s.info = nullptr;
}

PngHeader PngDecoder::read_header(const uint8_t* data, size_t size) {
  reset();
  State& s = *state_;
  s.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, on_error, on_warning);
  if (!s.png) throw ImageError("libpng could not start (out of memory)");
  s.info = png_create_info_struct(s.png);
  if (!s.info) {
    reset();
    throw ImageError("libpng could not start (out of memory)");
  }
  s.data = data;
  s.size = size;
  s.pos = 0;
  if (setjmp(png_jmpbuf(s.png))) {
    reset();
    throw ImageError(std::string("PNG header: ") + s.message);
  }
  png_set_read_fn(s.png, &s, read_bytes);
  // No limit of libpng's own on the size: the caller checks the pixel count (fl.Image's limit).
  png_set_user_limits(s.png, 0x7fffffff, 0x7fffffff);
  png_read_info(s.png, s.info);
  PngHeader& h = s.header;
  h.width = static_cast<int>(png_get_image_width(s.png, s.info));
  h.height = static_cast<int>(png_get_image_height(s.png, s.info));
  h.bit_depth = png_get_bit_depth(s.png, s.info);
  h.color_type = png_get_color_type(s.png, s.info);
  h.interlaced = png_get_interlace_type(s.png, s.info) != PNG_INTERLACE_NONE;
  return h;
}

PixelRegion PngDecoder::decode(int x0, int x1, int y0, int y1, std::vector<uint8_t>& buffer) {
  State& s = *state_;
  if (!s.png) throw std::logic_error("PngDecoder::decode before read_header");
  const PngHeader& h = s.header;
  const size_t full = static_cast<size_t>(h.width) * 4;
  const size_t stride = static_cast<size_t>(x1 - x0) * 4;
  // Allocated before libpng runs (an allocation failure throws through plain frames only).
  buffer.resize(stride * static_cast<size_t>(y1 - y0) + kRegionSlack);
  if (h.interlaced) s.image.resize(full * static_cast<size_t>(h.height));
  else s.row.resize(full);
  if (setjmp(png_jmpbuf(s.png))) {
    reset();
    throw ImageError(std::string("PNG data: ") + s.message);
  }
  png_structp png = s.png;
  if (h.color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (h.color_type == PNG_COLOR_TYPE_GRAY && h.bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (h.bit_depth == 16) png_set_strip_16(png);
  if (h.color_type & PNG_COLOR_MASK_ALPHA) png_set_strip_alpha(png);
  if (h.color_type == PNG_COLOR_TYPE_GRAY || h.color_type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_filler(png, 0xFF, PNG_FILLER_AFTER);  // RGBX: 4 bytes a pixel, as the resize reads them
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, s.info);
  if (png_get_rowbytes(png, s.info) != full) png_error(png, "unexpected row size after conversion to RGBX");
  if (h.interlaced) {
    // Each pass fills in more of every row: the whole image is needed.
    for (int p = 0; p < passes; ++p)
      for (int y = 0; y < h.height; ++y) png_read_row(png, s.image.data() + static_cast<size_t>(y) * full, nullptr);
    for (int y = y0; y < y1; ++y)
      std::memcpy(buffer.data() + static_cast<size_t>(y - y0) * stride,
                  s.image.data() + static_cast<size_t>(y) * full + static_cast<size_t>(x0) * 4, stride);
  } else {
    for (int y = 0; y < y1; ++y) {
      png_read_row(png, s.row.data(), nullptr);
      if (y >= y0)
        std::memcpy(buffer.data() + static_cast<size_t>(y - y0) * stride, s.row.data() + static_cast<size_t>(x0) * 4,
                    stride);
    }
  }
  reset();  // the rows below the crop are never decoded
  PixelRegion region;
  region.data = buffer.data();
  region.stride = static_cast<ptrdiff_t>(stride);
  region.x0 = x0;
  region.y0 = y0;
  region.width = x1 - x0;
  region.height = y1 - y0;
  return region;
}

std::string png_library_version() { return std::string("libpng ") + PNG_LIBPNG_VER_STRING; }

}  // namespace fastload::image
