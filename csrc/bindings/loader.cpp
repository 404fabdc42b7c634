// fastload._C.Engine, Epoch and Iterator: the loader runtime (runtime/loader_runtime.h) as Python
// holds it. Every wait releases the GIL and wakes every 50 ms to let Python check for Ctrl-C;
// batches leave as DLPack capsules made into torch tensors natively.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bindings/callback_error.h"
#include "bindings/device_part.h"
#include "bindings/dlpack_export.h"
#include "bindings/exit_parking.h"
#include "bindings/gc_visible.h"
#include "bindings/hooks.h"
#include "bindings/image.h"
#include "bindings/pack.h"
#include "bindings/process_workers.h"
#include "bindings/py_source.h"
#include "bindings/register.h"
#include "bindings/source.h"
#include "bindings/stream.h"
#include "bindings/testing.h"
#include "bindings/without_gil.h"
#include "core/arrow_source.h"
#include "image/image_error.h"
#include "cuda/driver.h"
#include "runtime/loader_runtime.h"

namespace py = pybind11;

namespace fastload {

namespace {

constexpr std::chrono::milliseconds kSignalCheckInterval{50};
// Without timeout=: how long stopping an epoch waits for a thread still in a Python dataset's
// code before leaving it behind (a sample that takes longer than this is not an ordinary one).
constexpr std::chrono::milliseconds kStuckGrace{5000};

// A wait ended because the epoch was cancelled.
struct Cancelled {};

// What a GPU output's parts become. Tests only, besides Tensors: Raw parts are read back through
// the driver; StandinTensors are DLPack exports of the stand-in driver's "device" memory (host
// memory) as CPU tensors, so that a CPU build of torch imports them with its own from_dlpack and
// its deleter runs fastload's release path exactly as for CUDA tensors; only the device type
// in the DLPack tensor differs.
enum class DeviceParts { Tensors, Raw, StandinTensors };

// The Python-facing engine: the runtime, plus the source (fastload._C.BatchSource, whose Python
// objects own the memory the threads read and the dataset they call) and what Python needs to
// build tensors.
// An Arrow source's string columns asked for as lists: one Python list of str (bytes for binary;
// None for a filled null) per column, built here in one pass over the batch's values.
// A tar shard's JSON member (a str, consumed) parsed with Python's json.loads; a text that is not
// JSON is a ValueError naming the field and the row.
PyObject* parse_json(PyObject* text, const std::string& field, size_t row) {
  static PyObject* loads = py::object(py::module_::import("json").attr("loads")).release().ptr();  // for the process's life
  PyObject* parsed = PyObject_CallOneArg(loads, text);
  Py_DECREF(text);
  if (parsed) return parsed;
  const py::error_already_set e;
  throw py::value_error("field '" + field + "' of row " + std::to_string(row) + " of the batch is not JSON: " + e.what());
}

void add_string_lists(py::dict& d, const ArrowStringLists& lists) {
  for (size_t k = 0; k < lists.names.size(); ++k) {
    const std::vector<int64_t>& o = lists.offsets[k];
    const char* bytes = lists.bytes[k].data();
    const size_t rows = o.size() - 1;
    py::list out(rows);
    for (size_t i = 0; i < rows; ++i) {
      PyObject* item;
      if (!lists.valid[k][i]) {
        item = Py_NewRef(Py_None);
      } else if (lists.utf8[k]) {
        item = PyUnicode_DecodeUTF8(bytes + o[i], o[i + 1] - o[i], "replace");
      } else {
        item = PyBytes_FromStringAndSize(bytes + o[i], o[i + 1] - o[i]);
      }
      if (!item) throw py::error_already_set();
      if (k < lists.json.size() && lists.json[k] && item != Py_None) item = parse_json(item, lists.names[k], i);
      PyList_SET_ITEM(out.ptr(), static_cast<Py_ssize_t>(i), item);
    }
    d[py::str(lists.names[k])] = std::move(out);
  }
}

class PyEngine {
 public:
  // `layout`: the batch layout the Python side built for this source (fastload._C.BatchLayout);
  // the engine uses it as it is, so both sides size batches from one object.
  PyEngine(py::object handle, std::shared_ptr<BatchLayout> layout, int num_threads, int64_t prefetch,
           int copy_streams, std::shared_ptr<SharedMemoryAllocator> shared_memory)
      : source_(std::move(handle)) {
    const SourceHandle& source = source_.cast<const SourceHandle&>();
    if (!layout) throw std::invalid_argument("an engine needs a batch layout");
    RuntimeOptions o;
    o.engine.num_threads = num_threads;
    o.engine.prefetch = prefetch;
    o.engine.with_index = layout->with_index;
    o.engine.with_valid = layout->with_valid;
    o.engine.with_source = layout->with_source;
    o.engine.batch_size = layout->max_rows;
    o.engine.layout = std::move(layout);
    o.streams = copy_streams;
    o.cache_release = true;  // next() empties torch's cache when a GPU output runs out of memory
    o.host_memory = std::move(shared_memory);
    runtime_ = std::make_unique<LoaderRuntime>(source.source, o);
    python_ = std::dynamic_pointer_cast<PythonSource>(source.source);
    string_lists_ = source.source->has_string_lists();
    packed_rows_ = is_packed_source(*source.source);
    for (const std::string& name : runtime_->layout().names()) names_.emplace_back(name);
    threads_call_dataset_ = python_ && !o.host_memory;  // with worker processes, they wait on sockets
    set_stop_policy();
  }

  ~PyEngine() {
    // Joining threads must not hold the GIL; the source's objects (source_) die after, with it.
    if (runtime_) without_gil([&] { runtime_.reset(); });
  }

  void close() { without_gil([&] { runtime_->close(); }); }

  // The collector's view: the source object (it visits what it holds; see gc_visible.h).
  int traverse(visitproc visit, void* arg) const {
    Py_VISIT(source_.ptr());
    return 0;
  }

  std::shared_ptr<Run> start(const std::vector<SamplerConfig>& configs, int64_t epoch, int64_t start_position,
                             int64_t fail_at_step, const std::vector<int>& devices) {
    std::vector<std::shared_ptr<const BatchPlan>> plans;
    for (const SamplerConfig& c : configs) plans.push_back(std::make_shared<EpochPlan>(c, epoch, start_position));
    return start_plans(std::move(plans), fail_at_step, devices);
  }

  // Global steps [first_step, end_step) of a stream, one sampler (replica) per output.
  std::shared_ptr<Run> start_stream(const std::vector<StreamSampler>& samplers, int64_t first_step, int64_t end_step,
                                    int64_t epoch, int64_t fail_at_step, const std::vector<int>& devices) {
    std::vector<std::shared_ptr<const BatchPlan>> plans;
    for (const StreamSampler& s : samplers)
      plans.push_back(std::make_shared<StreamPlan>(s.config, first_step, end_step, epoch));
    return start_plans(std::move(plans), fail_at_step, devices);
  }

  // The next batch's parts (None at the end) as DLPack capsules, or RawDevicePart with raw=True
  // (tests with the stand-in driver). For a GPU output `stream` is the consumer's stream, made to
  // wait on the batch's copy. `ready`, if given, gets the batches ready when the call began.
  py::object take(const Run& run, int output, uintptr_t stream, DeviceParts mode, int64_t* rows, int64_t* step,
                  int64_t* ready, std::shared_ptr<void>* extras) {
    runtime_->check_not_forked();
    if (run.transfers.at(static_cast<size_t>(output)))
      return take_device(run, output, stream, mode, rows, step, ready, extras);
    Batch batch;
    int64_t* ready_at_entry = ready;  // counted by the first attempt only
    const bool more = wait([&](std::chrono::milliseconds timeout) {
      const NextStatus status = runtime_->next_host(run, output, timeout, &batch, ready_at_entry);
      ready_at_entry = nullptr;
      return status;
    });
    if (!more) return py::none();
    *rows = batch.rows;
    *step = batch.step;
    *extras = std::move(batch.extras);
    const BatchLayout& L = runtime_->layout();
    py::list parts;
    for (size_t p = 0; p < L.num_parts(); ++p) {
      batch.parts[p]->hand_to_user();
      parts.append(export_tensor(batch.parts[p], batch.parts[p]->data(), 1, 0, L.parts[p].dtype, batch.rows,
                                 L.parts[p].row_shape));
    }
    return std::move(parts);
  }

  py::dict memory() const {
    const MemoryCounts c = runtime_->memory();
    py::dict d;
    d["host_bytes"] = c.host_bytes;
    d["pinned_bytes"] = c.pinned_bytes;
    d["host_buffers"] = c.host.live();
    d["host_allocations"] = c.host.allocations;
    d["host_frees"] = c.host.frees;
    d["host_with_user"] = c.host.with_user;
    d["pinned_buffers"] = c.pinned_buffers;
    d["device_bytes"] = c.device_bytes;
    d["device_buffers"] = c.device_buffers;
    d["device_allocations"] = c.device_allocations;
    d["device_retired"] = c.device_retired;
    d["batches_copied"] = c.batches_copied;
    d["num_threads"] = c.num_threads;
    return d;
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
    py::dict copies, release_waits;
    for (size_t o = 0; o < run.transfers.size(); ++o)
      if (run.transfers[o]) {
        const py::str key("cuda:" + std::to_string(run.transfers[o]->device()) + "#" + std::to_string(o));
        copies[key] = stage(run.transfers[o]->copy_times());
        release_waits[key] = static_cast<double>(run.transfers[o]->release_wait_ns()) * 1e-9;
      }
    d["copy"] = copies;
    d["release_wait"] = release_waits;
    d["user_s"] = python_ ? static_cast<double>(python_->user_ns()) * 1e-9 : 0.0;
    d["source_samples"] = r.source_rows;
    d["num_threads"] = runtime_->num_threads();
    d["prefetch"] = runtime_->prefetch();
    d["copy_streams"] = runtime_->streams();
    return d;
  }

  // After a hand-out: the one-time stall hint's figures, turned into a warning (by Python, see
  // hooks::stall_warning) at the start of the next next(), before a batch is taken (logging runs
  // Python code, which a signal may interrupt).
  void check_stall(const Run& run, double share) {
    StallFigures f;
    const bool due = python_ ? runtime_->stall_figures(run, share, &f, python_->user_ns(), python_->has_workers())
                             : runtime_->stall_figures(run, share, &f);
    if (due) pending_stall_ = f;
  }

  void flush_warning() {
    if (!pending_stall_) return;
    const StallFigures f = *pending_stall_;
    pending_stall_.reset();
    py::dict d;
    d["share"] = f.share;
    d["collating"] = f.collating;
    d["copying"] = f.copying;
    d["releasing"] = f.releasing;
    d["user_share"] = f.user_share;
    d["fetch_share"] = f.fetch_share;
    d["processes"] = f.processes;
    d["num_threads"] = f.num_threads;
    d["copy_streams"] = f.copy_streams;
    d["prefetch"] = f.prefetch;
    d["window"] = f.window;
    hooks::stall_warning()(**d);
  }

  const std::vector<py::str>& names() const { return names_; }
  std::shared_ptr<Run> start_plans(std::vector<std::shared_ptr<const BatchPlan>> plans, int64_t fail_at_step,
                                   const std::vector<int>& devices) {
    auto run = without_gil([&] { return runtime_->start(std::move(plans), fail_at_step, devices); });
    if (python_) python_->reset_user_ns();  // the epoch's time in user code starts now
    return run;
  }
  const std::shared_ptr<PythonSource>& python_source() const { return python_; }
  // An Arrow source with string columns given as lists: its batches' extras are ArrowStringLists.
  bool string_lists() const { return string_lists_; }
  // fl.Pack's rows: its batches' extras are PackedBatchInfo (cu_seqlens' length, max_seqlen).
  bool packed_rows() const { return packed_rows_; }
  void set_timeout(double seconds) {
    timeout_ = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    set_stop_policy();
  }
  int64_t left_behind() const { return runtime_->left_behind(); }
  // A call into the dataset (a worker process's batch) running past timeout= (or kStuckGrace
  // without one): what it is, or "".
  std::string overdue() const {
    return python_ ? python_->overdue(timeout_.count() > 0 ? timeout_ : kStuckGrace) : std::string();
  }
  // Cancels the running epoch and waits for its threads (under the stop policy): nothing uses
  // the source until the next start().
  void stop_epoch() { without_gil([&] { runtime_->stop_epoch(); }); }
  std::string left_behind_in() const { return runtime_->left_behind_in(); }
  const BatchLayout& layout() const { return runtime_->layout(); }
  std::shared_ptr<BatchLayout> layout_copy() const { return std::make_shared<BatchLayout>(runtime_->layout()); }
  void set_misuse(const std::string& m) { runtime_->set_misuse(parse_misuse(m)); }
  // The per-batch counters of the iterator (for the benchmark that measures what they cost).
  void set_counting(bool on) { counting_ = on; }
  bool counting() const { return counting_; }

 private:
  // step(timeout) takes a batch; it waits in slices with the GIL released, checking for Ctrl-C
  // in between. False at the end. (A first attempt with the GIL held and no timeout was tried:
  // 8-12% slower on the small-batch benchmarks, as the expired wait still sleeps on the
  // condition variable and makes the workers signal it.)
  // `between(...)`, if given, runs with the GIL after every slice that timed out.
  template <typename F, typename G = void (*)()>
  bool wait(F&& step, G between = [] {}) {
    for (;;) {
      const NextStatus status = without_gil([&] { return step(kSignalCheckInterval); });
      if (status == NextStatus::Ok) return true;
      if (status == NextStatus::End) return false;
      if (status == NextStatus::Cancelled) throw Cancelled();
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      between();
      if (python_ && timeout_.count() > 0) {
        const std::string late = python_->overdue(timeout_);
        if (!late.empty()) {
          char limit[32];
          std::snprintf(limit, sizeof limit, "%g", static_cast<double>(timeout_.count()) / 1000.0);
          PyErr_SetString(PyExc_TimeoutError, ("fastload: " + late + " (timeout=" + limit + " s)").c_str());
          throw py::error_already_set();
        }
      }
    }
  }

  py::object take_device(const Run& run, int output, uintptr_t raw_stream, DeviceParts mode, int64_t* rows,
                         int64_t* step, int64_t* ready, std::shared_ptr<void>* extras) {
    const auto stream = reinterpret_cast<cuda::api::CUstream>(raw_stream);
    cuda::DeviceBatch batch;
    int64_t* ready_at_entry = ready;
    cuda::TransferEngine& transfer = *run.transfers.at(static_cast<size_t>(output));
    const bool more = wait(
        [&](std::chrono::milliseconds timeout) {
          const NextStatus status = runtime_->next_device(run, output, stream, timeout, &batch, ready_at_entry);
          ready_at_entry = nullptr;
          return status;
        },
        [&] {
          // The transfer thread is out of device memory and this loop waits for a batch: as
          // torch's allocator does before it gives up, empty torch's cache (this thread may
          // take the GIL; the transfer thread may not).
          if (!transfer.cache_release_requested()) return;
          hooks::release_cache()(transfer.device());
          transfer.cache_released();
        });
    if (!more) return py::none();
    *rows = batch.rows;
    *step = batch.step;
    *extras = std::move(batch.extras);
    const BatchLayout& L = runtime_->layout();
    py::list parts;
    for (size_t p = 0; p < L.num_parts(); ++p) {
      auto user = std::make_shared<UserDevicePart>(std::move(batch.parts[p]), stream);
      const PartSchema& m = L.parts[p];
      if (mode == DeviceParts::Raw) {
        std::vector<int64_t> shape{batch.rows};
        shape.insert(shape.end(), m.row_shape.begin(), m.row_shape.end());
        const size_t bytes = L.part_row_bytes[p] * static_cast<size_t>(batch.rows);
        parts.append(py::cast(RawDevicePart{user, bytes, m.dtype, shape}));
      } else {
        void* data = reinterpret_cast<void*>(static_cast<uintptr_t>(user->buffer->ptr()));
        const bool cpu = mode == DeviceParts::StandinTensors;
        const int device = cpu ? 0 : user->buffer->device();
        parts.append(export_tensor(std::move(user), data, cpu ? 1 : 2, device, m.dtype, batch.rows, m.row_shape));
      }
    }
    return std::move(parts);
  }

  // Collation threads that call a Python dataset may be stuck in it for good: stopping an epoch
  // (a new iter(), close(), interpreter exit) waits for them at most `timeout` (when given; once
  // a call is overdue, not at all), else kStuckGrace, then leaves them behind. Worker processes are
  // not left behind: close() wakes their threads by shutting the sockets, and ends the processes.
  void set_stop_policy() {
    if (!threads_call_dataset_) return;
    StopPolicy policy;
    policy.grace = timeout_.count() > 0 ? timeout_ : kStuckGrace;
    std::weak_ptr<PythonSource> source = python_;
    const std::chrono::milliseconds limit = timeout_.count() > 0 ? timeout_ : kStuckGrace;
    policy.stuck = [source, limit] {
      auto s = source.lock();
      return s ? s->overdue(limit) : std::string();
    };
    policy.left_behind = [source](int) {
      if (auto s = source.lock()) s->retire_calls();
    };
    runtime_->set_stop_policy(std::move(policy));
  }

  static py::dict stage(const StageTimes& t) {
    py::dict d;
    d["count"] = t.count();
    d["busy_s"] = static_cast<double>(t.total_ns()) * 1e-9;
    d["p50_s"] = static_cast<double>(t.quantile_ns(0.5)) * 1e-9;
    d["p99_s"] = static_cast<double>(t.quantile_ns(0.99)) * 1e-9;
    return d;
  }

  py::object source_;  // the BatchSource; declared first: destroyed last, after the runtime joined its threads
  std::shared_ptr<PythonSource> python_;  // the source, when it is a Python dataset
  bool string_lists_ = false;
  bool packed_rows_ = false;
  std::chrono::milliseconds timeout_{0};  // a call into the dataset longer than this fails next()
  bool threads_call_dataset_ = false;     // the collation threads call a Python dataset themselves
  std::unique_ptr<LoaderRuntime> runtime_;
  std::vector<py::str> names_;
  bool counting_ = true;
  std::optional<StallFigures> pending_stall_;  // a stall hint due at the next next()
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
  Iterator(py::object owner, py::object engine, std::shared_ptr<Run> run, int output, int device, bool raw,
           uintptr_t test_stream, bool standin_tensors)
      : owner_(std::move(owner)), engine_(std::move(engine)), run_(std::move(run)), output_(output), device_(device),
        raw_(raw && device >= 0), test_stream_(test_stream) {  // a CPU output's batches are tensors always
    mode_ = raw_ ? DeviceParts::Raw : standin_tensors ? DeviceParts::StandinTensors : DeviceParts::Tensors;
    if (device_ >= 0 && mode_ == DeviceParts::Tensors) {
      // The consumer stream's raw handle, read once per next(). torch.cuda.current_stream(d)
      // builds a torch.cuda.Stream object each time (Python code, a few µs); torch's own
      // compiled code (Triton, Inductor) reads the handle with one C call instead. The first
      // read goes through current_stream, which initialises torch's CUDA state if needed.
      py::object torch_cuda = py::module_::import("torch.cuda");
      torch_cuda.attr("current_stream")(device_);
      py::object torch_c = py::module_::import("torch._C");
      if (py::hasattr(torch_c, "_cuda_getCurrentRawStream"))
        raw_stream_ = torch_c.attr("_cuda_getCurrentRawStream");
      else
        current_stream_ = torch_cuda.attr("current_stream");
    }
    if (!raw_) {
      py::object torch_c = py::module_::import("torch._C");
      // The builtin, not torch.from_dlpack: a Python function could run a signal handler.
      from_dlpack_ = py::hasattr(torch_c, "_from_dlpack") ? torch_c.attr("_from_dlpack")
                                                          : py::module_::import("torch").attr("from_dlpack");
    }
  }

  py::object next() {
    if (exit_parking::note_next()) park();
    if (engine_.is_none()) throw std::runtime_error("this iterator was cleared by the garbage collector");
    PyEngine& engine = engine_.cast<PyEngine&>();
    engine.flush_warning();  // Python code may run (and be interrupted) only before the take
    if (!pending_.is_none()) {
      // The batch a signal interrupted last time: still the next one, handed out now.
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      py::object batch = std::move(pending_);
      pending_ = py::none();
      ++run_->handed[static_cast<size_t>(output_)];
      return batch;
    }
    uintptr_t stream = test_stream_;
    if (raw_stream_)
      stream = raw_stream_(device_).cast<uintptr_t>();
    else if (current_stream_)
      stream = current_stream_(device_).attr("cuda_stream").cast<uintptr_t>();
    const bool counting = engine.counting();
    const auto t0 = counting ? RunStats::Clock::now() : RunStats::Clock::time_point();
    int64_t ready = 0;
    py::object parts;
    int64_t rows = 0, step = 0;
    std::shared_ptr<void> extras;
    try {
      parts = engine.take(*run_, output_, stream, mode_, &rows, &step, counting ? &ready : nullptr, &extras);
    } catch (const Cancelled&) {
      if (exit_parking::note_next()) park();  // closed at exit while this thread waited
      throw std::runtime_error(run_->superseded ? kSupersededMessage : "this epoch's batches were cancelled");
    } catch (const std::runtime_error& e) {
      if (!run_->superseded) throw;
      throw std::runtime_error(std::string(kSupersededMessage) + " (" + e.what() + ")");
    }
    if (parts.is_none()) throw py::stop_iteration();
    py::list list = py::reinterpret_borrow<py::list>(parts);
    const std::vector<py::str>& names = engine.names();
    py::object batch;
    if (const auto& python = engine.python_source()) {
      // The sample's own structure: its parts, then the loader's (index, valid) added to a dict.
      const size_t own = engine.layout().source_parts;
      std::vector<py::object> tensors;
      std::vector<std::pair<py::str, py::object>> loader_parts;
      for (size_t i = 0; i < names.size(); ++i) {
        py::object t = raw_ ? py::object(list[i]) : from_dlpack_(list[i]);
        if (i < own) tensors.push_back(std::move(t));
        else loader_parts.emplace_back(names[i], std::move(t));
      }
      batch = python->assemble(tensors, extras, loader_parts);
    } else {
      py::dict d;
      for (size_t i = 0; i < names.size(); ++i) d[names[i]] = raw_ ? py::object(list[i]) : from_dlpack_(list[i]);
      if (engine.string_lists() && extras) add_string_lists(d, *static_cast<const ArrowStringLists*>(extras.get()));
      if (engine.packed_rows() && extras && !raw_) finish_packed_batch(d, extras);
      batch = std::move(d);
    }
    // A mixture's per-source counts move with the hand-out (O(sources), no floor sums).
    if (!run_->stats.source_rows.empty())
      run_->pipeline->plan(output_).add_source_rows(step, run_->stats.source_rows.data());
    if (counting) {
      const int64_t bytes = static_cast<int64_t>(engine.layout().batch_bytes(rows));
      const double share = run_->stats.record(rows, bytes, StageTimes::since(t0), ready);
      if (share >= 0) engine.check_stall(*run_, share);
    }
    // A signal that arrived while the batch was taken would run its handler as soon as this call
    // returns, before `batch = next(it)` assigns it: the batch would be lost although counted
    // as handed out. Run pending handlers here instead; if one raises, the batch is kept as the
    // next one (state_dict() does not count it) and the exception goes up.
    if (PyErr_CheckSignals() != 0) {
      pending_ = std::move(batch);
      throw py::error_already_set();
    }
    ++run_->handed[static_cast<size_t>(output_)];
    return batch;
  }

  [[noreturn]] static void park() {  // public: iter() parks a thread the same way
    exit_parking::mark_parked();
    PyEval_SaveThread();  // for good: this thread never takes the GIL again
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }

  int64_t remaining() const {
    return run_->pipeline->plan(output_).num_batches() - run_->handed[static_cast<size_t>(output_)];
  }

  // The garbage collector's view (loader.it = iter(loader) is a cycle through this object).
  int traverse(visitproc visit, void* arg) const {
    for (const py::object* o : {&owner_, &engine_, &current_stream_, &raw_stream_, &from_dlpack_, &pending_})
      Py_VISIT(o->ptr());
    return 0;
  }
  void clear() {
    owner_ = py::none();
    engine_ = py::none();
    pending_ = py::none();
  }

 private:
  py::object owner_;  // the Loader: `for b in Loader(...)` keeps it alive while the loop runs
  py::object engine_;
  std::shared_ptr<Run> run_;
  int output_;
  int device_;
  bool raw_;
  DeviceParts mode_ = DeviceParts::Tensors;
  uintptr_t test_stream_;  // the consumer stream of raw device batches (tests)
  py::object current_stream_, raw_stream_, from_dlpack_;
  py::object pending_ = py::none();  // a batch taken but not handed out (a signal interrupted next())
};

// C++ exceptions to Python, in one place: a collation failure keeps its original type.
void translate_collation_error(const CollationError& e) {
  try {
    std::rethrow_exception(e.original());
  } catch (const SampleError& s) {
    set_sample_error(s, e.what());
  } catch (const CallbackError& c) {
    set_callback_error(c, e.what());
  } catch (const image::ImageError&) {
    set_image_error(e.what());
  } catch (const std::bad_alloc&) {
    PyErr_SetString(PyExc_MemoryError, e.what());
  } catch (const std::invalid_argument&) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
}

}  // namespace

void register_loader(py::module_& m) {
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const CollationError& e) {
      translate_collation_error(e);
    } catch (const CallbackError& e) {  // a callback's failure outside the collation threads
      set_callback_error(e, e.what());
    } catch (const cuda::OutOfMemory& e) {
      // torch's own type (a RuntimeError), so code that handles torch's out-of-memory errors
      // handles the loader's too.
      py::object oom = py::module_::import("torch").attr("cuda").attr("OutOfMemoryError");
      PyErr_SetString(oom.ptr(), e.what());
    }
  });

  py::class_<Run, std::shared_ptr<Run>>(m, "Epoch")
      .def_readonly("epoch", &Run::epoch)
      .def_readwrite("superseded", &Run::superseded)
      .def("handed", [](const Run& r, int d) { return r.handed.at(static_cast<size_t>(d)); })
      .def("num_batches", [](const Run& r, int d) { return r.pipeline->plan(d).num_batches(); })
      .def("position_after",
           [](const Run& r, int d, int64_t k) { return r.pipeline->plan(d).position_after(k); })
      .def("stream_positions",
           [](const Run& r, int d, int64_t k) {
             // Every source's stream position at the global step after k batches of output d.
             const auto* plan = dynamic_cast<const StreamPlan*>(&r.pipeline->plan(d));
             if (!plan) throw std::invalid_argument("not a step-based run");
             std::vector<int64_t> out(static_cast<size_t>(plan->num_sources()));
             plan->positions(plan->position_after(k), out.data());
             return out;
           },
           py::arg("output"), py::arg("batches_done"))
      .def("cancel", [](const Run& r) { without_gil([&] { r.pipeline->cancel(); }); });

  py::class_<Iterator>(m, "Iterator", "Hands out one output's batches of one epoch, in order, as "
                       "dict[str, torch.Tensor]. On a GPU each batch is ready on the stream that was "
                       "current (torch.cuda.current_stream) when next() was called.",
                       gc_visible<Iterator, /*Clears=*/true>())  // it holds its Loader
      .def(py::init<py::object, py::object, std::shared_ptr<Run>, int, int, bool, uintptr_t, bool>(), py::arg("owner"),
           py::arg("engine"), py::arg("epoch"), py::arg("output"), py::arg("device"), py::arg("raw") = false,
           py::arg("test_stream") = 0, py::arg("standin_tensors") = false)
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &Iterator::next)
      .def("__len__", &Iterator::remaining);

  py::class_<PyEngine>(m, "Engine", gc_visible<PyEngine>())  // it holds its source
      .def(py::init<py::object, std::shared_ptr<BatchLayout>, int, int64_t, int,
                    std::shared_ptr<SharedMemoryAllocator>>(),
           py::arg("source"), py::arg("layout"), py::arg("num_threads"), py::arg("prefetch"),
           py::arg("copy_streams") = 1, py::arg("shared_memory") = nullptr)
      .def("start", &PyEngine::start, py::arg("samplers"), py::arg("epoch"), py::arg("start_position"),
           py::arg("fail_at_step"), py::arg("devices"))
      .def("start_stream", &PyEngine::start_stream, py::arg("samplers"), py::arg("first_step"), py::arg("end_step"),
           py::arg("epoch"), py::arg("fail_at_step"), py::arg("devices"))
      // Plans made elsewhere (fl.Pack's, fastload._C.BatchPlan), one per output.
      .def("start_plans",
           [](PyEngine& e, const std::vector<std::shared_ptr<BatchPlan>>& plans, int64_t fail_at_step,
              const std::vector<int>& devices) {
             return e.start_plans({plans.begin(), plans.end()}, fail_at_step, devices);
           },
           py::arg("plans"), py::arg("fail_at_step"), py::arg("devices"))
      .def("close", &PyEngine::close)
      .def("memory", &PyEngine::memory)
      .def("stats", &PyEngine::stats, py::arg("epoch"))
      .def_property_readonly("layout", &PyEngine::layout_copy)
      .def("set_timeout", &PyEngine::set_timeout, py::arg("seconds"))
      .def("left_behind", &PyEngine::left_behind)
      .def("overdue", &PyEngine::overdue)
      .def("stop_epoch", &PyEngine::stop_epoch)
      .def("left_behind_in", &PyEngine::left_behind_in)
      .def("_set_misuse", &PyEngine::set_misuse)
      .def("_set_counting", &PyEngine::set_counting);

  // The memory bound's one owner (core/memory_bound.h), for the Python-side checks and tune.
  m.def("batches_in_use", &batches_in_use, py::arg("prefetch"),
        "batches one output has in use at once: the prefetch window and the one the consumer holds");
  m.def("batches_held", &batches_held, py::arg("prefetch"),
        "the most batches one output holds: those in use and the one next() hands over meanwhile");

  // At interpreter exit (fastload._lifecycle): park threads iterating from now on, and say how
  // many recently iterating threads have not parked yet.
  m.def("_start_exit_parking", [] { exit_parking::state().parking = true; });
  m.def("_unparked_iterators", [](const std::set<long>& live) { return exit_parking::unparked(live); });
  // iter()/split() call this first: a daemon thread starting an epoch at exit parks too.
  m.def("_park_if_exiting", [] {
    if (exit_parking::note_next()) Iterator::park();
  });

  // fastload.record_stream for one part: see cuda::record_stream. The deleter of that part records
  // a release event on `stream` too.
  m.def("_record_stream", [](int device, uintptr_t ptr, uintptr_t stream) {
    return without_gil([&] {
      return cuda::record_stream(device, static_cast<cuda::api::CUdeviceptr>(ptr),
                                 reinterpret_cast<cuda::api::CUstream>(stream));
    });
  }, py::arg("device"), py::arg("ptr"), py::arg("stream"));

  // Loads the CUDA driver (on first use) and returns how many devices it sees; raises
  // RuntimeError saying why when it cannot be used (no driver, the stub library, no device).
  m.def("cuda_device_count", [] { return without_gil([] { return cuda::device_count(); }); });
}

}  // namespace fastload
