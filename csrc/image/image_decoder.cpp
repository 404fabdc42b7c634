// The decode stage for one image; see image_decoder.h.
#include "image/image_decoder.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>

#ifdef FASTLOAD_WITH_LIBJPEG
#include "image/jpeg_decoder.h"
#endif
#ifdef FASTLOAD_WITH_LIBPNG
#include "image/png_decoder.h"
#endif

namespace fastload::image {

struct ImageDecoder::Native {
#ifdef FASTLOAD_WITH_LIBJPEG
  JpegDecoder jpeg;
#endif
#ifdef FASTLOAD_WITH_LIBPNG
  PngDecoder png;
#endif
};

namespace {
std::atomic<bool> g_native_enabled{true};  // set_native_decoding: off acts as a build without them
}  // namespace

bool set_native_decoding(bool enabled) { return g_native_enabled.exchange(enabled); }

bool native_jpeg() {
#ifdef FASTLOAD_WITH_LIBJPEG
  return g_native_enabled.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

bool native_png() {
#ifdef FASTLOAD_WITH_LIBPNG
  return g_native_enabled.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

std::string native_jpeg_library() {
#ifdef FASTLOAD_WITH_LIBJPEG
  if (native_jpeg()) return jpeg_library_version();
#endif
  return "";
}

std::string native_png_library() {
#ifdef FASTLOAD_WITH_LIBPNG
  if (native_png()) return png_library_version();
#endif
  return "";
}

Format sniff_format(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return Format::kJpeg;
  static const uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::memcmp(d, kPngSignature, 8) == 0) return Format::kPng;
  return Format::kOther;
}

int choose_jpeg_scale(double x_scale, double y_scale) {
  // Only 1/8, 1/4 and 1/2: libjpeg-turbo has SIMD inverse DCTs for those (and the full size);
  // its 3/8 .. 7/8 ones are plain C and slower than the full decode (bench_images.py --scales).
  for (int m : {1, 2, 4})
    if (x_scale * m / 8.0 >= 1.0 && y_scale * m / 8.0 >= 1.0) return m;
  return 8;
}

namespace {

// What the bytes look like, for the message when no decoder takes them.
std::string guess_format(const uint8_t* d, size_t n) {
  auto starts = [&](const char* magic, size_t at = 0) {
    const size_t len = std::strlen(magic);
    return n >= at + len && std::memcmp(d + at, magic, len) == 0;
  };
  if (sniff_format(d, n) == Format::kJpeg) return "JPEG";  // a build without libjpeg / libpng
  if (sniff_format(d, n) == Format::kPng) return "PNG";
  if (starts("RIFF") && starts("WEBP", 8)) return "WebP";
  if (starts("GIF87a") || starts("GIF89a")) return "GIF";
  if (starts("BM")) return "BMP";
  if (starts("II*") || starts("MM")) return n >= 4 && (d[2] == 42 || d[3] == 42) ? "TIFF" : "unknown";
  if (n >= 2 && d[0] == 'P' && d[1] >= '1' && d[1] <= '7') return "PNM (PPM/PGM/PBM)";
  if (n >= 12 && std::memcmp(d + 4, "ftyp", 4) == 0) return "HEIF/AVIF (ISO media)";
  return "unknown";
}

std::string first_bytes(const uint8_t* d, size_t n) {
  std::string s;
  char hex[4];
  for (size_t i = 0; i < std::min<size_t>(n, 4); ++i) {
    std::snprintf(hex, sizeof(hex), "%02x", d[i]);
    s += hex;
  }
  return s.empty() ? "nothing (an empty file)" : "0x" + s;
}

[[noreturn]] void refuse(const uint8_t* data, size_t size) {
  throw ImageError("format " + guess_format(data, size) + " (it starts with " + first_bytes(data, size) +
                   ") is not decoded natively by this build, and fl.Image(fallback=None) (or Pillow not "
                   "installed) leaves no fallback decoder");
}

void check_pixels(int width, int height, const ImageSpec& spec, const char* format) {
  if (width <= 0 || height <= 0)
    throw ImageError(std::string(format) + " header gives an empty image (" + std::to_string(width) + "x" +
                     std::to_string(height) + ")");
  const int64_t pixels = static_cast<int64_t>(width) * height;
  if (pixels > spec.max_pixels)
    throw ImageError(std::string(format) + " image of " + std::to_string(width) + "x" + std::to_string(height) +
                     " = " + std::to_string(pixels) + " pixels is over the limit of " +
                     std::to_string(spec.max_pixels) + " (fl.Image(max_pixels=...)); refused before decoding");
}

// The two filters of a crop plan for the image scaled by `s` (sw x sh pixels).
void plan_filters(const CropPlan& p, double s, int sw, int sh, AxisFilter* fx, AxisFilter* fy) {
  make_axis_filter(p.x, s, sw, fx);
  make_axis_filter(p.y, s, sh, fy);
}

void fill_info(DecodeInfo* info, const char* format, int width, int height, int eighths, const CropPlan& p,
               const PixelRegion& r) {
  if (!info) return;
  info->format = format;
  info->width = width;
  info->height = height;
  info->scale_eighths = eighths;
  info->box_x = p.x.clip0;
  info->box_y = p.y.clip0;
  info->box_w = p.x.clip1 - p.x.clip0;
  info->box_h = p.y.clip1 - p.y.clip0;
  info->flipped = p.flip;
  info->decoded_x = r.x0;
  info->decoded_y = r.y0;
  info->decoded_w = r.width;
  info->decoded_h = r.height;
}

OutputWindow window_of(const ImageSpec& spec, const CropPlan& p, uint8_t* out) {
  if (p.padded(spec)) std::memset(out, 0, static_cast<size_t>(spec.out_bytes()));
  OutputWindow w;
  w.data = out;
  w.height = spec.height;
  w.width = spec.width;
  w.layout = spec.layout;
  w.x0 = p.x.out0;
  w.y0 = p.y.out0;
  w.flip = p.flip;
  return w;
}

}  // namespace

ImageDecoder::ImageDecoder() : native_(std::make_unique<Native>()) {}
ImageDecoder::~ImageDecoder() = default;

ImageSize ImageDecoder::size_of(const uint8_t* data, size_t size, const FallbackDecoder* fallback) {
  ImageSize s;
  s.format = sniff_format(data, size);
#ifdef FASTLOAD_WITH_LIBJPEG
  if (s.format == Format::kJpeg && native_jpeg()) {
    const JpegHeader h = native_->jpeg.read_header(data, size);
    native_->jpeg.reset();
    s.format_name = "JPEG";
    s.width = h.width;
    s.height = h.height;
    return s;
  }
#endif
#ifdef FASTLOAD_WITH_LIBPNG
  if (s.format == Format::kPng && native_png()) {
    const PngHeader h = native_->png.read_header(data, size);
    native_->png.reset();
    s.format_name = "PNG";
    s.width = h.width;
    s.height = h.height;
    return s;
  }
#endif
  if (!fallback) refuse(data, size);
  fallback->header(data, size, &s.width, &s.height, &s.format_name);
  return s;
}

void ImageDecoder::decode(const uint8_t* data, size_t size, const ImageSpec& spec, SampleRng& rng,
                          const FallbackDecoder* fallback, uint8_t* out, DecodeInfo* info) {
  const Format format = sniff_format(data, size);
  AxisFilter fx, fy;
#ifdef FASTLOAD_WITH_LIBJPEG
  if (format == Format::kJpeg && native_jpeg()) {
    JpegDecoder& jpeg = native_->jpeg;
    const JpegHeader h = jpeg.read_header(data, size);
    check_pixels(h.width, h.height, spec, "JPEG");
    const CropPlan p = plan_crop(spec, h.width, h.height, rng);
    const int eighths = choose_jpeg_scale(p.x.scale, p.y.scale);
    int sw, sh;
    jpeg.scaled_size(eighths, &sw, &sh);
    plan_filters(p, eighths / 8.0, sw, sh, &fx, &fy);
    const PixelRegion r = jpeg.decode(eighths, fx.src_begin, fx.src_end, fy.src_begin, fy.src_end, region_);
    resample(r, fx, fy, scratch_, window_of(spec, p, out));
    fill_info(info, "JPEG", h.width, h.height, eighths, p, r);
    return;
  }
#endif
#ifdef FASTLOAD_WITH_LIBPNG
  if (format == Format::kPng && native_png()) {
    PngDecoder& png = native_->png;
    const PngHeader h = png.read_header(data, size);
    check_pixels(h.width, h.height, spec, "PNG");
    const CropPlan p = plan_crop(spec, h.width, h.height, rng);
    plan_filters(p, 1.0, h.width, h.height, &fx, &fy);
    const PixelRegion r = png.decode(fx.src_begin, fx.src_end, fy.src_begin, fy.src_end, region_);
    resample(r, fx, fy, scratch_, window_of(spec, p, out));
    fill_info(info, "PNG", h.width, h.height, 8, p, r);
    return;
  }
#endif
  (void)format;
  if (!fallback) refuse(data, size);
  int width = 0, height = 0;
  std::string name;
  fallback->header(data, size, &width, &height, &name);
  check_pixels(width, height, spec, name.c_str());
  const CropPlan p = plan_crop(spec, width, height, rng);
  fallback->decode(data, size, &pixels_);
  if (pixels_.width != width || pixels_.height != height ||
      pixels_.rgb.size() != static_cast<size_t>(width) * height * 3)
    throw ImageError(name + " decoder returned " + std::to_string(pixels_.width) + "x" +
                     std::to_string(pixels_.height) + " pixels for an image whose header says " +
                     std::to_string(width) + "x" + std::to_string(height));
  plan_filters(p, 1.0, width, height, &fx, &fy);
  // The rows the filters read, as RGBX.
  const size_t stride = static_cast<size_t>(fx.src_end - fx.src_begin) * 4;
  region_.resize(stride * static_cast<size_t>(fy.src_end - fy.src_begin) + kRegionSlack);
  for (int y = fy.src_begin; y < fy.src_end; ++y) {
    const uint8_t* in = pixels_.rgb.data() + (static_cast<size_t>(y) * width + fx.src_begin) * 3;
    uint8_t* o = region_.data() + static_cast<size_t>(y - fy.src_begin) * stride;
    for (int x = fx.src_begin; x < fx.src_end; ++x, in += 3, o += 4) {
      o[0] = in[0];
      o[1] = in[1];
      o[2] = in[2];
      o[3] = 255;
    }
  }
  PixelRegion r;
  r.data = region_.data();
  r.stride = static_cast<ptrdiff_t>(stride);
  r.x0 = fx.src_begin;
  r.y0 = fy.src_begin;
  r.width = fx.src_end - fx.src_begin;
  r.height = fy.src_end - fy.src_begin;
  resample(r, fx, fy, scratch_, window_of(spec, p, out));
  fill_info(info, name.c_str(), width, height, 8, p, r);
}

}  // namespace fastload::image
