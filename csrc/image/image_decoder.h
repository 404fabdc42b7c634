// One encoded image into one batch slot: the format told by its bytes, the header, the pixel
// limit, the crop drawn from the sample's stream, the decode of only what the crop needs (JPEG:
// the smallest DCT scale whose output still covers the target, the crop's iMCU region; PNG: the
// rows down to the crop's last), the antialiased resize, the flip, uint8 into the slot.
// Formats without a native decoder (WebP, BMP, TIFF, ..., or JPEG and PNG in a build without
// libjpeg / libpng) go through a FallbackDecoder that returns the whole image as RGB8 (PIL, given
// by the bindings); the crop, resize and flip are the same native code.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "image/crop.h"
#include "image/image_error.h"
#include "image/image_spec.h"
#include "image/resample.h"
#include "image/sample_rng.h"

namespace fastload::image {

enum class Format : uint8_t { kJpeg, kPng, kOther };
Format sniff_format(const uint8_t* data, size_t size);

struct Pixels {
  std::vector<uint8_t> rgb;  // height rows of width * 3 bytes
  int width = 0, height = 0;
};

class FallbackDecoder {
 public:
  virtual ~FallbackDecoder() = default;
  // The size of the image (without decoding its pixels) and its format's name. Throws ImageError.
  virtual void header(const uint8_t* data, size_t size, int* width, int* height, std::string* format) const = 0;
  // The whole image as RGB8. Throws ImageError with the decoder's message.
  virtual void decode(const uint8_t* data, size_t size, Pixels* out) const = 0;
};

// Whether this build decodes JPEG / PNG natively, and with what.
// Test instrument: with `enabled` false the process decodes as a build without libjpeg / libpng
// does (every format through the fallback; the functions below say none). Returns the old value.
bool set_native_decoding(bool enabled);
bool native_jpeg();
bool native_png();
std::string native_jpeg_library();  // e.g. "libjpeg-turbo 2.1.5"; empty without a native decoder
std::string native_png_library();   // e.g. "libpng 1.6.39"; empty without a native decoder

// The DCT scale (eighths: 1, 2, 4 or 8) a JPEG is decoded at when one output pixel spans x_scale by
// y_scale source pixels: the smallest at which the decoded pixels still cover the output (no
// axis upsampled that was downsampled); 8 when none does.
int choose_jpeg_scale(double x_scale, double y_scale);

struct ImageSize {
  Format format = Format::kOther;
  std::string format_name;
  int width = 0, height = 0;
};

// One per collation thread: decoder state and scratch buffers reused from image to image.
class ImageDecoder {
 public:
  ImageDecoder();
  ~ImageDecoder();
  ImageDecoder(const ImageDecoder&) = delete;
  ImageDecoder& operator=(const ImageDecoder&) = delete;

  // The image's format and size from its header. Throws ImageError.
  ImageSize size_of(const uint8_t* data, size_t size, const FallbackDecoder* fallback);
  // Decodes [data, data + size) into `out` (spec.out_bytes() bytes). Throws ImageError (bad or
  // refused image) with a message that does not name the image: the caller adds where it came from.
  void decode(const uint8_t* data, size_t size, const ImageSpec& spec, SampleRng& rng,
              const FallbackDecoder* fallback, uint8_t* out, DecodeInfo* info = nullptr);

  struct Native;

 private:
  std::unique_ptr<Native> native_;
  std::vector<uint8_t> region_;  // the decoded pixels (RGBX)
  ResampleScratch scratch_;
  Pixels pixels_;  // a fallback's RGB image
};

}  // namespace fastload::image
