// A loader's native side: its collation threads, its buffer pool and the current epoch's
// pipeline. Starting a new epoch cancels the running one.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/buffer_pool.h"
#include "core/pipeline.h"
#include "core/sampler.h"
#include "core/thread_pool.h"

namespace fastload {

struct EngineOptions {
  int num_threads = 1;
  int64_t prefetch = 4;
  bool with_index = false;
  bool with_valid = false;
  int64_t batch_size = 1;
};

class Engine {
 public:
  Engine(std::vector<ColumnSpec> columns, const EngineOptions& options,
         std::shared_ptr<HostAllocator> allocator = make_aligned_allocator());
  ~Engine();  // cancels and joins; in a forked child it leaks instead (see fork_guard.h)

  // Cancels any running epoch, then starts one pipeline over the given plans (one per output).
  // Returns the new pipeline; the consumer keeps it to read batches.
  std::shared_ptr<Pipeline> start(std::vector<EpochPlan> plans, int64_t fail_at_step = -1);
  void close();  // cancels and joins the threads; idempotent
  bool closed() const;
  // Throws std::runtime_error if this engine's threads belong to the parent of a fork.
  void check_not_forked() const;

  const BatchLayout& layout() const { return *layout_; }
  const BufferPool& buffer_pool() const { return *pool_; }
  int num_threads() const { return options_.num_threads; }

 private:
  void stop_current();

  EngineOptions options_;
  std::shared_ptr<const BatchLayout> layout_;
  std::shared_ptr<BufferPool> pool_;
  const uint64_t fork_generation_;
  mutable std::mutex mutex_;  // serialises start/close
  std::unique_ptr<ThreadPool> threads_;
  std::shared_ptr<Pipeline> current_;
};

}  // namespace fastload
