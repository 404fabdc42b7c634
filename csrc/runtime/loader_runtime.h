// A loader's native runtime, with no Python in it: the engine (collation threads and host
// buffers over one source), a transfer engine per GPU output, one started epoch at a time
// (Run), the per-epoch counters and the stall hint. The bindings (csrc/bindings/loader.cpp)
// only wait on it with the GIL released and turn what it hands out into tensors.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/batch_source.h"
#include "core/engine.h"
#include "core/stage_times.h"
#include "cuda/transfer_engine.h"
#include "runtime/run_stats.h"

namespace fastload {

// One started epoch: the pipeline, and the transfer engine of each output that feeds a GPU (null
// for CPU outputs). `handed` and `stats` are changed by the consumer only (with the GIL held, in
// the bindings), never by the loader's threads.
struct Run {
  std::shared_ptr<Pipeline> pipeline;
  std::vector<std::shared_ptr<cuda::TransferEngine>> transfers;
  int64_t epoch = 0;
  std::vector<int64_t> handed;  // batches each output handed to the user
  bool superseded = false;      // a newer iter()/split(), load_state_dict() or close() ended it
  RunStats stats;               // all outputs together
};

// Bytes and buffers the loader's pools hold (batches users keep included).
struct MemoryCounts {
  int64_t host_bytes = 0, pinned_bytes = 0;
  BufferPoolCounts host;
  int64_t pinned_buffers = 0;
  int64_t device_bytes = 0, device_buffers = 0, device_allocations = 0, device_retired = 0, batches_copied = 0;
  int num_threads = 0;
};

struct RuntimeOptions {
  EngineOptions engine;
  int streams = 1;  // copy streams per GPU output
  // The consumer can release memory another allocator caches when a GPU output runs out (the
  // bindings: torch.cuda.empty_cache()); see TransferEngine::set_cache_release.
  bool cache_release = false;
  // Where CPU batches live (null: ordinary aligned memory); worker processes need shared memory.
  std::shared_ptr<HostAllocator> host_memory;
};

class LoaderRuntime {
 public:
  LoaderRuntime(std::shared_ptr<BatchSource> source, const RuntimeOptions& options);
  ~LoaderRuntime();  // cancels the epoch and joins every thread; call without the GIL
  LoaderRuntime(const LoaderRuntime&) = delete;
  LoaderRuntime& operator=(const LoaderRuntime&) = delete;

  // Cancels the running epoch and starts one over `plans`; devices[d] is -1 for a CPU output,
  // else the CUDA device of output d. Call without the GIL.
  std::shared_ptr<Run> start(std::vector<std::shared_ptr<const BatchPlan>> plans, int64_t fail_at_step,
                             const std::vector<int>& devices);
  void close();  // stops the threads, drains the streams; batches users hold stay valid
  void stop_epoch();  // cancels the running epoch and waits for its threads; call without the GIL

  // The next batch of a CPU output / a GPU output (the consumer's `stream` is made to wait on
  // its copy). Wait at most `timeout`; `ready`, if not null, gets the batches that were ready
  // when the call began. Call without the GIL.
  NextStatus next_host(const Run& run, int output, std::chrono::milliseconds timeout, Batch* out, int64_t* ready);
  NextStatus next_device(const Run& run, int output, cuda::api::CUstream stream, std::chrono::milliseconds timeout,
                         cuda::DeviceBatch* out, int64_t* ready);

  // After a hand-out, with the wait share of the last RunStats::kWindow batches: the stall hint's
  // figures (numbers only) the first time the loop waited more than RunStats::kStallShare of the
  // last window (once per loader; false otherwise, with nothing to say or said already). The
  // text that names a knob is Python's (fastload/_advice.py; see run_stats.h).
  // user_ns: time in a Python dataset's own code this epoch (negative: an array source);
  // processes: that code runs in worker processes.
  bool stall_figures(const Run& run, double share, StallFigures* out, int64_t user_ns = -1, bool processes = false);

  MemoryCounts memory() const;
  const BatchLayout& layout() const { return *layout_; }
  const std::shared_ptr<const BatchLayout>& layout_ptr() const { return layout_; }
  int num_threads() const { return engine_->num_threads(); }
  // See Engine::set_stop_policy: threads stuck in a Python dataset's code are left behind.
  void set_stop_policy(StopPolicy policy) { engine_->set_stop_policy(std::move(policy)); }
  int64_t left_behind() const { return engine_->left_behind(); }
  std::string left_behind_in() const { return engine_->left_behind_in(); }
  int64_t prefetch() const { return prefetch_; }
  int streams() const { return streams_; }
  void check_not_forked() const { engine_->check_not_forked(); }
  // Tests: make the transfer engines commit a misuse on purpose (see cuda::Misuse).
  void set_misuse(cuda::Misuse misuse) { misuse_ = misuse; }

 private:
  void stop_transfers();

  const int64_t prefetch_;
  const int streams_;
  const bool cache_release_;
  cuda::Misuse misuse_ = cuda::Misuse::None;
  bool stall_warned_ = false;  // the hint is given once per loader
  std::unique_ptr<Engine> engine_;
  std::shared_ptr<const BatchLayout> layout_;  // outlives a closed engine: batches still need it
  std::shared_ptr<HostAllocator> shared_memory_;  // worker processes' segments (RuntimeOptions::host_memory)
  std::shared_ptr<HostAllocator> pinned_;      // made on the first GPU epoch
  std::vector<std::shared_ptr<cuda::TransferEngine>> transfers_;  // by output index
};

}  // namespace fastload
