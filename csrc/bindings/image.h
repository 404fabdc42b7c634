// fastload._C's image pieces (image.cpp): the Python class a bad image raises, set by the
// collation-error translator (loader.cpp) as by image.cpp's own.
#pragma once
#include <string>

namespace fastload {
// Sets fl.ImageError (registered by fastload/__init__.py) with `message`; RuntimeError before.
void set_image_error(const std::string& message);
}  // namespace fastload
