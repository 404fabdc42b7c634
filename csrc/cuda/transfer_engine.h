// One device's transfer engine: a native thread takes its output's collated batches in order as
// soon as they exist, copies each part to a device buffer on one of its non-blocking streams
// (one copy per part, only the rows the batch has; first the stream waits for the buffers'
// release events), records a copy event, and queues the batch for the consumer. The consumer's
// stream waits on that event when the batch is handed out: no host synchronisation on the hot
// path. Pinned host slots return to their pool only once their copy event has completed.
//
// What a copy costs is measured on the GPU: a timing event recorded after the release waits and
// the copy event after the copies give the copy's own time. When the thread must wait for a copy
// (its in-flight places are full), the time until the first of them completes is time the copies
// spent waiting for the consumer's work to release memory: the training step, not the loader, is
// then the bottleneck.
//
// Streams, device buffers and events live as long as the engine (across epochs); each epoch
// attaches a pipeline output and a thread (start/stop).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/memory_bound.h"
#include "core/pipeline.h"
#include "cuda/handles.h"
#include "cuda/memory.h"

namespace fastload::cuda {

// Deliberate misuses, for the tests that prove the stand-in driver catches each one.
enum class Misuse { None, SkipConsumerWait, SkipReleaseWait, EarlyHostRelease, SkipHostRegister };

struct DeviceBatch {
  std::vector<std::shared_ptr<DeviceBuffer>> parts;
  int64_t rows = 0;
  int64_t step = 0;
  api::CUstream copy_stream = nullptr;
  std::shared_ptr<Event> copy_done;
  std::shared_ptr<void> extras;  // what the source attached besides the parts (core Batch::extras)
};

struct TransferCounts {
  int64_t batches = 0;        // copied
  int64_t bytes = 0;          // copied
  int64_t device_buffers = 0; // live device buffers, all parts
  int64_t device_bytes = 0;
  int64_t device_allocations = 0;
  int64_t device_retired = 0;  // never reused (their release could not be ordered); counted in buffers
};

class TransferEngine {
 public:
  TransferEngine(int device, int streams, std::shared_ptr<const BatchLayout> layout, int64_t prefetch,
                 Misuse misuse = Misuse::None);
  ~TransferEngine();  // stops, drains the streams, frees what no live batch holds
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Copies in flight beyond the prefetch window whose pinned slots are still busy.
  int64_t in_flight_limit() const { return static_cast<int64_t>(streams_.size()) + 1; }
  // Device buffers per part a loop that drops each batch needs: the window's batches, the one
  // next() hands out and the one the loop variable still holds meanwhile (while the window
  // refills). With fewer kept across epochs, such a loop would make every epoch free and
  // reallocate one (two implicit device synchronisations per epoch).
  int64_t keep() const { return batches_held(prefetch_); }
  const std::shared_ptr<PrimaryContext>& context() const { return ctx_; }
  int device() const { return ctx_->device(); }

  // Starts feeding from `pipeline`'s `output` (stopping a previous epoch first).
  void start(std::shared_ptr<Pipeline> pipeline, int output);
  // Joins the thread, drops batches nobody took, waits for the copies in flight. The pipeline
  // must have been cancelled or finished. Idempotent.
  void stop();
  // stop(), then waits for the streams and frees every device buffer no live batch holds.
  // Iterators that still reference the engine get Cancelled.
  void close();

  // The next batch, ready on `consumer_stream` (which is made to wait on its copy). Ok, End,
  // Timeout or Cancelled; rethrows a collation failure or a driver error.
  // `epoch` is the pipeline the caller's iterator belongs to: once this engine serves a newer
  // one, the old iterator gets Cancelled.
  NextStatus next(const Pipeline* epoch, api::CUstream consumer_stream, std::chrono::milliseconds timeout,
                  DeviceBatch* out);
  TransferCounts counts() const;
  int64_t ready_count() const;

  // Out of device memory. When a copy's buffer cannot be allocated, the transfer thread waits for
  // one to come back (a batch the user drops) instead of growing the pool. If the consumer waits
  // in next() with nothing ready meanwhile, it waits for a batch that needs memory it may hold
  // itself: then, once, the consumer is asked to release memory cached by another allocator (the
  // bindings call torch.cuda.empty_cache(); see set_cache_release), and if that does not help
  // within kStuckPatience, next() raises OutOfMemory saying what is held where.
  static constexpr std::chrono::milliseconds kStuckPatience{200};
  void set_cache_release(bool available) { cache_release_available_ = available; }
  // True when the transfer thread asks the consumer (its thread, which may take the GIL) to
  // release cached memory now; cache_released() says it did.
  bool cache_release_requested() const;
  void cache_released();
  // Per batch, the GPU time of its copies (between timing events after the release waits and
  // after the copies).
  StageTimes copy_times() const;
  // This epoch's time the transfer thread was held up by copies waiting for the consumer's work
  // to release device memory.
  int64_t release_wait_ns() const;

 private:
  struct InFlight {
    Batch host;  // pinned parts, released when `copied` completes
    std::shared_ptr<Event> started;  // after the release waits, before the copies
    std::shared_ptr<Event> copied;
  };
  void run(std::shared_ptr<Pipeline> pipeline, int output);
  void issue(Batch batch, int64_t index);
  void retire(bool block_for_oldest);
  std::shared_ptr<DeviceBuffer> acquire(size_t part);
  std::string out_of_memory_message(size_t part) const;
  std::shared_ptr<Event> take_event();
  void drop(DeviceBatch& b) noexcept;

  std::shared_ptr<PrimaryContext> ctx_;
  std::shared_ptr<const BatchLayout> layout_;
  const int64_t prefetch_;
  const Misuse misuse_;
  std::vector<Stream> streams_;
  std::vector<std::shared_ptr<DevicePool>> pools_;  // one per part
  std::shared_ptr<std::vector<Event*>> spare_events_;  // recycled timing events
  std::shared_ptr<std::mutex> events_mutex_;
  std::deque<InFlight> in_flight_;  // transfer thread only

  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;
  std::deque<DeviceBatch> ready_;
  std::shared_ptr<Pipeline> pipeline_;
  int output_ = 0;
  bool finished_ = false, cancelled_ = false, stopping_ = false;
  std::exception_ptr error_;
  int64_t batches_ = 0, bytes_ = 0;
  StageTimes copy_;
  int64_t release_wait_ns_ = 0;
  int waiting_consumers_ = 0;  // threads inside next()'s wait
  int64_t handed_ = 0;         // batches next() took, ever
  // While the transfer thread is out of memory: since when the consumer has been stuck (waiting
  // with nothing ready; epoch() when not), and the cache release asked for / done.
  std::chrono::steady_clock::time_point stuck_since_{};
  bool release_requested_ = false, release_done_ = false;
  bool cache_release_available_ = false;
  std::thread thread_;
};

}  // namespace fastload::cuda
