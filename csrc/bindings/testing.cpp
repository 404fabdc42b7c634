// Test instruments of fastload._C (private names); see testing.h.
#include "bindings/testing.h"

#include <pybind11/stl.h>

#include <stdexcept>

#include "bindings/register.h"
#include "core/cpu_cache.h"
#include "core/gather.h"
#include "cuda/deferred_free.h"
#include "runtime/run_stats.h"

namespace py = pybind11;

namespace fastload {

cuda::Misuse parse_misuse(const std::string& s) {
  if (s.empty() || s == "none") return cuda::Misuse::None;
  if (s == "skip_consumer_wait") return cuda::Misuse::SkipConsumerWait;
  if (s == "skip_release_wait") return cuda::Misuse::SkipReleaseWait;
  if (s == "early_host_release") return cuda::Misuse::EarlyHostRelease;
  if (s == "skip_host_register") return cuda::Misuse::SkipHostRegister;
  throw std::invalid_argument("unknown misuse " + s);
}

void register_testing(py::module_& m) {
  py::class_<RawDevicePart>(m, "RawDevicePart")
      .def_property_readonly("ptr", [](const RawDevicePart& p) { return static_cast<uintptr_t>(p.part->buffer->ptr()); })
      .def_property_readonly("device", [](const RawDevicePart& p) { return p.part->buffer->device(); })
      .def_property_readonly("nbytes", [](const RawDevicePart& p) { return p.bytes; })
      .def_property_readonly("shape", [](const RawDevicePart& p) { return p.shape; })
      .def_property_readonly("dtype_code", [](const RawDevicePart& p) { return p.dtype.code; })
      .def_property_readonly("dtype_bits", [](const RawDevicePart& p) { return p.dtype.bits; })
      .def("read", &RawDevicePart::read)
      .def("touch", &RawDevicePart::touch, py::arg("stream") = 0);

  // Where batch copies switch to streaming stores (see core/gather.h). Tests lower it to run that
  // copy on small arrays; the benchmark reports it.
  m.def("_streaming_min_part_bytes", &streaming_min_part_bytes);
  m.def("_set_streaming_min_part_bytes", &set_streaming_min_part_bytes, py::arg("bytes"));
  m.def("_last_level_cache_bytes", &last_level_cache_bytes);

  // Waits until the frees fastload deferred to its own thread have run (tests that count memory).
  m.def("_flush_deferred_frees", [] { without_gil([] { cuda::flush_deferred_frees(); }); });

}

}  // namespace fastload
