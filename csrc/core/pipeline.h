// One epoch of batches: native threads build batches in parallel (sample ids, then a gather of
// every column into its own host buffer) and each output hands them out in order, with at most
// `prefetch` batches per output between being claimed by a thread and leaving the loader's hands.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/batch_layout.h"
#include "core/batch_plan.h"
#include "core/batch_source.h"
#include "core/buffer_pool.h"
#include "core/sampler.h"
#include "core/stage_times.h"

namespace fastload {

struct Batch {
  std::vector<std::shared_ptr<HostBuffer>> parts;  // one per layout part
  int64_t rows = 0;
  int64_t step = 0;
  std::shared_ptr<void> extras;  // what the source attached besides the parts (see FillRequest)
};

enum class NextStatus { Ok, End, Timeout, Cancelled };

// A collation thread failed. Keeps the original exception (so std::bad_alloc stays a memory
// error in Python) and says which batch of which epoch it was.
class CollationError : public std::runtime_error {
 public:
  CollationError(const std::string& message, std::exception_ptr original)
      : std::runtime_error(message), original_(std::move(original)) {}
  const std::exception_ptr& original() const { return original_; }

 private:
  std::exception_ptr original_;
};

struct OutputSpec {
  std::shared_ptr<const BatchPlan> plan;
  // A native consumer (a device's transfer thread) is woken for every batch, and a batch it
  // takes keeps its window place until it calls retire(); a Python consumer is woken once
  // several batches are ready (one wake-up per several batches), and taking a batch retires it.
  bool native_consumer = false;
  // Where this output's host buffers come from (Engine::start; null: its default). Outputs that
  // go to a GPU want page-locked memory; a CPU output of the same loader does not (a user's
  // non_blocking copy from page-locked memory is a DMA the loader cannot see finish).
  std::shared_ptr<HostAllocator> memory;

  OutputSpec(std::shared_ptr<const BatchPlan> p, bool native = false, std::shared_ptr<HostAllocator> m = nullptr)
      : plan(std::move(p)), native_consumer(native), memory(std::move(m)) {}
  OutputSpec(EpochPlan p, bool native = false, std::shared_ptr<HostAllocator> m = nullptr)
      : plan(std::make_shared<EpochPlan>(std::move(p))), native_consumer(native), memory(std::move(m)) {}
};

class Pipeline {
 public:
  // pools[o][p]: the buffer pool of part p for output o.
  Pipeline(std::shared_ptr<BatchSource> source, std::shared_ptr<const BatchLayout> layout,
           std::vector<OutputSpec> outputs, int64_t prefetch,
           std::vector<std::vector<std::shared_ptr<BufferPool>>> pools, int64_t fail_at_step = -1);
  // Every output's buffers from the same pools (one per part).
  Pipeline(std::shared_ptr<BatchSource> source, std::shared_ptr<const BatchLayout> layout,
           std::vector<OutputSpec> outputs, int64_t prefetch, const std::vector<std::shared_ptr<BufferPool>>& pools,
           int64_t fail_at_step = -1);
  ~Pipeline();

  // Run by every pool thread (`thread` is its index); returns when all batches are built, on
  // failure, or on cancel.
  void work(int thread = 0);
  // Stops the workers soon and wakes every consumer (their next() returns Cancelled).
  void cancel();
  bool cancelled() const;
  // After cancel() and once no worker runs any more: built batches nobody can take now go back
  // to the pool, instead of when the last reference to this pipeline dies.
  void release_unconsumed();

  // The next batch of `output` in order. Returns End after the last batch, Timeout if none
  // arrived in time (so the caller can check for signals), Cancelled after cancel(); throws
  // CollationError when the consumer reaches a batch whose build failed (the batches before it
  // are handed out first). Several threads may wait on one output. ready_at_entry,
  // if given, gets how many batches were ready in order when the call began (the stats' "ready
  // at next()"), read under the same lock as the take.
  NextStatus next(int output, std::chrono::milliseconds timeout, Batch* out, int64_t* ready_at_entry = nullptr);
  // A native consumer's taken batch left the loader's hands (handed out or dropped): its
  // window place is free for the next batch.
  void retire(int output);

  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  const std::shared_ptr<BatchSource>& source() const { return source_; }
  const BatchPlan& plan(int output) const { return *outputs_[output]->plan; }
  int64_t taken(int output) const;
  // Batches of `output` built and waiting, in order, for the consumer.
  int64_t ready_count(int output) const;
  // How long building each batch took (ids and gather, one thread).
  StageTimes collation_times() const;
  // Of that, the time the collation threads waited for files to be fetched (object storage).
  int64_t fetch_wait_ns() const;

 private:
  struct Slot {
    int64_t step = -1;
    bool ready = false;
    Batch batch;
  };
  struct Output {
    std::shared_ptr<const BatchPlan> plan;
    const int64_t num_batches;
    const uint64_t seed;
    const bool by_source;  // the plan hands the source its rows' sources and local ids
    bool native_consumer;
    int64_t wake_batch;
    int64_t next_claim = 0;
    int64_t taken = 0;    // batches handed to the consumer
    int64_t retired = 0;  // batches that left the loader's hands; the window is [retired, +prefetch)
    int waiting = 0;      // consumers blocked in next()
    // The first batch of this output whose build failed (-1: none) and its error. The batches
    // before it are still handed out, so a failure surfaces at the same batch for any number of
    // threads and any prefetch: next() raises when the consumer reaches it.
    int64_t failed_step = -1;
    std::exception_ptr failure;
    std::vector<Slot> slots;  // ring indexed by step % prefetch
    std::condition_variable ready_cv;
    Output(std::shared_ptr<const BatchPlan> p, bool native, int64_t wake, bool sources)
        : plan(std::move(p)), num_batches(plan->num_batches()), seed(plan->seed()), by_source(sources),
          native_consumer(native), wake_batch(wake) {}
  };

  bool claim(int* output, int64_t* step);  // under mutex_; false when nothing may be claimed now
  bool worth_waking(const Output& o) const;  // under mutex_
  int64_t ready_count_locked(const Output& o) const;  // under mutex_
  bool worth_waking_worker(const Output& o) const;  // under mutex_
  void fail_locked(const std::string& context, std::exception_ptr e);  // under mutex_
  // A batch of `o` failed to build: recorded on the output (the earliest failed step wins) and
  // as the pipeline's error, which stops new claims. Under mutex_.
  void fail_step_locked(Output& o, int64_t step, std::exception_ptr e);
  // Whether the consumer of `o` has reached the failure: its next batch is the failed one, or
  // (another output failed) it has taken every batch claimed before the failure. Under mutex_.
  bool failed_here_locked(const Output& o) const;
  // One collation thread's own working memory: ids (unless the layout has an index part), a
  // mixture's local ids and each source's first row, and its cursor of every output's plan
  // (BatchPlan::cursor; null where the plan keeps none).
  struct WorkerScratch {
    std::vector<int64_t> ids, local_ids, source_rows, epochs;
    std::vector<std::unique_ptr<PlanCursor>> cursors;
  };
  void build(int output, int64_t step, int thread, WorkerScratch& scratch, Batch* batch);

  std::shared_ptr<BatchSource> source_;
  std::shared_ptr<const BatchLayout> layout_;
  const int64_t prefetch_;
  // A retire wakes a sleeping worker only once this many window places are free. When the loop
  // is slower than the loader the window stays full, and waking a worker for every place meant a
  // futex wake in every next() and a worker sleeping after each batch it built (~10 µs of the
  // loop's thread per batch on the benchmark VM); once a quarter is free, one wake-up builds a run.
  const int64_t worker_wake_places_;
  std::vector<std::vector<std::shared_ptr<BufferPool>>> pools_;  // per output, one per layout part
  const int64_t fail_at_step_;
  const uint64_t fork_generation_;  // a forked child must not take mutex_ (see fork_guard.h)
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;
  std::vector<std::unique_ptr<Output>> outputs_;  // condition variables do not move
  bool cancelled_ = false;
  std::exception_ptr error_;  // the first worker failure, as a CollationError
  StageTimes collation_;
  int64_t fetch_wait_ns_ = 0;
};

}  // namespace fastload
