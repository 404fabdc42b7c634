// One epoch of batches: native threads build batches in parallel (sample ids, then a gather of
// every column into one host buffer) and each output hands them out in order, with at most
// `prefetch` batches built ahead per output.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/buffer_pool.h"
#include "core/gather.h"
#include "core/sampler.h"

namespace fastload {

// Where each part of a batch lives inside its buffer; the same for every batch of a loader.
struct BatchLayout {
  std::vector<ColumnSpec> columns;
  bool with_index = false;  // int64 sample ids
  bool with_valid = false;  // bool, false on padding
  int64_t max_rows = 0;
  std::vector<size_t> column_offsets;  // then index_offset, valid_offset
  size_t index_offset = 0, valid_offset = 0, total_bytes = 0;

  BatchLayout(std::vector<ColumnSpec> columns, bool with_index, bool with_valid, int64_t max_rows);
};

struct Batch {
  std::shared_ptr<HostBuffer> buffer;
  int64_t rows = 0;
  int64_t step = 0;
};

enum class NextStatus { Ok, End, Timeout };

class Pipeline {
 public:
  // One plan per output (device); all share the layout's column sources and the buffer pool.
  Pipeline(std::shared_ptr<const BatchLayout> layout, std::vector<EpochPlan> plans,
           int64_t prefetch, std::shared_ptr<BufferPool> pool, int64_t fail_at_step = -1);
  ~Pipeline();

  // Run by every pool thread; returns when all batches are built, on failure, or on cancel.
  void work();
  // Stops the workers soon; batches already handed out stay valid.
  void cancel();
  // After cancel() and once no worker runs any more: built batches nobody can take now (next()
  // throws after cancel) go back to the pool, instead of when the last Python reference dies.
  void release_unconsumed();

  // The consumer side: the next batch of `output` in order. Returns End after the last batch,
  // Timeout if none arrived in time (so the caller can check for signals), and throws
  // std::runtime_error with the worker's message if a worker failed.
  NextStatus next(int output, std::chrono::milliseconds timeout, Batch* out);

  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  const EpochPlan& plan(int output) const { return outputs_[output]->plan; }
  int64_t handed_out(int output) const;

 private:
  struct Slot {
    int64_t step = -1;
    bool ready = false;
    Batch batch;
  };
  struct Output {
    EpochPlan plan;
    int64_t next_claim = 0;
    int64_t consumed = 0;
    bool consumer_waiting = false;
    std::vector<Slot> slots;  // ring indexed by step % prefetch
    std::condition_variable ready_cv;
    explicit Output(EpochPlan p) : plan(std::move(p)) {}
  };

  bool claim(int* output, int64_t* step);  // under mutex_; false when nothing is left to claim
  bool worth_waking(const Output& o) const;  // under mutex_
  void fail_locked(const std::string& message);  // under mutex_: records, wakes everyone
  void build(int output, int64_t step, std::vector<int64_t>& ids_scratch, Batch* batch);

  std::shared_ptr<const BatchLayout> layout_;
  const int64_t prefetch_;
  // A waiting consumer is woken once this many batches are ready in a row, and then takes them
  // without sleeping: one sleep and wake-up per several batches instead of per batch.
  const int64_t wake_batch_;
  std::shared_ptr<BufferPool> pool_;
  const int64_t fail_at_step_;
  const uint64_t fork_generation_;  // a forked child must not take mutex_ (see fork_guard.h)
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::vector<std::unique_ptr<Output>> outputs_;  // condition variables do not move
  bool cancelled_ = false;
  std::string error_;  // first worker failure; non-empty = failed
};

}  // namespace fastload
