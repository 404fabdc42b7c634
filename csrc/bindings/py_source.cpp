// A Python dataset as a batch source; see py_source.h.
#include "bindings/py_source.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <time.h>

#include <algorithm>
#include <cstring>

#include "bindings/hooks.h"
#include "bindings/process_workers.h"
#include "bindings/register.h"
#include "bindings/source.h"
#include "core/array_source.h"

namespace py = pybind11;

namespace fastload {

namespace {

// Copies at least this large run with the GIL released: other threads' Python runs meanwhile.
constexpr size_t kReleaseGilBytes = 256 * 1024;

struct SampleContext {
  bool active = false;
  uint64_t seed = 0;
  int64_t epoch = 0;
  int64_t id = -1;
};
thread_local SampleContext t_sample;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// When the call a thread is in began, for timeout=: the coarse clock (a few ms of resolution,
// plenty for a timeout) costs ~8 ns a read where steady_clock costs ~45 ns on the benchmark VM,
// and a small sample's whole __getitem__ can take well under a microsecond.
int64_t coarse_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

// Time in the dataset's own code (stats' user_s): two steady_clock reads around every
// __getitem__ cost ~90 ns on a VM, a sixth of a small sample's whole cost. Instead the loop over a
// batch's samples is timed whole, and fastload's own part of it (writing a sample into the batch)
// is timed for one sample in kTimeStride, each timing standing for the samples up to the next.
// That part is short and steady, so the estimate is close; sampling __getitem__ itself was biased
// low, because its rare long pauses (the garbage collector, being descheduled) were caught by a
// timed sample only one time in kTimeStride and then capped.
constexpr int64_t kTimeStride = 8;


// The Python exception being raised, taken out of the interpreter's error state with its traceback.
std::shared_ptr<PyRef> fetch_exception() {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value && tb) PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return std::make_shared<PyRef>(PyRef::steal(value));
}

std::string type_name(PyObject* o) { return o ? Py_TYPE(o)->tp_name : "NULL"; }

std::string describe(PyObject* exc) {
  if (!exc) return "an unknown error";
  std::string text = type_name(exc);
  PyObject* s = PyObject_Str(exc);
  if (s) {
    const char* c = PyUnicode_AsUTF8(s);
    if (c && *c) text += std::string(": ") + c;
    Py_DECREF(s);
  }
  PyErr_Clear();
  return text;
}

[[noreturn]] void user_error(int64_t id, const char* call) {
  auto exc = fetch_exception();
  const std::string message = std::string(call) + "(" + std::to_string(id) + ") raised " + describe(exc->get());
  throw SampleError(message, std::move(exc));
}

[[noreturn]] void field_error(int64_t id, const std::string& field, const std::string& what) {
  PyErr_Clear();
  throw SampleError("sample " + std::to_string(id) + ", field '" + field + "': " + what, nullptr);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

std::string dtype_text(DType d) {
  switch (d.code) {
    case kInt: return "int" + std::to_string(d.bits);
    case kUInt: return "uint" + std::to_string(d.bits);
    case kFloat: return "float" + std::to_string(d.bits);
    case kBFloat: return "bfloat16";
    case kComplex: return "complex" + std::to_string(d.bits);
    case kBool: return "bool";
  }
  return "?";
}

// The element type a buffer's struct-module format names, or false (big-endian, records, ...).
bool format_dtype(const char* fmt, Py_ssize_t itemsize, DType* out) {
  if (!fmt) fmt = "B";
  while (*fmt == '<' || *fmt == '=' || *fmt == '@') ++fmt;
  const uint8_t bits = static_cast<uint8_t>(itemsize * 8);
  switch (*fmt) {
    case '?': *out = {kBool, 8}; return itemsize == 1;
    case 'b': case 'h': case 'i': case 'l': case 'q': case 'n': *out = {kInt, bits}; return true;
    case 'B': case 'H': case 'I': case 'L': case 'Q': case 'N': *out = {kUInt, bits}; return true;
    case 'e': case 'f': case 'd': *out = {kFloat, bits}; return true;
    case 'Z': *out = {kComplex, bits}; return true;
    default: return false;
  }
}

// A C-contiguous view of an array-like value (numpy array or scalar, CPU torch tensor).
class Buffer {
 public:
  ~Buffer() {
    if (ok_) PyBuffer_Release(&view_);
  }
  // False (with no Python error set) if the value is not array-like.
  bool take(PyObject* value, PyObject* ascontiguous, PyObject* int16) {
    PyObject* obj = value;
    if (!PyObject_CheckBuffer(obj)) {
      if (!PyObject_HasAttrString(obj, "numpy") || !PyObject_HasAttrString(obj, "detach")) return false;
      PyRef detached = PyRef::steal(PyObject_CallMethod(obj, "detach", nullptr));
      if (!detached) return fail();
      // torch.bfloat16 has no numpy type: its bits travel as int16 (the part is typed bfloat16).
      PyRef dtype = PyRef::steal(PyObject_GetAttrString(detached.get(), "dtype"));
      if (dtype && type_name(dtype.get()) == std::string("torch.dtype")) {
        PyRef name = PyRef::steal(PyObject_Str(dtype.get()));
        const char* n = name ? PyUnicode_AsUTF8(name.get()) : nullptr;
        if (n && std::string(n) == "torch.bfloat16") {
          detached = PyRef::steal(PyObject_CallMethod(detached.get(), "view", "O", int16));
          if (!detached) return fail();
          bfloat16_ = true;
        }
      }
      PyErr_Clear();
      holder_ = PyRef::steal(PyObject_CallMethod(detached.get(), "numpy", nullptr));
      if (!holder_) {
        // A conjugate or negative view (x.conj()) has no numpy form until it is resolved: resolve
        // it here (a copy), only on this rare path.
        PyErr_Clear();
        PyRef resolved = PyRef::steal(PyObject_CallMethod(detached.get(), "resolve_conj", nullptr));
        if (resolved) resolved = PyRef::steal(PyObject_CallMethod(resolved.get(), "resolve_neg", nullptr));
        if (resolved) holder_ = PyRef::steal(PyObject_CallMethod(resolved.get(), "numpy", nullptr));
      }
      if (!holder_) return fail();
      obj = holder_.get();
    }
    if (PyObject_GetBuffer(obj, &view_, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) return ok_ = true;
    PyErr_Clear();
    PyRef copy = PyRef::steal(PyObject_CallFunctionObjArgs(ascontiguous, obj, nullptr));  // not contiguous
    if (!copy) return fail();
    holder_ = std::move(copy);
    if (PyObject_GetBuffer(holder_.get(), &view_, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return fail();
    return ok_ = true;
  }
  bool dtype(DType* out) const {
    if (bfloat16_) {
      *out = {kBFloat, 16};
      return true;
    }
    return format_dtype(view_.format, view_.itemsize, out);
  }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(view_.shape, view_.shape + view_.ndim); }
  // Whether the shape is `shape` (skip = 0), or `shape` after its first `skip` axes; no allocation.
  bool shape_is(const std::vector<int64_t>& shape, int skip = 0) const {
    if (view_.ndim != static_cast<int>(shape.size()) + skip) return false;
    for (size_t k = 0; k < shape.size(); ++k)
      if (view_.shape[k + static_cast<size_t>(skip)] != shape[k]) return false;
    return true;
  }
  int64_t first_axis() const { return view_.ndim ? view_.shape[0] : 0; }
  const std::byte* data() const { return static_cast<const std::byte*>(view_.buf); }
  size_t bytes() const { return static_cast<size_t>(view_.len); }

 private:
  bool fail() {
    PyErr_Clear();
    return false;
  }
  Py_buffer view_{};
  bool ok_ = false;
  bool bfloat16_ = false;
  PyRef holder_;
};

void copy_bytes(std::byte* dst, const std::byte* src, size_t bytes) {
  if (bytes >= kReleaseGilBytes) {
    Py_BEGIN_ALLOW_THREADS std::memcpy(dst, src, bytes);
    Py_END_ALLOW_THREADS
  } else if (bytes) {
    std::memcpy(dst, src, bytes);
  }
}

// Sets the calling thread's sample context for fastload.sample_rng() for one call.
class SampleScope {
 public:
  SampleScope(uint64_t seed, int64_t epoch, int64_t id) { t_sample = {true, seed, epoch, id}; }
  ~SampleScope() { t_sample = {}; }
};

}  // namespace

// Where a value sits in the sample ("meta.boxes.0"), built only for an error message: building
// it for every field of every sample cost a string per field.
struct FieldPath {
  const FieldPath* parent = nullptr;
  PyObject* key = nullptr;  // a dict key (str), or null for a sequence index
  Py_ssize_t index = 0;
  std::string text() const {
    std::string head = parent ? parent->text() : std::string();
    std::string part;
    if (key) {
      const char* k = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : nullptr;
      part = k ? k : "?";
    } else {
      part = std::to_string(index);
    }
    if (!parent) return "<sample>";  // the root names the whole sample
    return head == "<sample>" ? part : head + "." + part;
  }
};

bool current_sample(uint64_t* seed, int64_t* epoch, int64_t* id) {
  if (!t_sample.active) return false;
  *seed = t_sample.seed;
  *epoch = t_sample.epoch;
  *id = t_sample.id;
  return true;
}

namespace {
int traverse_tree(const TreeNode& node, visitproc visit, void* arg) {
  for (const PyRef& key : node.keys) Py_VISIT(key.get());
  Py_VISIT(node.type.get());
  for (const TreeNode& child : node.children) {
    if (const int r = traverse_tree(child, visit, arg)) return r;
  }
  return 0;
}
}  // namespace

int PythonSource::traverse(visitproc visit, void* arg) const {
  for (const PyRef* r : {&dataset_, &getitems_, &collate_, &worker_init_, &ascontiguous_, &int16_, &loads_})
    Py_VISIT(r->get());
  return traverse_tree(tree_, visit, arg);
}

PythonSource::PythonSource(py::object dataset, py::object getitems, py::object collate, py::object worker_init,
                           std::vector<Leaf> leaves, TreeNode tree, int64_t size, int num_objects)
    : dataset_(PyRef::borrow(dataset.ptr())), leaves_(std::move(leaves)), tree_(std::move(tree)), size_(size),
      num_objects_(num_objects) {
  if (!getitems.is_none()) getitems_ = PyRef::borrow(getitems.ptr());
  if (!collate.is_none()) collate_ = PyRef::borrow(collate.ptr());
  if (!worker_init.is_none()) worker_init_ = PyRef::borrow(worker_init.ptr());
  ascontiguous_ = PyRef::borrow(py::module_::import("numpy").attr("ascontiguousarray").ptr());
  int16_ = PyRef::borrow(py::module_::import("torch").attr("int16").ptr());
  loads_ = PyRef::borrow(py::module_::import("pickle").attr("loads").ptr());
  for (Leaf& leaf : leaves_) {
    switch (leaf.kind) {
      case LeafKind::Object:
        break;
      case LeafKind::Ragged: {
        leaf.part = static_cast<int>(schema_.size());
        std::vector<int64_t> shape{leaf.max_length};
        shape.insert(shape.end(), leaf.shape.begin(), leaf.shape.end());
        schema_.push_back({leaf.name, leaf.dtype, shape, leaf.row_bytes});
        schema_.push_back({ragged_lengths_name(leaf.name), kInt64, {}, sizeof(int64_t)});
        break;
      }
      default:
        leaf.part = static_cast<int>(schema_.size());
        schema_.push_back({leaf.name, leaf.dtype, leaf.shape, leaf.row_bytes});
    }
  }
}

PythonSource::Call& PythonSource::call_slot(int thread) const {
  std::lock_guard<std::mutex> lock(calls_mutex_);
  while (calls_.size() <= static_cast<size_t>(thread)) calls_.push_back(std::make_unique<Call>());
  return *calls_[static_cast<size_t>(thread)];
}

void PythonSource::retire_calls() {
  std::lock_guard<std::mutex> lock(calls_mutex_);
  for (auto& call : calls_) retired_calls_.push_back(std::move(call));
  calls_.clear();
}

std::string PythonSource::overdue(std::chrono::milliseconds limit) const {
  const int64_t now = coarse_now_ns();  // the clock since_ns is read from
  std::lock_guard<std::mutex> lock(calls_mutex_);
  for (size_t t = 0; t < calls_.size(); ++t) {
    const int64_t id = calls_[t]->id.load(std::memory_order_acquire);
    const int64_t since = calls_[t]->since_ns.load(std::memory_order_acquire);
    if (id >= 0 && now - since > std::chrono::nanoseconds(limit).count()) {
      const std::string ms = std::to_string((now - since) / 1000000) + " ms";
      if (calls_[t]->batch.load(std::memory_order_acquire))
        return "the batch starting at dataset[" + std::to_string(id) + "] has not come back from worker process " +
               std::to_string(t) + " after " + ms;
      return "dataset[" + std::to_string(id) + "] has not returned after " + ms + " (worker thread " +
             std::to_string(t) + ")";
    }
  }
  return "";
}

void PythonSource::write_leaf(const Leaf& leaf, PyObject* value, int64_t row, int64_t id, std::byte* const* parts,
                              PyObject* objects) const {
  std::byte* dst = leaf.part >= 0 ? parts[leaf.part] + static_cast<size_t>(row) * leaf.row_bytes : nullptr;
  switch (leaf.kind) {
    case LeafKind::Object:
      if (PyList_Append(PyList_GET_ITEM(objects, leaf.object), value) != 0) user_error(id, "collating dataset");
      return;
    case LeafKind::Int: {
      if (!PyLong_Check(value) && !PyIndex_Check(value))
        field_error(id, leaf.name, std::string("is ") + type_name(value) + ", the first sample's was an int");
      const long long v = PyLong_AsLongLong(value);
      if (v == -1 && PyErr_Occurred()) field_error(id, leaf.name, "does not fit in int64");
      const int64_t x = v;
      std::memcpy(dst, &x, sizeof x);
      return;
    }
    case LeafKind::Float: {
      const double v = PyFloat_AsDouble(value);
      if (v == -1.0 && PyErr_Occurred())
        field_error(id, leaf.name, std::string("is ") + type_name(value) + ", the first sample's was a float");
      const float x = static_cast<float>(v);
      std::memcpy(dst, &x, sizeof x);
      return;
    }
    case LeafKind::Bool: {
      if (!PyBool_Check(value) && type_name(value) != std::string("numpy.bool") &&
          type_name(value) != std::string("numpy.bool_"))
        field_error(id, leaf.name, std::string("is ") + type_name(value) + ", the first sample's was a bool");
      const bool x = PyObject_IsTrue(value) == 1;
      std::memcpy(dst, &x, sizeof x);
      return;
    }
    case LeafKind::Array:
    case LeafKind::Ragged: {
      Buffer b;
      if (!b.take(value, ascontiguous_.get(), int16_.get()))
        field_error(id, leaf.name, std::string("is ") + type_name(value) + ", the first sample's was an array of " +
                                       dtype_text(leaf.dtype));
      DType dt;
      if (!b.dtype(&dt) || dt != leaf.dtype)
        field_error(id, leaf.name, "has dtype " + (b.dtype(&dt) ? dtype_text(dt) : std::string("?")) +
                                       ", the first sample's " + dtype_text(leaf.dtype));
      if (leaf.kind == LeafKind::Array) {
        if (!b.shape_is(leaf.shape))
          field_error(id, leaf.name, "has shape " + shape_text(b.shape()) + ", the first sample's " +
                                         shape_text(leaf.shape) +
                                         " (for a varying first axis, pass pad= and max_length= for this field)");
        copy_bytes(dst, b.data(), leaf.row_bytes);
        return;
      }
      if (!b.shape_is(leaf.shape, 1))
        field_error(id, leaf.name, "has shape " + shape_text(b.shape()) + "; a padded field's items must have shape " +
                                       shape_text(leaf.shape));
      const int64_t items = std::min(b.first_axis(), leaf.max_length);
      const size_t bytes = static_cast<size_t>(items) * leaf.item_bytes;
      copy_bytes(dst, b.data(), bytes);
      const size_t n = leaf.pad.size();
      if (n) {
        const bool uniform = std::all_of(leaf.pad.begin(), leaf.pad.end(), [&](std::byte x) { return x == leaf.pad[0]; });
        if (uniform)
          std::memset(dst + bytes, static_cast<int>(leaf.pad[0]), leaf.row_bytes - bytes);
        else
          for (size_t k = bytes; k < leaf.row_bytes; k += n) std::memcpy(dst + k, leaf.pad.data(), n);
      }
      std::memcpy(parts[leaf.part + 1] + static_cast<size_t>(row) * sizeof(int64_t), &items, sizeof items);
      return;
    }
  }
}

void PythonSource::write(const TreeNode& node, PyObject* value, int64_t row, int64_t id, std::byte* const* parts,
                         PyObject* objects, const FieldPath& path) const {
  switch (node.kind) {
    case TreeNode::LeafNode:
      return write_leaf(leaves_[static_cast<size_t>(node.leaf)], value, row, id, parts, objects);
    case TreeNode::Dict: {
      if (!PyMapping_Check(value) || PySequence_Check(value))
        field_error(id, path.text(), std::string("is ") + type_name(value) + ", the first sample's was a dict");
      for (size_t k = 0; k < node.keys.size(); ++k) {
        PyObject* key = node.keys[k].get();
        // An exact dict is read without a call (a borrowed reference); other mappings by __getitem__.
        PyRef child = PyDict_CheckExact(value) ? PyRef::borrow(PyDict_GetItemWithError(value, key))
                                               : PyRef::steal(PyObject_GetItem(value, key));
        const FieldPath sub{&path, key, 0};
        if (!child) {
          if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_KeyError))
            field_error(id, sub.text(), "is missing (the first sample has it)");
          user_error(id, "dataset");
        }
        write(node.children[k], child.get(), row, id, parts, objects, sub);
      }
      return;
    }
    default: {
      // A tuple or list like the first sample: not any sequence (bytes, a dict read by its keys, an
      // array), which would be batched as wrong values.
      if (!PyTuple_Check(value) && !PyList_Check(value))
        field_error(id, path.text(), std::string("is ") + type_name(value) + ", the first sample's was a " +
                                         (node.kind == TreeNode::List ? "list" : "tuple"));
      PyRef seq = PyRef::steal(PySequence_Fast(value, "not a sequence"));
      if (!seq) user_error(id, "dataset");
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.get());
      if (static_cast<size_t>(n) != node.children.size())
        field_error(id, path.text(), "has " + std::to_string(n) + " elements, the first sample's " +
                                         std::to_string(node.children.size()));
      for (Py_ssize_t k = 0; k < n; ++k) {
        const FieldPath sub{&path, nullptr, k};
        write(node.children[static_cast<size_t>(k)], PySequence_Fast_GET_ITEM(seq.get(), k), row, id, parts, objects, sub);
      }
    }
  }
}

void PythonSource::set_workers(std::shared_ptr<WorkerPool> workers) { std::atomic_store(&workers_, std::move(workers)); }

bool PythonSource::has_workers() const { return std::atomic_load(&workers_) != nullptr; }

void PythonSource::fill(const FillRequest& r) {
  std::shared_ptr<WorkerPool> workers = std::atomic_load(&workers_);
  if (!workers) return fill_local(r);
  Call& call = call_slot(r.thread);
  const int64_t t0 = now_ns();
  call.batch.store(true, std::memory_order_release);
  call.since_ns.store(coarse_now_ns(), std::memory_order_release);
  call.id.store(r.count ? r.ids[0] : 0, std::memory_order_release);
  std::string payload;
  try {
    payload = workers->run(r, schema_.size());
  } catch (...) {
    call.id.store(-1, std::memory_order_release);
    throw;
  }
  call.id.store(-1, std::memory_order_release);
  user_ns_.fetch_add(now_ns() - t0, std::memory_order_relaxed);  // the worker's whole batch
  if (!payload.empty()) {
    auto extras = std::make_shared<BatchExtras>();
    extras->pickled = std::move(payload);
    *r.extras = std::move(extras);
  }
}

void PythonSource::fill_local(const FillRequest& r) {
  GilScope gil;
  Call& call = call_slot(r.thread);
  int64_t user = 0;  // this batch's time in the dataset's code
  if (worker_init_ && !call.initialized) {
    call.initialized = true;  // once per thread, whatever it does: a failure fails this batch
    PyRef index = PyRef::steal(PyLong_FromLong(r.thread));
    PyRef done = PyRef::steal(PyObject_CallFunctionObjArgs(worker_init_.get(), index.get(), nullptr));
    if (!done) {
      auto exc = fetch_exception();
      throw SampleError("worker_init_fn(" + std::to_string(r.thread) + ") raised " + describe(exc->get()), exc);
    }
  }
  PyRef objects;
  if (num_objects_ > 0 && !collate_) {
    objects = PyRef::steal(PyList_New(num_objects_));
    if (!objects) user_error(-1, "collating dataset");
    for (int k = 0; k < num_objects_; ++k) PyList_SET_ITEM(objects.get(), k, PyList_New(0));
  }
  PyRef samples;  // __getitems__'s result, or the samples for collate_fn
  if (getitems_) {
    PyRef ids = PyRef::steal(PyList_New(r.count));
    for (int64_t i = 0; i < r.count; ++i) PyList_SET_ITEM(ids.get(), i, PyLong_FromLongLong(r.ids[i]));
    const int64_t t0 = now_ns();
    call.since_ns.store(coarse_now_ns(), std::memory_order_release);
    call.id.store(r.count ? r.ids[0] : 0, std::memory_order_release);
    {
      SampleScope scope(r.seed, r.epoch, -1);  // several samples: sample_rng(i) names its own
      samples = PyRef::steal(PyObject_CallFunctionObjArgs(getitems_.get(), ids.get(), nullptr));
    }
    call.id.store(-1, std::memory_order_release);
    user += now_ns() - t0;
    if (!samples) user_error(r.count ? r.ids[0] : 0, "dataset.__getitems__");
    samples = PyRef::steal(PySequence_Fast(samples.get(), "__getitems__ must return a sequence"));
    if (!samples) user_error(r.count ? r.ids[0] : 0, "dataset.__getitems__");
    if (PySequence_Fast_GET_SIZE(samples.get()) != r.count) {
      PyErr_Clear();
      throw SampleError("dataset.__getitems__ returned " + std::to_string(PySequence_Fast_GET_SIZE(samples.get())) +
                            " samples for " + std::to_string(r.count) + " indices",
                        nullptr);
    }
  } else if (collate_) {
    samples = PyRef::steal(PyList_New(r.count));
  }
  const int64_t loop_t0 = now_ns();
  int64_t own = 0;  // fastload's part of the loop: sampled writes, each standing for kTimeStride samples
  for (int64_t i = 0; i < r.count; ++i) {
    const int64_t id = r.ids[i];
    PyRef owned;
    PyObject* sample;
    if (getitems_) {
      sample = PySequence_Fast_GET_ITEM(samples.get(), i);
    } else {
      PyRef key = PyRef::steal(PyLong_FromLongLong(id));
      call.since_ns.store(coarse_now_ns(), std::memory_order_release);
      call.id.store(id, std::memory_order_release);
      {
        SampleScope scope(r.seed, r.epoch, id);
        owned = PyRef::steal(PyObject_GetItem(dataset_.get(), key.get()));
      }
      call.id.store(-1, std::memory_order_release);
      if (!owned) user_error(id, "dataset.__getitem__");
      sample = owned.get();
    }
    if (collate_) {
      Py_INCREF(sample);
      if (!getitems_) PyList_SET_ITEM(samples.get(), i, sample);
      else Py_DECREF(sample);
      continue;
    }
    const bool timing = !getitems_ && i % kTimeStride == 0;  // `own` is read only without __getitems__
    const int64_t w0 = timing ? now_ns() : 0;
    write(tree_, sample, i, id, r.parts, objects.get(), FieldPath{});
    if (timing) own += (now_ns() - w0) * std::min(kTimeStride, r.count - i);
  }
  // With __getitems__ the loop only writes (its call was timed above); else it is the calls and
  // the writes.
  if (!getitems_) user += std::max<int64_t>(0, now_ns() - loop_t0 - own);
  if (collate_) {
    const int64_t t0 = now_ns();
    PyRef batch = PyRef::steal(PyObject_CallFunctionObjArgs(collate_.get(), samples.get(), nullptr));
    user += now_ns() - t0;
    if (!batch) {
      user_ns_.fetch_add(user, std::memory_order_relaxed);
      user_error(r.count ? r.ids[0] : 0, "collate_fn(batch starting at dataset");
    }
    auto extras = std::make_shared<BatchExtras>();
    extras->object = std::move(batch);
    *r.extras = std::move(extras);
  } else if (objects) {
    auto extras = std::make_shared<BatchExtras>();
    extras->object = std::move(objects);
    *r.extras = std::move(extras);
  }
  user_ns_.fetch_add(user, std::memory_order_relaxed);
}

py::object PythonSource::build(const TreeNode& node, const std::vector<py::object>& parts, PyObject* objects) const {
  switch (node.kind) {
    case TreeNode::LeafNode: {
      const Leaf& leaf = leaves_[static_cast<size_t>(node.leaf)];
      if (leaf.kind == LeafKind::Object) return py::reinterpret_borrow<py::object>(PyList_GET_ITEM(objects, leaf.object));
      return parts[static_cast<size_t>(leaf.part)];
    }
    case TreeNode::Dict: {
      py::dict d;
      for (size_t k = 0; k < node.keys.size(); ++k) {
        py::handle key(node.keys[k].get());
        d[key] = build(node.children[k], parts, objects);
        const TreeNode& child = node.children[k];
        if (child.kind == TreeNode::LeafNode && leaves_[static_cast<size_t>(child.leaf)].kind == LeafKind::Ragged) {
          const Leaf& leaf = leaves_[static_cast<size_t>(child.leaf)];
          d[py::str(ragged_lengths_name(py::str(key).cast<std::string>()))] = parts[static_cast<size_t>(leaf.part + 1)];
        }
      }
      return std::move(d);
    }
    default: {
      py::tuple t(node.children.size());
      for (size_t k = 0; k < node.children.size(); ++k) t[k] = build(node.children[k], parts, objects);
      if (node.kind == TreeNode::Tuple) return std::move(t);
      if (node.kind == TreeNode::List) return py::list(t);
      // A namedtuple through tuple.__new__ (C code), not the class's Python __new__.
      return py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(&PyTuple_Type))
          .attr("__new__")(py::handle(node.type.get()), t);
    }
  }
}

py::object PythonSource::assemble(const std::vector<py::object>& parts, const std::shared_ptr<void>& extras,
                                  const std::vector<std::pair<py::str, py::object>>& loader_parts) const {
  auto* e = static_cast<BatchExtras*>(extras.get());
  if (e && !e->pickled.empty() && !e->object) {  // built by a worker process
    PyRef bytes = PyRef::steal(PyBytes_FromStringAndSize(e->pickled.data(), static_cast<Py_ssize_t>(e->pickled.size())));
    PyRef loaded = PyRef::steal(PyObject_CallFunctionObjArgs(loads_.get(), bytes.get(), nullptr));
    if (!loaded) throw py::error_already_set();
    e->object = std::move(loaded);
    e->pickled.clear();
  }
  PyObject* held = e ? e->object.get() : nullptr;
  if (collate_) return py::reinterpret_borrow<py::object>(held ? held : Py_None);
  py::object out = build(tree_, parts, held);
  if (!loader_parts.empty()) {
    py::dict d = out.cast<py::dict>();
    for (const auto& [name, value] : loader_parts) d[name] = value;
  }
  return out;
}

namespace {

TreeNode tree_from(const py::handle& desc) {
  // ("leaf", index) | ("dict", [keys], [children]) | ("tuple"|"list", [children])
  // | ("namedtuple", cls, [children])
  const py::tuple t = py::reinterpret_borrow<py::tuple>(desc);
  const std::string kind = t[0].cast<std::string>();
  TreeNode n;
  if (kind == "leaf") {
    n.kind = TreeNode::LeafNode;
    n.leaf = t[1].cast<int>();
    return n;
  }
  py::list children;
  if (kind == "dict") {
    n.kind = TreeNode::Dict;
    for (const py::handle& k : t[1]) n.keys.push_back(PyRef::borrow(k.ptr()));
    children = t[2];
  } else if (kind == "namedtuple") {
    n.kind = TreeNode::NamedTuple;
    n.type = PyRef::borrow(t[1].ptr());
    children = t[2];
  } else {
    n.kind = kind == "tuple" ? TreeNode::Tuple : TreeNode::List;
    children = t[1];
  }
  for (const py::handle& c : children) n.children.push_back(tree_from(c));
  return n;
}

LeafKind kind_from(const std::string& s) {
  if (s == "array") return LeafKind::Array;
  if (s == "int") return LeafKind::Int;
  if (s == "float") return LeafKind::Float;
  if (s == "bool") return LeafKind::Bool;
  if (s == "ragged") return LeafKind::Ragged;
  if (s == "object") return LeafKind::Object;
  throw std::invalid_argument("unknown leaf kind " + s);
}

}  // namespace

void set_sample_error(const SampleError& s, const std::string& what) {
  py::handle type = hooks::sample_error();
  std::string message = what;
  py::object cause = py::none();
  if (s.exception() && s.exception()->get()) cause = py::reinterpret_borrow<py::object>(s.exception()->get());
  if (const auto* w = dynamic_cast<const WorkerError*>(&s); w && !w->pickled().empty()) {
    // From a worker process: its exception (unpickled) and its traceback as text.
    try {
      py::tuple t = py::module_::import("pickle").attr("loads")(py::bytes(w->pickled()));
      cause = t[0];
      const std::string tb = t[1].cast<std::string>();
      if (!tb.empty()) message += "\n\nThe worker's traceback:\n" + tb;
    } catch (const py::error_already_set&) {
    }
  }
  py::object error = type(py::str(message));
  if (!cause.is_none()) PyException_SetCause(error.ptr(), cause.release().ptr());
  PyErr_SetObject(type.ptr(), error.ptr());
}

void register_python_source(py::module_& m) {
  // A sample's failure outside a collation thread (a worker process's fill_rows).
  py::register_exception_translator([](std::exception_ptr p) {
    if (!p) return;
    try {
      std::rethrow_exception(p);
    } catch (const SampleError& e) {
      set_sample_error(e, e.what());
    }
  });

  // leaves: [(name, kind, dl_code, bits, shape, row_bytes, item_bytes, max_length, pad bytes)];
  // tree: see tree_from; see fastload._sources.python for how both are inferred.
  m.def("PythonSource", [](py::object dataset, py::object getitems, py::object collate, py::object worker_init,
                           const py::list& leaf_list, const py::tuple& tree, int64_t size) {
    std::vector<Leaf> leaves;
    int objects = 0;
    for (const py::handle& h : leaf_list) {
      const py::tuple t = py::reinterpret_borrow<py::tuple>(h);
      Leaf leaf;
      leaf.name = t[0].cast<std::string>();
      leaf.kind = kind_from(t[1].cast<std::string>());
      leaf.dtype = {t[2].cast<uint8_t>(), t[3].cast<uint8_t>()};
      leaf.shape = t[4].cast<std::vector<int64_t>>();
      leaf.row_bytes = t[5].cast<size_t>();
      leaf.item_bytes = t[6].cast<size_t>();
      leaf.max_length = t[7].cast<int64_t>();
      const std::string pad = t[8].cast<std::string>();
      leaf.pad.resize(pad.size());
      std::memcpy(leaf.pad.data(), pad.data(), pad.size());
      if (leaf.kind == LeafKind::Object) leaf.object = objects++;
      leaves.push_back(std::move(leaf));
    }
    auto source = std::make_shared<PythonSource>(dataset, getitems, collate, worker_init, std::move(leaves),
                                                 tree_from(tree), size, objects);
    SourceHandle handle{source, dataset};
    handle.traverse_source = [](const BatchSource& s, visitproc visit, void* arg) {
      return static_cast<const PythonSource&>(s).traverse(visit, arg);
    };
    return handle;
  }, py::arg("dataset"), py::arg("getitems"), py::arg("collate"), py::arg("worker_init"), py::arg("leaves"),
     py::arg("tree"), py::arg("size"));

  py::class_<PythonSource, std::shared_ptr<PythonSource>>(m, "PythonSourceNative")
      // In a worker process: fetch `ids` and write them into the parts at `addresses` (its own
      // mappings of the main process's shared batch slots); returns the batch's extras or None.
      .def("fill_rows", [](PythonSource& s, py::array_t<int64_t, py::array::c_style> ids,
                           const std::vector<uintptr_t>& addresses, uint64_t seed, int64_t epoch, int64_t step,
                           int thread) -> py::object {
             if (addresses.size() != s.schema().size())
               throw std::invalid_argument("one address per part is needed");
             std::vector<std::byte*> parts;
             for (uintptr_t a : addresses) parts.push_back(reinterpret_cast<std::byte*>(a));
             std::shared_ptr<void> extras;
             FillRequest r;
             r.ids = ids.data();
             r.count = static_cast<int64_t>(ids.size());
             r.parts = parts.data();
             r.seed = seed;
             r.epoch = epoch;
             r.step = step;
             r.thread = thread;
             r.extras = &extras;
             s.fill_local(r);
             auto* e = static_cast<BatchExtras*>(extras.get());
             if (!e || !e->object) return py::none();
             return py::reinterpret_borrow<py::object>(e->object.get());
           });
  m.def("_python_source_native", [](const SourceHandle& h) {
    auto s = std::dynamic_pointer_cast<PythonSource>(h.source);
    if (!s) throw std::invalid_argument("not a Python source");
    return s;
  });
  // The main process's side of worker processes: sockets (fds), pids, and the shared memory the
  // batches live in; None detaches them (collation threads build batches again).
  m.def("_attach_workers", [](const SourceHandle& h, py::object fds, py::object pids, py::object memory) {
    auto s = std::dynamic_pointer_cast<PythonSource>(h.source);
    if (!s) throw std::invalid_argument("not a Python source");
    if (fds.is_none()) return s->set_workers(nullptr);
    s->set_workers(std::make_shared<WorkerPool>(fds.cast<std::vector<int>>(), pids.cast<std::vector<int64_t>>(),
                                                memory.cast<std::shared_ptr<SharedMemoryAllocator>>()));
  });
  py::class_<SharedMemoryAllocator, std::shared_ptr<SharedMemoryAllocator>>(
      m, "SharedMemory", "Host buffers worker processes can map (memfd segments).")
      .def(py::init<>());

  // fastload.sample_rng(): (seed, epoch, sample id) of the sample this thread is fetching, or None.
  m.def("_sample_context", []() -> py::object {
    uint64_t seed;
    int64_t epoch, id;
    if (!current_sample(&seed, &epoch, &id)) return py::none();
    return py::make_tuple(seed, epoch, id);
  });
}

}  // namespace fastload
