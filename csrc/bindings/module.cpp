// pybind11 module fastload._C: converts types between Python and the core, and releases the GIL
// around every wait. C++ exceptions map to Python by pybind11's one translator:
// std::invalid_argument -> ValueError, std::out_of_range -> IndexError, other -> RuntimeError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bindings/file_mapping.h"
#include "bindings/loader_binding.h"
#include "bindings/run_stats.h"
#include "bindings/without_gil.h"
#include "core/checksum.h"
#include "core/cpu_cache.h"
#include "core/engine.h"
#include "core/gather.h"
#include "core/sampler.h"

namespace py = pybind11;
using namespace fastload;

namespace {

SamplerConfig make_config(int64_t num_samples, int64_t batch_size, int64_t world_size,
                          int64_t rank, uint64_t seed, bool shuffle, const std::string& order,
                          const std::string& even, bool drop_last, int64_t block_size,
                          const std::string& partition, std::vector<int64_t> shard_rows,
                          int64_t window_shards) {
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
  c.partition = parse_partition(partition);
  c.shard_rows = std::move(shard_rows);
  c.window_shards = window_shards;
  c.validate();
  return c;
}

// Bytes this process can ever hold: physical memory, or a smaller cgroup (v2 or v1) limit.
int64_t memory_limit_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t limit = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page
                                        : std::numeric_limits<int64_t>::max();
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream f(path);
    long long v = 0;
    if (f >> v && v > 0 && v < limit) limit = v;  // "max" fails to parse: no limit there
  }
  return limit;
}

// All of one rank's sample ids for an epoch, without building batches. A plan may be enormous
// (2^62 samples): its length is known without walking it, so one that cannot be held is refused
// at once; the rest is computed with the GIL released, in slices with a Ctrl-C check between.
py::array_t<int64_t> plan_ids(const SamplerConfig& c, int64_t epoch, int64_t start) {
  EpochPlan plan(c, epoch, start);
  const int64_t batches = plan.num_batches();
  // Every batch but the last holds batch_size ids.
  const int64_t total =
      batches == 0 ? 0 : (batches - 1) * c.batch_size + plan.batch(batches - 1).count;
  const int64_t limit = memory_limit_bytes();
  if (total > limit / static_cast<int64_t>(sizeof(int64_t))) {
    const std::string msg = "plan of epoch " + std::to_string(epoch) + " holds " +
                            std::to_string(total) + " sample ids (" + std::to_string(total) +
                            " x 8 bytes), more than this machine's memory (" +
                            std::to_string(limit) + " bytes)";
    PyErr_SetString(PyExc_MemoryError, msg.c_str());
    throw py::error_already_set();
  }
  py::array_t<int64_t> out(total);
  int64_t* dst = out.mutable_data();
  constexpr int64_t kSlice = int64_t{1} << 20;  // ids per slice: a few ms
  int64_t done = 0, step = 0, in_batch = 0;
  while (step < batches) {
    {
      py::gil_scoped_release release;
      for (int64_t budget = kSlice; step < batches && budget > 0;) {
        const BatchSpan span = plan.batch(step);
        const int64_t n = std::min(budget, span.count - in_batch);
        plan.fill_ids({span.first + in_batch, n}, dst + done, nullptr);
        done += n;
        budget -= n;
        in_batch += n;
        if (in_batch == span.count) {
          ++step;
          in_batch = 0;
        }
      }
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
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
  register_file_mapping(m);

  py::class_<SamplerConfig>(m, "Sampler")
      .def(py::init(&make_config), py::arg("num_samples"), py::arg("batch_size"),
           py::arg("world_size"), py::arg("rank"), py::arg("seed"), py::arg("shuffle"),
           py::arg("order"), py::arg("even"), py::arg("drop_last"), py::arg("block_size") = 4096,
           py::arg("partition") = "samples", py::arg("shard_rows") = std::vector<int64_t>{},
           py::arg("window_shards") = 4)
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
             // The epoch's order itself (before rank split and padding), for tests; with
             // partition="shards", the order of this rank's own shards.
             Ordering o(c, epoch);
             if (first < 0 || count < 0 || first + count > o.size())
               throw std::out_of_range("positions out of range");
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

  // Where batch copies switch to streaming stores (see core/gather.h). Private: tests lower it
  // to run that copy on small arrays; the benchmark reports it.
  m.def("_streaming_min_part_bytes", &streaming_min_part_bytes);
  m.def("_set_streaming_min_part_bytes", &set_streaming_min_part_bytes, py::arg("bytes"));
  m.def("_last_level_cache_bytes", &last_level_cache_bytes);

  // The stall hint's choice of knob from stage busy shares (see run_stats.h). Private: tests check
  // every branch without having to make a real loop stall for each reason.
  m.def("_stall_advice", &stall_advice, py::arg("collating"), py::arg("copying"), py::arg("num_threads"),
        py::arg("streams"), py::arg("prefetch"));
}
