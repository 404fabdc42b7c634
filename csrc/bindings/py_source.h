// A map-style Python dataset as a batch source (fastload._C.PythonSource): the collation threads
// call the dataset's __getitem__ (or __getitems__) with the GIL, and write each sample's fields
// straight into the batch's part buffers (page-locked for a GPU): no per-sample Python beyond the
// user's own call, no torch.stack, no intermediate batch. A sample is a tree (dicts, tuples,
// lists, namedtuples) whose leaves are arrays, tensors, scalars (parts of the batch) or other
// objects (strings, bytes, ...: lists in the batch). The first sample fixes the tree, every
// leaf's dtype and shape; fastload._sources.python infers it and hands it here.
#pragma once
#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bindings/python_ref.h"
#include "core/batch_source.h"

namespace fastload {

// How a leaf of the sample tree is stored.
enum class LeafKind {
  Array,   // a numpy array / tensor / numpy scalar: `shape` and `dtype` fixed by the first sample
  Int,     // a Python int -> int64
  Float,   // a Python float -> float32
  Bool,    // a Python bool -> bool
  Ragged,  // an array whose first axis varies: padded to max_length, plus a <name>_lengths part
  Object,  // anything else: a list per batch
};

struct Leaf {
  std::string name;  // the field's path ("image", "meta.id", "0")
  LeafKind kind;
  DType dtype;
  std::vector<int64_t> shape;  // of one sample (Ragged: the shape of one item, after the first axis)
  size_t row_bytes = 0;        // bytes per sample in its part (Ragged: the padded slot)
  size_t item_bytes = 0;       // Ragged: bytes of one item
  int64_t max_length = 0;      // Ragged: items in a slot
  std::vector<std::byte> pad;  // Ragged: one element of the pad value
  int part = -1;               // its part (Ragged: the slot; the lengths are part + 1)
  int object = -1;             // Object: its list in the batch's extras
};

// The sample's structure: inner nodes and leaves (index into the leaves).
struct TreeNode {
  enum Kind { Dict, Tuple, List, NamedTuple, LeafNode } kind = LeafNode;
  std::vector<PyRef> keys;        // Dict: the keys, as the first sample had them
  PyRef type;                     // NamedTuple: the class
  std::vector<TreeNode> children;
  int leaf = -1;
};

// A failure in the user's code or in a sample's contents; `exception` is the Python exception
// (with its traceback) when the user's code raised, else null.
class SampleError : public std::runtime_error {
 public:
  SampleError(const std::string& message, std::shared_ptr<PyRef> exception)
      : std::runtime_error(message), exception_(std::move(exception)) {}
  const std::shared_ptr<PyRef>& exception() const { return exception_; }

 private:
  std::shared_ptr<PyRef> exception_;
};

// What a batch carries besides its parts: the lists of object fields (or collate_fn's result), as
// a Python object when built in this process, or pickled when a worker process built it.
struct BatchExtras {
  PyRef object;
  std::string pickled;
};

class WorkerPool;
struct FieldPath;  // where a value sits in the sample, for error messages (py_source.cpp)

class PythonSource final : public BatchSource {
 public:
  // dataset: the map-style dataset; getitems: its __getitems__ bound method or None; collate: a
  // collate_fn or None (then the batch is what it returns, carried whole in the extras). The GIL
  // must be held.
  // worker_init: called as worker_init(worker_index) on each collation thread before its first
  // fetch, or None.
  PythonSource(pybind11::object dataset, pybind11::object getitems, pybind11::object collate,
               pybind11::object worker_init, std::vector<Leaf> leaves, TreeNode tree, int64_t size, int num_objects);
  const std::vector<PartSchema>& schema() const override { return schema_; }
  int64_t size() const override { return size_; }
  // Builds the batch here (threads), or has worker process `request.thread` build it.
  void fill(const FillRequest& request) override;
  // Builds the batch in this process: calls the dataset and writes the parts (the GIL is taken).
  void fill_local(const FillRequest& request);
  // From now on batches are built by these worker processes (null: by the collation threads).
  // Only between epochs: fill() reads it without a lock.
  void set_workers(std::shared_ptr<WorkerPool> workers);
  bool has_workers() const;

  // Turns a batch's parts (torch tensors, in schema order) and extras back into the sample's
  // structure; `loader_parts` (index, valid) are added to a dict batch. GIL held.
  pybind11::object assemble(const std::vector<pybind11::object>& parts, const std::shared_ptr<void>& extras,
                            const std::vector<std::pair<pybind11::str, pybind11::object>>& loader_parts) const;

  // Nanoseconds spent inside the dataset's own code (all threads), since the last reset.
  int64_t user_ns() const { return user_ns_.load(std::memory_order_relaxed); }
  void reset_user_ns() { user_ns_.store(0, std::memory_order_relaxed); }
  // A call into the dataset running for more than `limit`: "" if none, else which sample and
  // for how long (for the loader's timeout=).
  std::string overdue(std::chrono::milliseconds limit) const;
  bool collates() const { return collate_.get() != nullptr; }
  // The collation threads were left behind (stuck in the dataset): their call slots are kept for
  // them but no longer read, so that the fresh threads that take their indices start clean (no
  // stale overdue call, worker_init_fn runs on each).
  void retire_calls();
  // Visits every Python object this source holds a reference to (for the cycle collector, through
  // the BatchSource handle that owns it; see bindings/source.h).
  int traverse(visitproc visit, void* arg) const;

 private:
  void write(const TreeNode& node, PyObject* value, int64_t row, int64_t id, std::byte* const* parts,
             PyObject* objects, const FieldPath& path) const;
  void write_leaf(const Leaf& leaf, PyObject* value, int64_t row, int64_t id, std::byte* const* parts,
                  PyObject* objects) const;
  pybind11::object build(const TreeNode& node, const std::vector<pybind11::object>& parts, PyObject* objects) const;

  PyRef dataset_, getitems_, collate_, worker_init_;
  PyRef ascontiguous_, int16_;  // numpy.ascontiguousarray, torch.int16
  PyRef loads_;                 // pickle.loads, for extras a worker process pickled
  std::shared_ptr<WorkerPool> workers_;  // atomic loads and stores only
  std::vector<Leaf> leaves_;
  TreeNode tree_;
  std::vector<PartSchema> schema_;
  int64_t size_;
  int num_objects_;
  mutable std::atomic<int64_t> user_ns_{0};
  // The call each thread is in: sample id and start (steady clock ns), or id -1.
  struct Call {
    std::atomic<int64_t> id{-1};
    std::atomic<bool> batch{false};  // a whole batch in a worker process, starting at `id`
    std::atomic<int64_t> since_ns{0};  // CLOCK_MONOTONIC_COARSE
    bool initialized = false;  // worker_init ran on this thread (touched by that thread only)
  };
  mutable std::mutex calls_mutex_;
  mutable std::vector<std::unique_ptr<Call>> calls_;  // by collation thread; grows under calls_mutex_
  std::vector<std::unique_ptr<Call>> retired_calls_;  // of threads left behind (they may still write)
  Call& call_slot(int thread) const;
};

// Sets the Python error for a failed sample: fastload.SampleError(message), chained (__cause__) to
// the dataset's own exception, with a worker process's traceback text appended. GIL held.
void set_sample_error(const SampleError& error, const std::string& message);

// The (seed, epoch, sample id) of the sample the calling thread is fetching, for
// fastload.sample_rng(); false outside a fetch.
bool current_sample(uint64_t* seed, int64_t* epoch, int64_t* id);

}  // namespace fastload
