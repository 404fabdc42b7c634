// fastload._C.MixSchedule (the mixture schedule, core/mix_schedule.h) and StreamSampler (one
// replica's step-based stream, core/stream_plan.h) as Python calls them: the Loader starts runs
// from StreamSamplers; plan(), stats and tests read ids, counts and positions from them.
#include "bindings/stream.h"

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bindings/register.h"
#include "core/mix_schedule.h"

namespace py = pybind11;

namespace fastload {

namespace {

StreamSampler make_stream(const std::vector<int64_t>& lengths, const std::vector<int64_t>& offsets,
                          const std::vector<std::vector<int64_t>>& shard_rows, uint64_t seed, bool shuffle,
                          const std::string& order, int64_t block_size, int64_t window_shards, int64_t batch_size,
                          int64_t replicas, int64_t rank, std::vector<int64_t> base, std::vector<uint64_t> shares,
                          int64_t origin, std::vector<int64_t> base_positions) {
  const size_t n = lengths.size();
  if (offsets.size() != n || shard_rows.size() != n)
    throw std::invalid_argument("a stream needs one offset and one shard list per source");
  auto c = std::make_shared<StreamConfig>();
  for (size_t j = 0; j < n; ++j) {
    StreamSource s;
    s.order.num_samples = lengths[j];
    s.order.seed = stream_source_seed(seed, static_cast<int>(j), static_cast<int>(n));
    s.order.shuffle = shuffle;
    s.order.order = parse_order(order);
    s.order.block_size = block_size;
    s.order.shard_rows = shard_rows[j];
    s.order.window_shards = window_shards;
    s.offset = offsets[j];
    c->sources.push_back(std::move(s));
  }
  c->schedule = MixSchedule(batch_size * replicas, std::move(base), std::move(shares), mix_phase(seed));
  c->origin = origin;
  c->base_positions = std::move(base_positions);
  c->batch_size = batch_size;
  c->replicas = replicas;
  c->rank = rank;
  c->seed = seed;
  c->validate();
  return StreamSampler{std::move(c)};
}

// This replica's ids of global steps [first, end), refused at once (MemoryError) if they would
// not fit in memory_limit bytes; filled with the GIL released, a Ctrl-C check between slices.
py::array_t<int64_t> stream_ids(const StreamSampler& s, int64_t first, int64_t end, int64_t memory_limit) {
  const StreamPlan plan(s.config, first, end, 0);
  const int64_t b = s.config->batch_size, steps = plan.num_batches();
  if (steps > memory_limit / static_cast<int64_t>(sizeof(int64_t)) / b) {
    const std::string msg = "the plan of steps [" + std::to_string(first) + ", " + std::to_string(end) + ") holds " +
                            std::to_string(steps) + " x " + std::to_string(b) + " sample ids (8 bytes each), more " +
                            "than this machine's memory (" + std::to_string(memory_limit) + " bytes)";
    PyErr_SetString(PyExc_MemoryError, msg.c_str());
    throw py::error_already_set();
  }
  py::array_t<int64_t> out(steps * b);
  int64_t* dst = out.mutable_data();
  constexpr int64_t kSlice = int64_t{1} << 20;  // ids per slice: a few ms
  // One cursor for the walk: each step starts from the last one's state instead of afresh.
  const std::unique_ptr<PlanCursor> cursor = plan.cursor();
  int64_t step = 0;
  while (step < steps) {
    {
      py::gil_scoped_release release;
      for (int64_t budget = kSlice; step < steps && budget > 0; ++step, budget -= b) {
        BatchRows rows;
        rows.ids = dst + step * b;
        rows.cursor = cursor.get();
        plan.fill(step, rows);
      }
    }
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
  return out;
}

}  // namespace

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

  py::class_<StreamSampler>(m, "StreamSampler", "One replica's view of a step-based stream (steps= or a Mix).")
      .def(py::init(&make_stream), py::arg("lengths"), py::arg("offsets"), py::arg("shard_rows"), py::arg("seed"),
           py::arg("shuffle"), py::arg("order"), py::arg("block_size"), py::arg("window_shards"),
           py::arg("batch_size"), py::arg("replicas"), py::arg("rank"), py::arg("base"), py::arg("shares"),
           py::arg("origin"), py::arg("base_positions"))
      .def_property_readonly("num_sources", [](const StreamSampler& s) { return s.config->sources.size(); })
      .def_property_readonly("origin", [](const StreamSampler& s) { return s.config->origin; })
      .def_property_readonly("phase", [](const StreamSampler& s) { return s.config->schedule.phase(); })
      .def_property_readonly("seeds",
                             [](const StreamSampler& s) {
                               std::vector<uint64_t> out;
                               for (const StreamSource& src : s.config->sources) out.push_back(src.order.seed);
                               return out;
                             })
      .def("plan", &stream_ids, py::arg("first_step"), py::arg("end_step"),
           py::arg("memory_limit") = std::numeric_limits<int64_t>::max(),
           "this replica's sample ids of global steps [first_step, end_step); MemoryError past memory_limit bytes")
      .def("batch",
           [](const StreamSampler& s, int64_t step) {
             // One global step's rows of this replica: (ids, source of each row).
             const StreamPlan plan(s.config, step, step + 1, 0);
             const int64_t b = s.config->batch_size;
             py::array_t<int64_t> ids(b), sources(b);
             BatchRows rows;
             rows.ids = ids.mutable_data();
             rows.sources = sources.mutable_data();
             plan.fill(0, rows);
             return py::make_tuple(ids, sources);
           },
           py::arg("step"))
      .def("positions",
           [](const StreamSampler& s, int64_t step) {
             const StreamPlan plan(s.config, step, step, 0);
             std::vector<int64_t> out(s.config->sources.size());
             plan.positions(step, out.data());
             return out;
           },
           py::arg("step"), "every source's stream position at the start of a global step")
      .def("counts",
           [](const StreamSampler& s, int64_t step) {
             const StreamPlan plan(s.config, step, step, 0);
             std::vector<int64_t> out(s.config->sources.size());
             plan.step_counts(step, out.data());
             return out;
           },
           py::arg("step"), "samples of each source in a global step (all replicas)")
      .def("rank_counts",
           [](const StreamSampler& s, int64_t first, int64_t end) {
             // This replica's rows per source over steps [first, end): O(steps * sources).
             const StreamPlan plan(s.config, first, end, 0);
             std::vector<int64_t> out(s.config->sources.size(), 0);
             py::gil_scoped_release release;
             for (int64_t k = 0; k < plan.num_batches(); ++k) plan.add_source_rows(k, out.data());
             return out;
           },
           py::arg("first_step"), py::arg("end_step"));
}

}  // namespace fastload
