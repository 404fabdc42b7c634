// pybind11 module fastload._C: converts types between Python and the core, and releases the GIL
// around every wait. C++ exceptions map to Python by pybind11's one translator:
// std::invalid_argument -> ValueError, std::out_of_range -> IndexError, other -> RuntimeError.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bindings/dlpack_export.h"
#include "core/engine.h"
#include "core/sampler.h"

namespace py = pybind11;
using namespace fastload;

namespace {

// Ctrl-C must interrupt a wait: wait in slices and let Python check its signals in between.
constexpr std::chrono::milliseconds kSignalCheckInterval{50};

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

struct ColumnMeta {
  std::string name;
  DTypeCode dtype;
  std::vector<int64_t> row_shape;
};

// The Python-facing engine: the core engine plus what Python needs to keep alive (the source
// arrays, whose memory the threads read) and what it needs to build tensors.
class PyEngine {
 public:
  PyEngine(const py::list& columns, int64_t batch_size, int num_threads, int64_t prefetch,
           bool with_index, bool with_valid) {
    std::vector<ColumnSpec> specs;
    for (const py::handle& h : columns) {
      // (name, owner, address, rows, pitch, row_bytes, dtype_code, dtype_bits, row_shape)
      py::tuple t = py::reinterpret_borrow<py::tuple>(h);
      ColumnSpec s;
      s.name = t[0].cast<std::string>();
      keepalive_.push_back(py::reinterpret_borrow<py::object>(t[1]));
      s.base = reinterpret_cast<const std::byte*>(t[2].cast<uintptr_t>());
      s.rows = t[3].cast<int64_t>();
      s.pitch = t[4].cast<int64_t>();
      s.row_bytes = t[5].cast<int64_t>();
      specs.push_back(s);
      meta_.push_back({s.name, {t[6].cast<uint8_t>(), t[7].cast<uint8_t>()},
                       t[8].cast<std::vector<int64_t>>()});
    }
    EngineOptions o;
    o.num_threads = num_threads;
    o.prefetch = prefetch;
    o.with_index = with_index;
    o.with_valid = with_valid;
    o.batch_size = batch_size;
    engine_ = std::make_unique<Engine>(std::move(specs), o);
  }

  ~PyEngine() {
    // Joining threads must not hold the GIL; the arrays (keepalive_) die after, with the GIL.
    if (!engine_) return;
    py::gil_scoped_release release;
    engine_.reset();
  }

  void close() {
    py::gil_scoped_release release;
    engine_->close();
  }

  std::shared_ptr<Pipeline> start(const std::vector<SamplerConfig>& configs, int64_t epoch,
                                  int64_t start_position, int64_t fail_at_step) {
    std::vector<EpochPlan> plans;
    for (const SamplerConfig& c : configs) plans.emplace_back(c, epoch, start_position);
    py::gil_scoped_release release;
    return engine_->start(std::move(plans), fail_at_step);
  }

  // The next batch of one output as a list of DLPack capsules (columns, then index, then
  // valid), or None after the last batch.
  py::object next(Pipeline& pipeline, int output) {
    engine_->check_not_forked();
    Batch batch;
    for (;;) {
      NextStatus status;
      {
        py::gil_scoped_release release;
        status = pipeline.next(output, kSignalCheckInterval, &batch);
      }
      if (status == NextStatus::Ok) break;
      if (status == NextStatus::End) return py::none();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    const BatchLayout& L = engine_->layout();
    py::list parts;
    for (size_t c = 0; c < meta_.size(); ++c)
      parts.append(export_host_tensor(batch.buffer, L.column_offsets[c], meta_[c].dtype,
                                      batch.rows, meta_[c].row_shape));
    if (L.with_index)
      parts.append(export_host_tensor(batch.buffer, L.index_offset, {0, 64}, batch.rows, {}));
    if (L.with_valid)
      parts.append(export_host_tensor(batch.buffer, L.valid_offset, {6, 8}, batch.rows, {}));
    return std::move(parts);
  }

  py::dict stats() const {
    py::dict d;
    d["buffer_bytes"] = engine_->buffer_pool().buffer_bytes();
    d["allocations"] = engine_->buffer_pool().allocations();
    d["live_buffers"] = engine_->buffer_pool().live_buffers();
    d["num_threads"] = engine_->num_threads();
    return d;
  }

 private:
  std::vector<py::object> keepalive_;  // declared first: destroyed last, after the engine
  std::vector<ColumnMeta> meta_;
  std::unique_ptr<Engine> engine_;
};

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

  py::class_<Pipeline, std::shared_ptr<Pipeline>>(m, "Epoch")
      .def("num_batches", [](const Pipeline& p, int d) { return p.plan(d).num_batches(); })
      .def("position_after",
           [](const Pipeline& p, int d, int64_t k) { return p.plan(d).position_after(k); })
      .def("cancel", &Pipeline::cancel, py::call_guard<py::gil_scoped_release>());

  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const py::list&, int64_t, int, int64_t, bool, bool>(), py::arg("columns"),
           py::arg("batch_size"), py::arg("num_threads"), py::arg("prefetch"),
           py::arg("with_index"), py::arg("with_valid"))
      .def("start", &PyEngine::start, py::arg("samplers"), py::arg("epoch"),
           py::arg("start_position"), py::arg("fail_at_step") = -1)
      .def("next", &PyEngine::next, py::arg("epoch"), py::arg("output"))
      .def("close", &PyEngine::close)
      .def("stats", &PyEngine::stats);
}
