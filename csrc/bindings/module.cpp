// pybind11 module fastload._C: converts types between Python and the core, and releases the GIL
// around every wait. C++ exceptions map to Python by pybind11's one translator:
// std::invalid_argument -> ValueError, std::out_of_range -> IndexError, other -> RuntimeError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bindings/loader_binding.h"
#include "bindings/without_gil.h"
#include "core/checksum.h"
#include "core/engine.h"
#include "core/sampler.h"

namespace py = pybind11;
using namespace fastload;

namespace {

SamplerConfig make_config(int64_t num_samples, int64_t batch_size, int64_t world_size,
                          int64_t rank, uint64_t seed, bool shuffle, const std::string& order,
                          const std::string& even, bool drop_last, int64_t block_size) {
  SamplerConfig c;
  c.num_samples = num_samples;
  c.batch_size = batch_size;
  c.world_size = world_size;
  c.rank = rank;
  c.seed = seed;
  c.shuffle = shuffle;
  c.order = parse_order(order);
  c.even = parse_even(even);
  c.drop_last = drop_last;
  c.block_size = block_size;
  c.validate();
  return c;
}

// All of one rank's sample ids for an epoch, without building batches.
py::array_t<int64_t> plan_ids(const SamplerConfig& c, int64_t epoch, int64_t start) {
  EpochPlan plan(c, epoch, start);
  int64_t total = 0;
  for (int64_t s = 0; s < plan.num_batches(); ++s) total += plan.batch(s).count;
  py::array_t<int64_t> out(total);
  int64_t* dst = out.mutable_data();
  {
    py::gil_scoped_release release;
    int64_t done = 0;
    for (int64_t s = 0; s < plan.num_batches(); ++s) {
      const BatchSpan span = plan.batch(s);
      plan.fill_ids(span, dst + done, nullptr);
      done += span.count;
    }
  }
  return out;
}

py::tuple batch_ids(const SamplerConfig& c, int64_t epoch, int64_t start, int64_t step) {
  EpochPlan plan(c, epoch, start);
  const BatchSpan span = plan.batch(step);
  py::array_t<int64_t> ids(span.count);
  py::array_t<bool> valid(span.count);
  plan.fill_ids(span, ids.mutable_data(), valid.mutable_data());
  return py::make_tuple(ids, valid);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "fastload native core: sampler, collation threads, buffers";

  py::class_<SamplerConfig>(m, "Sampler")
      .def(py::init(&make_config), py::arg("num_samples"), py::arg("batch_size"),
           py::arg("world_size"), py::arg("rank"), py::arg("seed"), py::arg("shuffle"),
           py::arg("order"), py::arg("even"), py::arg("drop_last"), py::arg("block_size") = 4096)
      .def_readonly("num_samples", &SamplerConfig::num_samples)
      .def_readonly("batch_size", &SamplerConfig::batch_size)
      .def_readonly("world_size", &SamplerConfig::world_size)
      .def_readonly("rank", &SamplerConfig::rank)
      .def("num_batches",
           [](const SamplerConfig& c, int64_t epoch, int64_t start) {
             return EpochPlan(c, epoch, start).num_batches();
           },
           py::arg("epoch"), py::arg("start") = 0)
      .def("end_position",
           [](const SamplerConfig& c, int64_t epoch, int64_t start) {
             return EpochPlan(c, epoch, start).end_position();
           },
           py::arg("epoch"), py::arg("start") = 0)
      .def("position_after",
           [](const SamplerConfig& c, int64_t epoch, int64_t start, int64_t k) {
             return EpochPlan(c, epoch, start).position_after(k);
           },
           py::arg("epoch"), py::arg("start"), py::arg("batches_done"))
      .def("batch_ids", &batch_ids, py::arg("epoch"), py::arg("start"), py::arg("step"))
      .def("plan", &plan_ids, py::arg("epoch"), py::arg("start") = 0)
      .def("permutation",
           [](const SamplerConfig& c, int64_t epoch, int64_t first, int64_t count) {
             // The epoch's order itself (before rank split and padding), for tests.
             if (first < 0 || count < 0 || first + count > c.num_samples)
               throw std::out_of_range("positions out of range");
             Ordering o(c, epoch);
             py::array_t<int64_t> out(count);
             int64_t* dst = out.mutable_data();
             py::gil_scoped_release release;
             o.fill(first, count, dst);
             return out;
           },
           py::arg("epoch"), py::arg("first"), py::arg("count"));

  bind_loader(m);

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
