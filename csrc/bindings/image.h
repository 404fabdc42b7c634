// fastload._C's image pieces (image.cpp): the Python class a bad image raises, set by the
// collation-error translator (loader.cpp) as by image.cpp's own.
#pragma once
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "image/image_decoder.h"
#include "image/image_spec.h"

namespace fastload {
// Sets fl.ImageError (registered by fastload/__init__.py) with `message`; RuntimeError before.
void set_image_error(const std::string& message);
// fl.Image.native()'s tuple as a spec, and the fallback decoder object (None: none); for other
// sources that decode images (tar.cpp).
image::ImageSpec image_spec_from(const pybind11::tuple& spec);
std::shared_ptr<const image::FallbackDecoder> image_fallback_from(const pybind11::object& fallback);
}  // namespace fastload
