// A loader's native side: its collation threads, its buffer pool and the current epoch's
// pipeline. Starting a new epoch cancels the running one.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <mutex>
#include <vector>

#include "core/array_source.h"
#include "core/batch_source.h"
#include "core/batch_layout.h"
#include "core/buffer_pool.h"
#include "core/memory_bound.h"
#include "core/pipeline.h"
#include "core/sampler.h"
#include "core/thread_pool.h"

namespace fastload {

struct EngineOptions {
  int num_threads = 1;
  int64_t prefetch = 4;
  bool with_index = false;
  bool with_valid = false;
  bool with_source = false;  // a mixture's "source" part
  int64_t batch_size = 1;
  // The batch layout when the caller has built it already (the Python side asks for it before
  // choosing a default prefetch); it must have been built from this source's schema with the
  // fields above. Null: the engine builds it.
  std::shared_ptr<const BatchLayout> layout;
};

// How long stopping an epoch waits for threads that may be stuck in code that cannot be stopped
// (a Python dataset's __getitem__). Without a policy, it waits for them however long it takes.
struct StopPolicy {
  std::chrono::milliseconds grace{0};  // at most this long
  // What a thread is known to be stuck in ("" while none is): no more waiting once it says so.
  // Called without the GIL, from the thread that stops the epoch.
  std::function<std::string()> stuck;
  // After threads were left behind, before fresh ones start (with how many were left).
  std::function<void(int)> left_behind;
};

class Engine {
 public:
  Engine(std::shared_ptr<BatchSource> source, const EngineOptions& options,
         std::shared_ptr<HostAllocator> allocator = make_aligned_allocator());
  // An engine over arrays (an ArraySource of these columns).
  Engine(std::vector<ArrayColumn> columns, const EngineOptions& options,
         std::shared_ptr<HostAllocator> allocator = make_aligned_allocator());
  ~Engine();  // cancels and joins; in a forked child it leaks instead (see fork_guard.h)

  // Cancels any running epoch, then starts one pipeline over the given outputs. An output's host
  // buffers come from its OutputSpec::memory, else from `host_memory` when given, else from the
  // engine's allocator; each kind of memory has its own pools. `extra_buffers` are batches a
  // native consumer holds beyond the window (copies in flight). Returns the new pipeline; the
  // consumer keeps it to read batches.
  std::shared_ptr<Pipeline> start(std::vector<OutputSpec> outputs, int64_t fail_at_step = -1,
                                  std::shared_ptr<HostAllocator> host_memory = nullptr,
                                  int64_t extra_buffers = 0);
  // Convenience for outputs that are all Python consumers.
  std::shared_ptr<Pipeline> start(std::vector<EpochPlan> plans, int64_t fail_at_step = -1);
  void close();  // cancels and joins the threads; idempotent
  void stop_epoch();  // cancels the running epoch and waits for its threads (see set_stop_policy)
  // Cancels the running epoch without waiting for its threads (its consumers see Cancelled at
  // once); the next start() or close() joins them.
  void cancel_current();
  bool closed() const;
  // From now on, stopping an epoch leaves threads still running after the policy's grace behind
  // (they end when their call returns; none is ever joined) and carries on with fresh ones.
  void set_stop_policy(StopPolicy policy);
  // Threads left behind so far, and what the first one was stuck in.
  int64_t left_behind() const;
  std::string left_behind_in() const;
  // Throws std::runtime_error if this engine's threads belong to the parent of a fork.
  void check_not_forked() const;

  const BatchLayout& layout() const { return *layout_; }
  const std::shared_ptr<BatchSource>& source() const { return source_; }
  const std::shared_ptr<const BatchLayout>& layout_ptr() const { return layout_; }
  // Host buffer counts summed over the parts of a batch (every part has its own pool), of the
  // page-locked pools or of the others.
  BufferPoolCounts host_counts(bool page_locked) const;
  size_t host_bytes(bool page_locked) const;  // bytes of the live host buffers of that kind
  BufferPoolCounts host_counts() const;       // of every kind
  size_t host_bytes() const;
  int num_threads() const { return options_.num_threads; }

 private:
  void stop_current(bool restart = true);
  // Waits for the current job's threads under the stop policy; false if some were left behind
  // (threads_ is then a fresh pool if `restart`, else null). mutex_ held.
  bool join_job(bool restart);

  EngineOptions options_;
  std::shared_ptr<BatchSource> source_;
  std::shared_ptr<const BatchLayout> layout_;
  std::shared_ptr<HostAllocator> default_allocator_;
  // The buffer pools of one kind of host memory, one per layout part.
  struct PoolSet {
    std::shared_ptr<HostAllocator> allocator;
    std::vector<std::shared_ptr<BufferPool>> pools;
  };
  std::vector<PoolSet> sets_;  // those the running (or last) epoch uses; guarded by mutex_
  const uint64_t fork_generation_;
  mutable std::mutex mutex_;  // serialises start/close
  std::unique_ptr<ThreadPool> threads_;
  std::shared_ptr<Pipeline> current_;
  StopPolicy stop_policy_;  // guarded by mutex_
  int64_t left_behind_ = 0;  // guarded by mutex_
  std::string left_behind_in_;
};

}  // namespace fastload
