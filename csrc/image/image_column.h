// An image column of Arrow or Parquet data (decode={"col": fl.Image(...)}): each row's encoded
// bytes, or the file its path names, decoded by the collation thread into the batch's slot with
// the same stage as an image file (image_decoder.h), its randomness keyed by the sample id.
#pragma once
#include <memory>
#include <string>

#include "core/value_decoder.h"
#include "image/image_decoder.h"
#include "image/image_spec.h"

namespace fastload::image {

class ImageColumnDecoder final : public ValueDecoder {
 public:
  // Throws std::invalid_argument for a bad spec (or crop="none" without a size: a column has no
  // first file to take the size from).
  ImageColumnDecoder(ImageSpec spec, std::shared_ptr<const FallbackDecoder> fallback);
  PartSchema part(const std::string& name) const override;
  void decode(const char* data, int64_t size, const std::string* path, uint64_t seed, int64_t epoch,
              const ValueOrigin& origin, std::byte* out) const override;

 private:
  ImageSpec spec_;
  std::shared_ptr<const FallbackDecoder> fallback_;
};

}  // namespace fastload::image
