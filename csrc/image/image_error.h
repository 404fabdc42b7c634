// A bad image: undecodable, truncated, over the pixel limit, or of a size the spec refuses. The
// message names the image (file or row) and says what the decoder said; Python gets fl.ImageError.
#pragma once
#include <stdexcept>

namespace fastload::image {

class ImageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace fastload::image
