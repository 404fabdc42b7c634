// fastload._C.MixSchedule: the mixture schedule (core/mix_schedule.h) as Python calls it (tests,
// plan(), stats), and mix_phase (the schedule's phase for a seed).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "bindings/register.h"
#include "core/mix_schedule.h"

namespace py = pybind11;

namespace fastload {

void register_stream(py::module_& m) {
  m.attr("MIX_SCALE") = MixSchedule::kScale;
  m.attr("MIX_ROTATION") = MixSchedule::kRotation;
  m.def("mix_phase", &mix_phase, py::arg("seed"));
  py::class_<MixSchedule>(m, "MixSchedule", "Per-step sample counts of each source of a mixture.")
      .def(py::init<int64_t, std::vector<int64_t>, std::vector<uint64_t>, uint64_t>(), py::arg("global_batch"),
           py::arg("base"), py::arg("shares"), py::arg("phase"))
      .def_property_readonly("num_sources", &MixSchedule::num_sources)
      .def_property_readonly("global_batch", &MixSchedule::global_batch)
      .def_property_readonly("phase", &MixSchedule::phase)
      .def("counts",
           [](const MixSchedule& s, int64_t step) {
             std::vector<int64_t> d(static_cast<size_t>(s.num_sources()));
             s.counts(step, d.data());
             return d;
           },
           py::arg("step"), "samples of each source in this step")
      .def("extras_before", &MixSchedule::extras_before, py::arg("source"), py::arg("steps"))
      .def("taken", &MixSchedule::taken, py::arg("source"), py::arg("steps"),
           "samples of this source in steps [0, steps)");
}

}  // namespace fastload
