// fastload._C.Checksum64: the dataset writer's and verify()'s shard checksum (core/checksum.h).
#include <pybind11/pybind11.h>

#include <cstdio>
#include <string>

#include "bindings/register.h"
#include "bindings/without_gil.h"
#include "core/checksum.h"

namespace py = pybind11;

namespace fastload {

void register_checksum(py::module_& m) {
  // The dataset writer's and verify()'s shard checksum; update() reads a contiguous buffer with
  // the GIL released.
  py::class_<Checksum64>(m, "Checksum64")
      .def(py::init<>())
      .def("update",
           [](Checksum64& c, const py::buffer& b) {
             const py::buffer_info info = b.request();
             if (info.ndim > 1 && info.strides.back() != info.itemsize)
               throw std::invalid_argument("Checksum64.update needs a contiguous buffer");
             const size_t bytes = static_cast<size_t>(info.size * info.itemsize);
             without_gil([&] { c.update(info.ptr, bytes); });
           })
      .def("hexdigest", [](const Checksum64& c) {
        char out[17];
        std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(c.digest()));
        return std::string(out);
      });

}

}  // namespace fastload
