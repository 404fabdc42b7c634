// fastload._C's decode stage: ImageFileSource (fl.ImageFolder's native source), the fallback
// decoder (a Python object, PIL's, called with the GIL for formats without a native decoder),
// which native decoders this build has, and test instruments that decode one image.
#include "bindings/image.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bindings/python_ref.h"
#include "bindings/register.h"
#include "bindings/source.h"
#include "bindings/without_gil.h"
#include "image/image_column.h"
#include "image/image_decoder.h"
#include "image/image_source.h"
#include "image/resample.h"

namespace py = pybind11;

namespace fastload {

namespace {

PyObject* g_image_error = nullptr;  // fl.ImageError; a strong reference for the interpreter's life

// A Python exception raised by the fallback, as "Type: message" (the GIL is held).
std::string describe(const py::error_already_set& e) {
  return std::string(py::str(e.type().attr("__name__"))) + ": " + std::string(py::str(e.value()));
}

// The fallback decoder: a Python object with header(data) -> (width, height, format name) and
// decode(data) -> uint8 array (height, width, 3). Called with the GIL taken on the collation
// thread (PIL releases it while it decodes).
class PyFallback final : public image::FallbackDecoder {
 public:
  explicit PyFallback(py::object decoder) : decoder_(PyRef::borrow(decoder.ptr())) {}

  void header(const uint8_t* data, size_t size, int* width, int* height, std::string* format) const override {
    GilScope gil;
    try {
      py::object d = py::reinterpret_borrow<py::object>(decoder_.get());
      py::tuple t = d.attr("header")(py::memoryview::from_memory(data, static_cast<py::ssize_t>(size)));
      *width = t[0].cast<int>();
      *height = t[1].cast<int>();
      *format = t[2].cast<std::string>();
    } catch (const py::error_already_set& e) {
      throw image::ImageError(describe(e));
    }
  }

  void decode(const uint8_t* data, size_t size, image::Pixels* out) const override {
    GilScope gil;
    try {
      py::object d = py::reinterpret_borrow<py::object>(decoder_.get());
      auto a = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(
          d.attr("decode")(py::memoryview::from_memory(data, static_cast<py::ssize_t>(size))));
      if (!a || a.ndim() != 3 || a.shape(2) != 3) throw image::ImageError("the fallback decoder returned no (H, W, 3) array");
      out->height = static_cast<int>(a.shape(0));
      out->width = static_cast<int>(a.shape(1));
      out->rgb.assign(a.data(), a.data() + a.size());
    } catch (const py::error_already_set& e) {
      throw image::ImageError(describe(e));
    }
  }

 private:
  PyRef decoder_;
};

image::ImageSpec spec_from(const py::tuple& t) {
  // (height, width, crop, scale_min, scale_max, ratio_min, ratio_max, resize, flip, layout,
  //  max_pixels, own_size): fastload._sources.images.Image.native()
  if (py::len(t) != 12) throw std::invalid_argument("an image spec is a 12-tuple");
  image::ImageSpec s;
  s.height = t[0].cast<int>();
  s.width = t[1].cast<int>();
  const std::string crop = t[2].cast<std::string>();
  if (crop == "random") s.crop = image::CropMode::kRandom;
  else if (crop == "center") s.crop = image::CropMode::kCenter;
  else if (crop == "none") s.crop = image::CropMode::kNone;
  else throw std::invalid_argument("crop must be 'random', 'center' or 'none', got '" + crop + "'");
  s.scale_min = t[3].cast<double>();
  s.scale_max = t[4].cast<double>();
  s.ratio_min = t[5].cast<double>();
  s.ratio_max = t[6].cast<double>();
  s.resize = t[7].cast<int>();
  s.flip = t[8].cast<double>();
  const std::string layout = t[9].cast<std::string>();
  if (layout == "HWC") s.layout = image::Layout::kHWC;
  else if (layout == "CHW") s.layout = image::Layout::kCHW;
  else throw std::invalid_argument("layout must be 'HWC' or 'CHW', got '" + layout + "'");
  s.max_pixels = t[10].cast<int64_t>();
  s.own_size = t[11].cast<bool>();
  s.check();
  return s;
}

std::shared_ptr<const image::FallbackDecoder> fallback_from(const py::object& f) {
  if (f.is_none()) return nullptr;
  return std::make_shared<PyFallback>(f);
}

std::vector<int64_t> int64s(const py::object& h) {
  const auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(h);
  if (!a || a.ndim() != 1) throw std::invalid_argument("expected a 1-D integer array");
  return std::vector<int64_t>(a.data(), a.data() + a.shape(0));
}

py::dict info_dict(const image::DecodeInfo& i) {
  py::dict d;
  d["format"] = i.format;
  d["size"] = py::make_tuple(i.width, i.height);
  d["scale"] = py::make_tuple(i.scale_eighths, 8);
  d["box"] = py::make_tuple(i.box_x, i.box_y, i.box_w, i.box_h);  // (left, top, width, height)
  d["flipped"] = i.flipped;
  d["decoded"] = py::make_tuple(i.decoded_x, i.decoded_y, i.decoded_w, i.decoded_h);
  return d;
}

}  // namespace

std::shared_ptr<const ValueDecoder> image_column_decoder(const py::tuple& spec, const py::object& fallback) {
  return std::make_shared<image::ImageColumnDecoder>(spec_from(spec), fallback_from(fallback));
}
image::ImageSpec image_spec_from(const py::tuple& spec) { return spec_from(spec); }
std::shared_ptr<const image::FallbackDecoder> image_fallback_from(const py::object& f) { return fallback_from(f); }

void set_image_error(const std::string& message) {
  PyErr_SetString(g_image_error ? g_image_error : PyExc_RuntimeError, message.c_str());
}

void register_image(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const image::ImageError& e) {
      set_image_error(e.what());
    }
  });
  m.def("_register_image_error", [](const py::object& cls) {
    if (!PyType_Check(cls.ptr()) || !PyObject_IsSubclass(cls.ptr(), PyExc_Exception))
      throw std::invalid_argument("image_error must be an exception class, got " + py::repr(cls).cast<std::string>());
    PyObject* old = g_image_error;
    g_image_error = py::object(cls).release().ptr();
    Py_XDECREF(old);
  }, py::arg("cls"), "Hands the bindings fl.ImageError (fastload/__init__.py calls it once).");

  m.def("image_backends", [] {
    py::dict d;
    const std::string jpeg = image::native_jpeg_library(), png = image::native_png_library();
    d["jpeg"] = jpeg.empty() ? py::none() : py::cast(jpeg);
    d["png"] = png.empty() ? py::none() : py::cast(png);
    return d;
  }, "{'jpeg': library or None, 'png': library or None}: this build's native image decoders");

  // paths: every path's bytes back to back; offsets: n + 1 int64; labels: n int64 or None;
  // spec: Image.native(); fallback: an object with header() and decode(), or None; lazy: None
  // (the paths are read), or a LazyFiles of the n files (object storage: the paths are their URLs).
  m.def("ImageFileSource", [](const py::bytes& paths, const py::object& offsets, const py::object& labels,
                              const py::tuple& spec, const py::object& fallback, const std::string& image_name,
                              const std::string& label_name, const py::object& lazy) {
    image::PathList list;
    list.bytes = std::string(paths);
    list.offsets = int64s(offsets);
    std::vector<int64_t> label_values = labels.is_none() ? std::vector<int64_t>{} : int64s(labels);
    auto files = lazy.is_none() ? nullptr : lazy.cast<std::shared_ptr<LazyFiles>>();
    auto source = std::make_shared<image::ImageFileSource>(std::move(list), std::move(label_values), spec_from(spec),
                                                           fallback_from(fallback), image_name, label_name,
                                                           std::move(files));
    return SourceHandle{std::move(source), py::make_tuple(fallback, lazy)};
  }, py::arg("paths"), py::arg("offsets"), py::arg("labels"), py::arg("spec"), py::arg("fallback"),
     py::arg("image_name") = "image", py::arg("label_name") = "label", py::arg("lazy") = py::none());

  m.def("_set_native_image_decoding", &image::set_native_decoding, py::arg("enabled"),
        "Test instrument: False makes this process decode as a build without libjpeg / libpng (JPEG and PNG "
        "through the fallback, image_backends() naming none); returns the previous setting.");

  m.def("_set_resample_simd", [](const std::string& limit) {
    static const char* names[] = {"scalar", "sse2", "avx2"};
    int want = -1;
    for (int i = 0; i < 3; ++i)
      if (limit == names[i]) want = i;
    if (want < 0) throw std::invalid_argument("simd must be 'scalar', 'sse2' or 'avx2', got '" + limit + "'");
    const auto before = image::set_resample_simd(static_cast<image::ResampleSimd>(want));
    return py::make_tuple(names[static_cast<int>(before)], names[static_cast<int>(image::resample_simd())]);
  }, py::arg("limit"), "Test instrument: caps the resize's vector instructions ('scalar', 'sse2', 'avx2': the best "
                       "the CPU has); returns (the previous cap, the form now used).");

  // The size and format of one encoded image, from its header.
  m.def("image_size", [](const py::bytes& data, const py::object& fallback) {
    const std::string bytes(data);
    const auto fb = fallback_from(fallback);
    image::ImageSize s = without_gil([&] {
      return image::thread_decoder().size_of(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), fb.get());
    });
    return py::make_tuple(s.format_name, s.width, s.height);
  }, py::arg("data"), py::arg("fallback"));

  // Test instrument: one image decoded as the collation threads decode sample `index` of
  // `epoch` with loader seed `seed`; returns (the output array, what the decoder did).
  m.def("_decode_image", [](const py::bytes& data, const py::tuple& spec_tuple, uint64_t seed, int64_t epoch,
                            int64_t index, const py::object& fallback) {
    const std::string bytes(data);
    const image::ImageSpec spec = spec_from(spec_tuple);
    const auto fb = fallback_from(fallback);
    std::vector<py::ssize_t> shape = spec.layout == image::Layout::kHWC
                                         ? std::vector<py::ssize_t>{spec.height, spec.width, 3}
                                         : std::vector<py::ssize_t>{3, spec.height, spec.width};
    py::array_t<uint8_t> out(shape);
    uint8_t* dst = out.mutable_data();
    image::DecodeInfo info;
    without_gil([&] {
      image::SampleRng rng(seed, epoch, index);
      image::thread_decoder().decode(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), spec, rng, fb.get(),
                                     dst, &info);
    });
    return py::make_tuple(out, info_dict(info));
  }, py::arg("data"), py::arg("spec"), py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("fallback"));

  // Test instrument: the first `n` raw words and uniforms of the decode stage's sample stream.
  m.def("_sample_stream", [](uint64_t seed, int64_t epoch, int64_t index, int n) {
    image::SampleRng a(seed, epoch, index), b(seed, epoch, index);
    std::vector<uint64_t> raw;
    std::vector<double> uniform;
    for (int i = 0; i < n; ++i) raw.push_back(a.next64()), uniform.push_back(b.uniform());
    return py::make_tuple(raw, uniform);
  }, py::arg("seed"), py::arg("epoch"), py::arg("index"), py::arg("n"));
}

}  // namespace fastload
