// An image column decoded per row; see image_column.h.
#include "image/image_column.h"

#include <stdexcept>
#include <vector>

#include "image/image_source.h"
#include "image/sample_rng.h"

namespace fastload::image {

ImageColumnDecoder::ImageColumnDecoder(ImageSpec spec, std::shared_ptr<const FallbackDecoder> fallback)
    : spec_(spec), fallback_(std::move(fallback)) {
  spec_.check();
  if (spec_.own_size)
    throw std::invalid_argument("an image column needs fl.Image(size=...): crop='none' without a size takes the "
                                "size of an image folder's first file, and a column has none");
}

PartSchema ImageColumnDecoder::part(const std::string& name) const { return image_part(name, spec_); }

void ImageColumnDecoder::decode(const char* data, int64_t size, const std::string* path, uint64_t seed, int64_t epoch,
                                const ValueOrigin& origin, std::byte* out) const {
  thread_local std::vector<uint8_t> file;
  try {
    const uint8_t* bytes = reinterpret_cast<const uint8_t*>(data);
    size_t n = static_cast<size_t>(size);
    if (!data) {
      read_file(*path, file);
      bytes = file.data();
      n = file.size();
    }
    SampleRng rng(seed, epoch, origin.sample);
    thread_decoder().decode(bytes, n, spec_, rng, fallback_.get(), reinterpret_cast<uint8_t*>(out));
  } catch (const ImageError& e) {
    std::string where = "image column '" + *origin.column + "' row " + std::to_string(origin.row) + " (sample " +
                        std::to_string(origin.sample) + ")";
    if (!data) where += ", file '" + *path + "'";
    throw ImageError(where + ": " + e.what());
  }
}

}  // namespace fastload::image
