// A build of the decode stage without libjpeg and libpng (csrc/image compiled without
// FASTLOAD_WITH_LIBJPEG / FASTLOAD_WITH_LIBPNG, linked without -ljpeg -lpng): it compiles, says it
// has no native decoder, sends JPEG and PNG bytes to the fallback decoder (crop, resize and flip
// still native) and, without one, refuses them naming the format. Built and run by
// tests/test_images_fallback.py; prints "ok" when every check passed.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "image/image_decoder.h"

using namespace fastload::image;

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

// Any bytes: a 6x4 picture whose pixel (x, y) is (10x, 20y, 7); counts its calls.
class StubFallback final : public FallbackDecoder {
 public:
  mutable int headers = 0, decodes = 0;
  void header(const uint8_t*, size_t, int* width, int* height, std::string* format) const override {
    ++headers;
    *width = 6, *height = 4, *format = "STUB";
  }
  void decode(const uint8_t*, size_t, Pixels* out) const override {
    ++decodes;
    out->width = 6, out->height = 4;
    out->rgb.resize(6 * 4 * 3);
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 6; ++x) {
        uint8_t* p = out->rgb.data() + (y * 6 + x) * 3;
        p[0] = static_cast<uint8_t>(10 * x), p[1] = static_cast<uint8_t>(20 * y), p[2] = 7;
      }
  }
};

}  // namespace

int main() {
  check(!native_jpeg() && !native_png(), "a build without the libraries says it has no native decoder");
  check(native_jpeg_library().empty() && native_png_library().empty(), "and names no library");
  const std::vector<uint8_t> jpeg = {0xFF, 0xD8, 0xFF, 0xE0, 0, 16, 'J', 'F', 'I', 'F', 0};
  const std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 0, 13};
  ImageSpec spec;
  spec.crop = CropMode::kNone;
  spec.height = 4, spec.width = 6;
  StubFallback stub;
  ImageDecoder decoder;
  for (const auto* bytes : {&jpeg, &png}) {
    std::vector<uint8_t> out(static_cast<size_t>(spec.out_bytes()));
    SampleRng rng(0, 0, 0);
    DecodeInfo info;
    decoder.decode(bytes->data(), bytes->size(), spec, rng, &stub, out.data(), &info);
    check(info.format == "STUB", "JPEG and PNG bytes go to the fallback");
    bool same = true;
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 6; ++x) {
        const uint8_t* p = out.data() + (y * 6 + x) * 3;
        same = same && p[0] == 10 * x && p[1] == 20 * y && p[2] == 7;
      }
    check(same, "the fallback's pixels reach the output unchanged at their own size");
    const ImageSize s = decoder.size_of(bytes->data(), bytes->size(), &stub);
    check(s.width == 6 && s.height == 4 && s.format_name == "STUB", "the size comes from the fallback");
    try {
      SampleRng again(0, 0, 0);
      decoder.decode(bytes->data(), bytes->size(), spec, again, nullptr, out.data());
      check(false, "without a fallback the bytes are refused");
    } catch (const ImageError& e) {
      const std::string name = bytes == &jpeg ? "format JPEG" : "format PNG";
      check(std::strstr(e.what(), name.c_str()) != nullptr, std::string("the refusal names the format: ") + e.what());
    }
  }
  check(stub.decodes == 2, "one fallback decode per image");
  if (failures == 0) std::printf("ok\n");
  return failures == 0 ? 0 : 1;
}
