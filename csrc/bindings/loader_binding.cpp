// fastload._C.Engine, Epoch and Iterator; see loader_binding.h. Every wait releases the GIL and
// wakes every 50 ms to let Python check for Ctrl-C.
#include "bindings/loader_binding.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bindings/device_part.h"
#include "bindings/dlpack_export.h"
#include "bindings/exit_parking.h"
#include "bindings/run_stats.h"
#include "bindings/without_gil.h"
#include "core/engine.h"
#include "cuda/driver.h"
#include "cuda/transfer_engine.h"

namespace py = pybind11;

namespace fastload {

namespace {

constexpr std::chrono::milliseconds kSignalCheckInterval{50};

struct ColumnMeta {
  std::string name;
  DTypeCode dtype;
  std::vector<int64_t> row_shape;
};

cuda::Misuse parse_misuse(const std::string& s) {
  if (s.empty() || s == "none") return cuda::Misuse::None;
  if (s == "skip_consumer_wait") return cuda::Misuse::SkipConsumerWait;
  if (s == "skip_release_wait") return cuda::Misuse::SkipReleaseWait;
  if (s == "early_host_release") return cuda::Misuse::EarlyHostRelease;
  throw std::invalid_argument("unknown misuse " + s);
}

// One started epoch as Python holds it: the pipeline, and the transfer engine of each output
// that feeds a GPU (null for CPU outputs).
struct Run {
  std::shared_ptr<Pipeline> pipeline;
  std::vector<std::shared_ptr<cuda::TransferEngine>> transfers;
  int64_t epoch = 0;
  std::vector<int64_t> handed;  // batches each output handed to the user; changed with the GIL held
  bool superseded = false;      // a newer iter()/split(), load_state_dict() or close() ended it
  RunStats stats;               // all outputs together
};

// A wait ended because the epoch was cancelled.
struct Cancelled {};

// A device part handed to a test instead of a torch tensor (the stand-in driver's "device"
// memory is host memory torch cannot import as CUDA): read() copies it back through the driver,
// on the stream the batch was handed out on.
struct RawDevicePart {
  std::shared_ptr<UserDevicePart> part;
  size_t bytes;
  DTypeCode dtype;
  std::vector<int64_t> shape;

  py::bytes read() const {
    std::string out(bytes, '\0');
    without_gil([&] {
      const auto& f = cuda::driver();
      cuda::ScopedContext scope(*part->buffer->release_event().context());
      if (bytes) {
        cuda::check(f.cuMemcpyDtoHAsync(out.data(), part->buffer->ptr(), bytes, part->stream), "cuMemcpyDtoHAsync");
        cuda::check(f.cuStreamSynchronize(part->stream), "cuStreamSynchronize");
      }
    });
    return py::bytes(out);
  }

  // Queues a read of the part on its stream without waiting, as a kernel of the training step
  // would. The destination is page-locked scratch memory (a pageable one would make the copy
  // synchronous) that lives until exit: the read may still be queued when the part dies.
  void touch() const {
    static std::mutex mutex;
    static void* scratch = nullptr;
    static size_t scratch_bytes = 0;
    without_gil([&] {
      cuda::ScopedContext scope(*part->buffer->release_event().context());
      const auto& f = cuda::driver();
      void* dst;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (scratch_bytes < bytes) {  // the old one is leaked: a queued read may still write it
          cuda::check(f.cuMemHostAlloc(&scratch, bytes, cuda::api::CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
          scratch_bytes = bytes;
        }
        dst = scratch;
      }
      if (bytes) cuda::check(f.cuMemcpyDtoHAsync(dst, part->buffer->ptr(), bytes, part->stream), "cuMemcpyDtoHAsync");
    });
  }
};

// The Python-facing engine: the core engine plus what Python needs to keep alive (the source
// arrays, whose memory the threads read), what it needs to build tensors, and one transfer
// engine per GPU output (kept across epochs: streams and device buffers are made once).
class PyEngine {
 public:
  PyEngine(const py::list& columns, int64_t batch_size, int num_threads, int64_t prefetch,
           bool with_index, bool with_valid, int streams)
      : prefetch_(prefetch), streams_(streams) {
    std::vector<ColumnSpec> specs;
    for (const py::handle& h : columns) {
      // (name, owner, address, rows, pitch, row_bytes, dtype_code, dtype_bits, row_shape
      //  [, shards, ragged]); shards: ((address, rows, pitch, offsets_address, items), ...) for
      // a column of several arrays (the owner keeps them all alive); ragged: () or
      // (item_bytes, pad element bytes), row_bytes then being the padded slot.
      py::tuple t = py::reinterpret_borrow<py::tuple>(h);
      ColumnSpec s;
      s.name = t[0].cast<std::string>();
      keepalive_.push_back(py::reinterpret_borrow<py::object>(t[1]));
      s.base = reinterpret_cast<const std::byte*>(t[2].cast<uintptr_t>());
      s.rows = t[3].cast<int64_t>();
      s.pitch = t[4].cast<int64_t>();
      s.row_bytes = t[5].cast<int64_t>();
      if (t.size() > 10 && py::len(t[10]) > 0) {
        py::tuple ragged = py::reinterpret_borrow<py::tuple>(t[10]);
        s.ragged = true;
        s.item_bytes = ragged[0].cast<int64_t>();
        const std::string pad = ragged[1].cast<std::string>();
        s.pad.resize(pad.size());
        std::memcpy(s.pad.data(), pad.data(), pad.size());
      }
      if (t.size() > 9 && (py::len(t[9]) > 0 || s.ragged)) {
        std::vector<Shard> shards;
        for (const py::handle& sh : t[9]) {
          py::tuple u = py::reinterpret_borrow<py::tuple>(sh);
          shards.push_back({reinterpret_cast<const std::byte*>(u[0].cast<uintptr_t>()), u[1].cast<int64_t>(),
                            u[2].cast<int64_t>(), reinterpret_cast<const int64_t*>(u[3].cast<uintptr_t>()),
                            u[4].cast<int64_t>()});
        }
        set_shards(s, std::move(shards));
      }
      specs.push_back(s);
      meta_.push_back({s.name, {t[6].cast<uint8_t>(), t[7].cast<uint8_t>()},
                       t[8].cast<std::vector<int64_t>>()});
      if (s.ragged) meta_.push_back({s.name + "_lengths", {0, 64}, {}});
    }
    if (streams <= 0) throw std::invalid_argument("streams must be positive, got " + std::to_string(streams));
    EngineOptions o;
    o.num_threads = num_threads;
    o.prefetch = prefetch;
    o.with_index = with_index;
    o.with_valid = with_valid;
    o.batch_size = batch_size;
    engine_ = std::make_unique<Engine>(std::move(specs), o);
    layout_ = engine_->layout_ptr();  // outlives a closed engine: batches still need it
    part_meta_ = meta_;
    if (with_index) part_meta_.push_back({"index", {0, 64}, {}});
    if (with_valid) part_meta_.push_back({"valid", {6, 8}, {}});
  }

  ~PyEngine() {
    // Joining threads must not hold the GIL; the arrays (keepalive_) die after, with the GIL.
    if (!engine_) return;
    without_gil([&] {
      engine_->cancel_current();
      stop_transfers();
      transfers_.clear();
      engine_.reset();
    });
  }

  void close() {
    without_gil([&] {
      engine_->close();  // cancels the epoch: transfer threads see Cancelled and finish
      for (auto& t : transfers_)
        if (t) t->close();  // drains the streams; device buffers users hold stay valid
      transfers_.clear();
    });
  }

  // devices[d]: -1 for a CPU output, else the CUDA device index of output d.
  std::shared_ptr<Run> start(const std::vector<SamplerConfig>& configs, int64_t epoch, int64_t start_position,
                             int64_t fail_at_step, const std::vector<int>& devices) {
    if (devices.size() != configs.size()) throw std::invalid_argument("one device per sampler is needed");
    std::vector<OutputSpec> outputs;
    for (size_t d = 0; d < configs.size(); ++d)
      outputs.push_back({EpochPlan(configs[d], epoch, start_position), devices[d] >= 0});
    auto run = std::make_shared<Run>();
    run->epoch = epoch;
    run->handed.assign(devices.size(), 0);
    without_gil([&] { start_locked(*run, std::move(outputs), fail_at_step, devices); });
    return run;
  }

  void start_locked(Run& run, std::vector<OutputSpec> outputs, int64_t fail_at_step, const std::vector<int>& devices) {
    engine_->check_not_forked();
    // The old epoch first: its transfer threads then see Cancelled at once instead of at their
    // next timeout, and stop before the pipeline they feed from is replaced.
    engine_->cancel_current();
    stop_transfers();
    run.transfers.resize(devices.size());
    std::shared_ptr<HostAllocator> host_memory;
    int64_t extra = 0;
    for (size_t d = 0; d < devices.size(); ++d) {
      if (devices[d] < 0) continue;
      if (transfers_.size() <= d) transfers_.resize(d + 1);
      if (!transfers_[d] || transfers_[d]->device() != devices[d])
        transfers_[d] = std::make_shared<cuda::TransferEngine>(devices[d], streams_, engine_->layout_ptr(),
                                                               prefetch_, misuse_);
      run.transfers[d] = transfers_[d];
      extra += transfers_[d]->in_flight_limit();
      if (!pinned_) pinned_ = std::make_shared<cuda::PinnedAllocator>(transfers_[d]->context());
      host_memory = pinned_;
    }
    run.pipeline = engine_->start(std::move(outputs), fail_at_step, host_memory, extra);
    for (size_t d = 0; d < devices.size(); ++d)
      if (run.transfers[d]) run.transfers[d]->start(run.pipeline, static_cast<int>(d));
  }

  // The next batch of one output as a list of DLPack capsules (columns, then index, then
  // valid), or None after the last batch; throws Cancelled. For a GPU output, `stream` is the
  // consumer's stream (torch.cuda.current_stream().cuda_stream), made to wait on the batch's
  // copy; with raw=True the parts come back as RawDevicePart (tests with the stand-in driver).
  // The next batch's parts (None at the end); `ready`, if given, gets the batches that were
  // ready when the call began.
  py::object take(const Run& run, int output, uintptr_t stream, bool raw, int64_t* rows, int64_t* ready) {
    engine_->check_not_forked();
    const auto& transfer = run.transfers.at(static_cast<size_t>(output));
    if (transfer) {
      if (ready) *ready = transfer->ready_count();
      return next_device(run, *transfer, output, reinterpret_cast<cuda::api::CUstream>(stream), raw, rows);
    }
    Batch batch;
    int64_t* ready_at_entry = ready;  // counted by the first attempt only, under its lock
    const bool more = wait(run, [&](std::chrono::milliseconds timeout) {
      const NextStatus status = run.pipeline->next(output, timeout, &batch, ready_at_entry);
      ready_at_entry = nullptr;
      return status;
    });
    if (!more) return py::none();
    *rows = batch.rows;
    py::list parts;
    for (size_t p = 0; p < part_meta_.size(); ++p) {
      batch.parts[p]->hand_to_user();
      parts.append(export_tensor(batch.parts[p], batch.parts[p]->data(), 1, 0, part_meta_[p].dtype, batch.rows,
                                 part_meta_[p].row_shape));
    }
    return std::move(parts);
  }

  py::dict memory() const {
    py::dict d;
    const BufferPoolCounts host = engine_->host_counts();
    const bool pinned = pinned_ != nullptr;
    d["host_bytes"] = pinned ? 0 : engine_->host_bytes();
    d["pinned_bytes"] = pinned ? engine_->host_bytes() : 0;
    d["host_buffers"] = host.live();
    d["host_allocations"] = host.allocations;
    d["host_frees"] = host.frees;
    d["host_with_user"] = host.with_user;
    d["pinned_buffers"] = pinned ? host.live() : 0;
    int64_t device_bytes = 0, device_buffers = 0, device_allocations = 0, copied = 0;
    for (const auto& t : transfers_) {
      if (!t) continue;
      const cuda::TransferCounts c = t->counts();
      device_bytes += c.device_bytes;
      device_buffers += c.device_buffers;
      device_allocations += c.device_allocations;
      copied += c.batches;
    }
    d["device_bytes"] = device_bytes;
    d["device_buffers"] = device_buffers;
    d["device_allocations"] = device_allocations;
    d["batches_copied"] = copied;
    d["num_threads"] = engine_->num_threads();
    return d;
  }

  void set_misuse(const std::string& m) { misuse_ = parse_misuse(m); }
  // The per-batch counters of the iterator (for the benchmark that measures what they cost).
  void set_counting(bool on) { counting_ = on; }
  bool counting() const { return counting_; }

  int64_t batch_bytes(int64_t rows) const {
    int64_t row = 0;
    for (size_t b : layout_->part_row_bytes) row += static_cast<int64_t>(b);
    return row * rows;
  }

  // One epoch's counters (see fastload.LoaderStats for what each means).
  py::dict stats(const Run& run) const {
    py::dict d;
    const RunStats& r = run.stats;
    d["epoch"] = run.epoch;
    d["batches"] = r.batches;
    d["samples"] = r.samples;
    d["bytes"] = r.bytes;
    d["wait_s"] = static_cast<double>(r.wait_ns) * 1e-9;
    d["wall_s"] = std::chrono::duration<double>(RunStats::Clock::now() - r.started).count();
    d["ready_mean"] = r.batches ? static_cast<double>(r.ready_sum) / static_cast<double>(r.batches) : 0.0;
    d["collation"] = stage(run.pipeline->collation_times());
    py::dict copies;
    for (size_t o = 0; o < run.transfers.size(); ++o)
      if (run.transfers[o]) copies[py::str("cuda:" + std::to_string(run.transfers[o]->device()) + "#" + std::to_string(o))] =
          stage(run.transfers[o]->copy_times());
    d["copy"] = copies;
    d["num_threads"] = engine_->num_threads();
    d["prefetch"] = prefetch_;
    d["streams"] = streams_;
    return d;
  }

  // After a hand-out: if the loop waited for more than RunStats::kStallShare of the last
  // RunStats::kWindow batches, a one-time hint naming the knob the counters point to. It is
  // logged at the start of the next next(), before a batch is taken (logging runs Python).
  void check_stall(const Run& run, double share) {
    if (stall_warned_ || share <= RunStats::kStallShare) return;
    stall_warned_ = true;
    // Which stage is busy most of the time since the epoch began points to the knob.
    const double wall = std::chrono::duration<double, std::nano>(RunStats::Clock::now() - run.stats.started).count();
    const double collating = static_cast<double>(run.pipeline->collation_times().total_ns()) /
                             (wall * std::max(1, engine_->num_threads()));
    double copying = 0;
    for (const auto& t : run.transfers)
      if (t) copying = std::max(copying, static_cast<double>(t->copy_times().total_ns()) / (wall * streams_));
    const std::string knob = stall_advice(collating, copying, engine_->num_threads(), streams_, prefetch_);
    pending_warning_ = "fastload: the training loop waited for data " + std::to_string(static_cast<int>(share * 100)) +
                       "% of the time over the last " + std::to_string(RunStats::kWindow) + " batches; " + knob +
                       ". See loader.stats().";
  }

  void flush_warning() {
    if (pending_warning_.empty()) return;
    std::string message;
    message.swap(pending_warning_);
    py::module_::import("logging").attr("getLogger")("fastload").attr("warning")(message);
  }

 private:
  // step(timeout) takes a batch; it waits in slices with the GIL released, checking for Ctrl-C
  // in between. False at the end. (A first attempt with the GIL held and no timeout was tried:
  // 8-12% slower on the small-batch benchmarks, as the expired wait still sleeps on the
  // condition variable and makes the workers signal it.)
  template <typename F>
  bool wait(const Run&, F&& step) {
    for (;;) {
      const NextStatus status = without_gil([&] { return step(kSignalCheckInterval); });
      if (status == NextStatus::Ok) return true;
      if (status == NextStatus::End) return false;
      if (status == NextStatus::Cancelled) throw Cancelled();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
  }

  py::object next_device(const Run& run, cuda::TransferEngine& transfer, int output, cuda::api::CUstream stream,
                         bool raw, int64_t* rows) {
    cuda::DeviceBatch batch;
    if (!wait(run, [&](std::chrono::milliseconds timeout) { return transfer.next(run.pipeline.get(), stream, timeout, &batch); }))
      return py::none();
    *rows = batch.rows;
    py::list parts;
    for (size_t p = 0; p < part_meta_.size(); ++p) {
      auto user = std::make_shared<UserDevicePart>(std::move(batch.parts[p]), stream);
      const ColumnMeta& m = part_meta_[p];
      if (raw) {
        std::vector<int64_t> shape{batch.rows};
        shape.insert(shape.end(), m.row_shape.begin(), m.row_shape.end());
        const size_t bytes = layout_->part_row_bytes[p] * static_cast<size_t>(batch.rows);
        parts.append(py::cast(RawDevicePart{user, bytes, m.dtype, shape}));
      } else {
        void* data = reinterpret_cast<void*>(static_cast<uintptr_t>(user->buffer->ptr()));
        const int device = user->buffer->device();
        parts.append(export_tensor(std::move(user), data, 2, device, m.dtype, batch.rows, m.row_shape));
      }
    }
    return std::move(parts);
  }

  static py::dict stage(const StageTimes& t) {
    py::dict d;
    d["count"] = t.count();
    d["busy_s"] = static_cast<double>(t.total_ns()) * 1e-9;
    d["p50_s"] = static_cast<double>(t.quantile_ns(0.5)) * 1e-9;
    d["p99_s"] = static_cast<double>(t.quantile_ns(0.99)) * 1e-9;
    return d;
  }

  void stop_transfers() {
    for (auto& t : transfers_)
      if (t) t->stop();
  }

  std::vector<py::object> keepalive_;  // declared first: destroyed last, after the engine
  std::vector<ColumnMeta> meta_, part_meta_;
  const int64_t prefetch_;
  const int streams_;
  cuda::Misuse misuse_ = cuda::Misuse::None;
  bool stall_warned_ = false;  // the hint is given once per loader
  bool counting_ = true;
  std::string pending_warning_;
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<const BatchLayout> layout_;
  std::shared_ptr<HostAllocator> pinned_;  // made on the first GPU epoch
  std::vector<std::shared_ptr<cuda::TransferEngine>> transfers_;  // by output index
};


const char* const kSupersededMessage =
    "this iterator's epoch was ended by a newer iter()/split() on the same Loader, by "
    "load_state_dict() or by close(); take batches from the newest iterator";

// One output's batches of one epoch, in order, as dict[str, torch.Tensor]. next() is C++ from
// start to end: between taking a batch from the native side and returning it no Python code
// runs, so a KeyboardInterrupt can only arrive while waiting (nothing taken yet) and a batch is
// never lost; the handed-out count that state_dict() reads moves in the same step.
class Iterator {
 public:
  Iterator(py::object owner, py::object engine, std::shared_ptr<Run> run, int output, std::vector<py::str> names,
           int device, bool raw)
      : owner_(std::move(owner)), engine_(std::move(engine)), run_(std::move(run)), output_(output),
        names_(std::move(names)), device_(device), raw_(raw) {
    if (device_ >= 0 && !raw_) current_stream_ = py::module_::import("torch.cuda").attr("current_stream");
    if (!raw_) {
      py::object torch_c = py::module_::import("torch._C");
      // The builtin, not torch.from_dlpack: a Python function could run a signal handler.
      from_dlpack_ = py::hasattr(torch_c, "_from_dlpack") ? torch_c.attr("_from_dlpack")
                                                          : py::module_::import("torch").attr("from_dlpack");
    }
  }

  py::object next() {
    if (exit_parking::note_next()) park();
    PyEngine& engine = engine_.cast<PyEngine&>();
    engine.flush_warning();  // Python code may run (and be interrupted) only before the take
    uintptr_t stream = 0;
    if (current_stream_) stream = current_stream_(device_).attr("cuda_stream").cast<uintptr_t>();
    const bool counting = engine.counting();
    const auto t0 = counting ? RunStats::Clock::now() : RunStats::Clock::time_point();
    int64_t ready = 0;
    py::object parts;
    int64_t rows = 0;
    try {
      parts = engine.take(*run_, output_, stream, raw_, &rows, counting ? &ready : nullptr);
    } catch (const Cancelled&) {
      if (exit_parking::note_next()) park();  // closed at exit while this thread waited
      throw std::runtime_error(run_->superseded ? kSupersededMessage : "this epoch's batches were cancelled");
    } catch (const std::runtime_error& e) {
      if (!run_->superseded) throw;
      throw std::runtime_error(std::string(kSupersededMessage) + " (" + e.what() + ")");
    }
    if (parts.is_none()) throw py::stop_iteration();
    py::list list = py::reinterpret_borrow<py::list>(parts);
    py::dict batch;
    for (size_t i = 0; i < names_.size(); ++i)
      batch[names_[i]] = raw_ ? py::object(list[i]) : from_dlpack_(list[i]);
    ++run_->handed[static_cast<size_t>(output_)];
    if (counting) {
      const double share = run_->stats.record(rows, engine.batch_bytes(rows), StageTimes::since(t0), ready);
      if (share >= 0) engine.check_stall(*run_, share);
    }
    return std::move(batch);
  }

  [[noreturn]] static void park() {  // public: iter() parks a thread the same way
    exit_parking::mark_parked();
    PyEval_SaveThread();  // for good: this thread never takes the GIL again
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }

  int64_t remaining() const {
    return run_->pipeline->plan(output_).num_batches() - run_->handed[static_cast<size_t>(output_)];
  }

 private:
  py::object owner_;  // the Loader: `for b in Loader(...)` keeps it alive while the loop runs
  py::object engine_;
  std::shared_ptr<Run> run_;
  int output_;
  std::vector<py::str> names_;
  int device_;
  bool raw_;
  py::object current_stream_, from_dlpack_;
};

// C++ exceptions to Python, in one place: a collation failure keeps its original type.
void translate_collation_error(const CollationError& e) {
  try {
    std::rethrow_exception(e.original());
  } catch (const std::bad_alloc&) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const std::invalid_argument&) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

}  // namespace

void bind_loader(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const CollationError& e) {
      translate_collation_error(e);
    }
  });

  py::class_<Run, std::shared_ptr<Run>>(m, "Epoch")
      .def_readonly("epoch", &Run::epoch)
      .def_readwrite("superseded", &Run::superseded)
      .def("handed", [](const Run& r, int d) { return r.handed.at(static_cast<size_t>(d)); })
      .def("num_batches", [](const Run& r, int d) { return r.pipeline->plan(d).num_batches(); })
      .def("position_after",
           [](const Run& r, int d, int64_t k) { return r.pipeline->plan(d).position_after(k); })
      .def("cancel", [](const Run& r) { without_gil([&] { r.pipeline->cancel(); }); });

  py::class_<Iterator>(m, "Iterator", "Hands out one output's batches of one epoch, in order, as "
                       "dict[str, torch.Tensor]. On a GPU each batch is ready on the stream that was "
                       "current (torch.cuda.current_stream) when next() was called.")
      .def(py::init<py::object, py::object, std::shared_ptr<Run>, int, std::vector<py::str>, int, bool>())
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &Iterator::next)
      .def("__len__", &Iterator::remaining);

  py::class_<RawDevicePart>(m, "RawDevicePart")
      .def_property_readonly("ptr", [](const RawDevicePart& p) { return static_cast<uintptr_t>(p.part->buffer->ptr()); })
      .def_property_readonly("device", [](const RawDevicePart& p) { return p.part->buffer->device(); })
      .def_property_readonly("nbytes", [](const RawDevicePart& p) { return p.bytes; })
      .def_property_readonly("shape", [](const RawDevicePart& p) { return p.shape; })
      .def_property_readonly("dtype_code", [](const RawDevicePart& p) { return p.dtype.code; })
      .def_property_readonly("dtype_bits", [](const RawDevicePart& p) { return p.dtype.bits; })
      .def("read", &RawDevicePart::read)
      .def("touch", &RawDevicePart::touch);

  py::class_<PyEngine>(m, "Engine")
      .def(py::init<const py::list&, int64_t, int, int64_t, bool, bool, int>(), py::arg("columns"),
           py::arg("batch_size"), py::arg("num_threads"), py::arg("prefetch"),
           py::arg("with_index"), py::arg("with_valid"), py::arg("streams") = 1)
      .def("start", &PyEngine::start, py::arg("samplers"), py::arg("epoch"),
           py::arg("start_position"), py::arg("fail_at_step"), py::arg("devices"))
      .def("close", &PyEngine::close)
      .def("memory", &PyEngine::memory)
      .def("stats", &PyEngine::stats, py::arg("epoch"))
      .def("_set_misuse", &PyEngine::set_misuse)
      .def("_set_counting", &PyEngine::set_counting);

  // Loads the CUDA driver (on first use) and returns how many devices it sees; raises
  // RuntimeError saying why when it cannot be used (no driver, the stub library, no device).
  // At interpreter exit (fastload._lifecycle): park threads iterating from now on, and say how
  // many recently iterating threads have not parked yet.
  m.def("_start_exit_parking", [] { exit_parking::state().parking = true; });
  m.def("_unparked_iterators", [](const std::set<long>& live) { return exit_parking::unparked(live); });
  // iter()/split() call this first: a daemon thread starting an epoch at exit parks too.
  m.def("_park_if_exiting", [] {
    if (exit_parking::note_next()) Iterator::park();
  });

  m.def("cuda_device_count", [] { return without_gil([] { return cuda::device_count(); }); });
}

}  // namespace fastload
