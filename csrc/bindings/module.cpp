// pybind11 module fastload._C: converts types between Python and the native core, and releases
// the GIL around every wait. One file per concept (see register.h). C++ exceptions map to Python
// by pybind11's translator: std::invalid_argument -> ValueError, std::out_of_range -> IndexError,
// other -> RuntimeError; a collation failure keeps its original type (loader.cpp).
#include <pybind11/pybind11.h>

#include "bindings/file_mapping.h"
#include "bindings/register.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastload native core: sampler, sources, collation threads, buffers, CUDA transfers";
  // From CMake's project version, itself from python/fastload/_version.py: a module built from
  // other sources than the Python package beside it shows here.
  m.attr("__version__") = FASTLOAD_VERSION;
  fastload::register_sampler(m);
  fastload::register_stream(m);
  fastload::register_sources(m);
  fastload::register_python_source(m);
  fastload::register_loader(m);
  fastload::register_arrow(m);
  fastload::register_checksum(m);
  fastload::register_testing(m);
  fastload::register_file_mapping(m);
  fastload::register_hooks(m);
  fastload::register_image(m);
  fastload::register_pack(m);
  fastload::register_tar(m);
}
