// fastload._C's image pieces (image.cpp): the Python class a bad image raises, set by the
// collation-error translator (loader.cpp) as by image.cpp's own; the decoder of an image column
// (arrow.cpp's requests).
#pragma once
#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "core/value_decoder.h"
#include "image/image_decoder.h"
#include "image/image_spec.h"

namespace fastload {
// Sets fl.ImageError (registered by fastload/__init__.py) with `message`; RuntimeError before.
void set_image_error(const std::string& message);
// The decoder of an image column (decode= on fl.Arrow / fl.Parquet): `spec` is fl.Image.native(),
// `fallback` an object with header() and decode() (PIL's) or None.
std::shared_ptr<const ValueDecoder> image_column_decoder(const pybind11::tuple& spec, const pybind11::object& fallback);
// fl.Image.native()'s tuple as a spec, and the fallback decoder object (None: none); for other
// sources that decode images (tar.cpp).
image::ImageSpec image_spec_from(const pybind11::tuple& spec);
std::shared_ptr<const image::FallbackDecoder> image_fallback_from(const pybind11::object& fallback);
}  // namespace fastload
