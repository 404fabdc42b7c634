// fastload._C.Sampler: the sampling contract (core/sampler.h) as Python calls it, the epoch plans
// of plan() and of tests, and the one spelling of each enum's values.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "bindings/register.h"
#include "core/sampler.h"

namespace py = pybind11;

namespace fastload {

namespace {

SamplerConfig make_config(int64_t num_samples, int64_t batch_size, int64_t world_size,
                          int64_t rank, uint64_t seed, bool shuffle, const std::string& order,
                          const std::string& even, bool drop_last, int64_t block_size,
                          const std::string& partition, std::vector<int64_t> shard_rows,
                          int64_t window_shards) {
  // Parsed in this order, so that of two bad values the order's is the one reported.
  const Order parsed_order = parse_order(order);
  const Even parsed_even = parse_even(even);
  SamplerConfig c(num_samples, batch_size, world_size, rank, seed, shuffle, parsed_order, parsed_even, drop_last,
                  block_size);
  c.partition = parse_partition(partition);
  c.shard_rows = std::move(shard_rows);
  c.window_shards = window_shards;
  c.validate();
  return c;
}

// All of one rank's sample ids for an epoch, without building batches. A plan may be enormous
// (2^62 samples): its length is known without walking it, so one that cannot be held is refused
// at once; the rest is computed with the GIL released, in slices with a Ctrl-C check between.
py::array_t<int64_t> plan_ids(const SamplerConfig& c, int64_t epoch, int64_t start, int64_t limit) {
  EpochPlan plan(c, epoch, start);
  const int64_t batches = plan.num_batches();
  // Every batch but the last holds batch_size ids.
  const int64_t total =
      batches == 0 ? 0 : (batches - 1) * c.batch_size + plan.batch(batches - 1).count;
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

void register_sampler(py::module_& m) {
  m.attr("ORDERS") = py::make_tuple(kOrderNames[0], kOrderNames[1]);
  m.attr("MAX_GLOBAL_BATCH") = kMaxGlobalBatch;
  m.attr("EVEN_POLICIES") = py::make_tuple(kEvenNames[0], kEvenNames[1], kEvenNames[2]);
  m.attr("PARTITIONS") = py::make_tuple(kPartitionNames[0], kPartitionNames[1]);
  m.attr("BLOCK_SIZE") = kBlockSize;
  m.attr("WINDOW_SHARDS") = kWindowShards;
  m.def("block_window_shards",
        [](const std::vector<int64_t>& shard_rows) { return max_window_shards(shard_rows, kWindowShards, kBlockSize); },
        py::arg("shard_rows"),
        "the most shards one window of order=\"block\" can hold over these shards, in any epoch and on any rank");

  py::class_<SamplerConfig>(m, "Sampler")
      .def(py::init(&make_config), py::arg("num_samples"), py::arg("batch_size"),
           py::arg("world_size"), py::arg("rank"), py::arg("seed"), py::arg("shuffle"),
           py::arg("order"), py::arg("even"), py::arg("drop_last"), py::arg("block_size") = kBlockSize,
           py::arg("partition") = "samples", py::arg("shard_rows") = std::vector<int64_t>{},
           py::arg("window_shards") = kWindowShards)
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
      .def("plan", &plan_ids, py::arg("epoch"), py::arg("start") = 0,
           py::arg("memory_limit") = std::numeric_limits<int64_t>::max(),
           "all of one rank's sample ids for an epoch; MemoryError if they would exceed memory_limit bytes")
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

}

}  // namespace fastload
