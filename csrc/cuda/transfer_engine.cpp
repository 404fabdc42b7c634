// The per-device transfer engine; see transfer_engine.h.
#include "cuda/transfer_engine.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "cuda/deferred_free.h"

namespace fastload::cuda {

namespace {
// Thrown by a transfer thread that stop() interrupted while it waited for device memory.
struct Stopped {};

std::string megabytes(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f MB", bytes / 1e6);
  return text;
}
}  // namespace

TransferEngine::TransferEngine(int device, int streams, std::shared_ptr<const BatchLayout> layout,
                               int64_t prefetch, Misuse misuse)
    : ctx_(PrimaryContext::retain(device)), layout_(std::move(layout)), prefetch_(prefetch),
      misuse_(misuse), spare_events_(std::make_shared<std::vector<Event*>>()),
      events_mutex_(std::make_shared<std::mutex>()) {
  if (streams <= 0) throw std::invalid_argument("streams must be positive, got " + std::to_string(streams));
  streams_.reserve(static_cast<size_t>(streams));
  for (int i = 0; i < streams; ++i) streams_.emplace_back(ctx_);
  for (size_t p = 0; p < layout_->num_parts(); ++p)
    pools_.push_back(DevicePool::create(ctx_, layout_->part_bytes(p), keep()));
}

TransferEngine::~TransferEngine() {
  close();
  std::lock_guard<std::mutex> lock(*events_mutex_);
  for (Event* e : *spare_events_) delete e;
  spare_events_->clear();
}

std::shared_ptr<Event> TransferEngine::take_event() {
  Event* e = nullptr;
  {
    std::lock_guard<std::mutex> lock(*events_mutex_);
    if (!spare_events_->empty()) {
      e = spare_events_->back();
      spare_events_->pop_back();
    }
  }
  if (!e) e = new Event(ctx_, /*timing=*/true);
  // Returns to the spares when both the in-flight record and the undelivered batch let go.
  auto spares = spare_events_;
  auto mutex = events_mutex_;
  return std::shared_ptr<Event>(e, [spares, mutex](Event* ev) {
    std::lock_guard<std::mutex> lock(*mutex);
    try {
      spares->push_back(ev);
    } catch (...) {
      delete ev;
    }
  });
}

void TransferEngine::start(std::shared_ptr<Pipeline> pipeline, int output) {
  stop();
  for (auto& pool : pools_) pool->set_keep(keep());  // the last epoch's growth goes now
  {
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = cancelled_ = stopping_ = false;
    error_ = nullptr;
    copy_ = StageTimes();  // per epoch, like the collation times
    release_wait_ns_ = 0;
    release_requested_ = release_done_ = false;
    pipeline_ = pipeline;
    output_ = output;
  }
  thread_ = std::thread([this, pipeline, output] { run(pipeline, output); });
}

void TransferEngine::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::deque<DeviceBatch> unseen;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    unseen.swap(ready_);
    pipeline_.reset();
    finished_ = true;
  }
  for (DeviceBatch& b : unseen) drop(b);
}

void TransferEngine::close() {
  stop();
  // Every copy must have finished before device buffers go.
  for (Stream& s : streams_) {
    try {
      s.synchronize();
    } catch (const std::exception&) {
    }
  }
  for (auto& pool : pools_) pool->set_keep(0);
  flush_deferred_frees();  // close() has freed what no batch holds when it returns
}

void TransferEngine::drop(DeviceBatch& b) noexcept {
  // Nobody saw these buffers: the next copy into them waits for this batch's own copy.
  for (auto& part : b.parts) part->release_after(b.copy_stream);
  b = DeviceBatch();
}

void TransferEngine::run(std::shared_ptr<Pipeline> pipeline, int output) {
  std::exception_ptr error;
  bool cancelled = false;
  try {
    relax_capture_for_this_thread();  // before any other driver call on this thread
    ctx_->make_current();
    // Device buffers up front, on this thread, before the first copy (an allocation may
    // synchronise the device): what a loop that drops each batch needs, so that no epoch
    // allocates at a time that depends on how the threads ran. Once per engine: the pools keep
    // them across epochs. A buffer of each part in turn, so that running out of memory starves
    // no part; out of memory, the rest is allocated on demand (acquire() waits and reports).
    bool reserved = true;
    for (int64_t k = 1; k <= keep() && reserved; ++k) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) break;  // the loop below sees it too
      }
      for (auto& pool : pools_)
        if (!(reserved = pool->reserve(k))) break;
    }
    for (int64_t index = 0;; ++index) {
      retire(false);
      Batch batch;
      // While copies are in flight, look back soon to return their pinned slots. (A blocking
      // wait on a second thread was measured against the stand-in: no faster, no less CPU, and
      // one more pinned slot; see README, GPU.)
      const auto wait = in_flight_.empty() ? std::chrono::milliseconds(100) : std::chrono::milliseconds(1);
      NextStatus status;
      while ((status = pipeline->next(output, wait, &batch)) == NextStatus::Timeout) {
        retire(false);
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_) break;
      }
      if (status == NextStatus::Timeout) {  // stopping
        cancelled = true;
        break;
      }
      if (status == NextStatus::End) break;
      if (status == NextStatus::Cancelled) {
        cancelled = true;
        break;
      }
      // Bounded pinned memory: at most in_flight_limit() copies whose slots are still busy.
      while (static_cast<int64_t>(in_flight_.size()) >= in_flight_limit()) retire(true);
      issue(std::move(batch), index);
    }
  } catch (const Stopped&) {
    cancelled = true;
  } catch (...) {
    error = std::current_exception();
  }
  try {
    while (!in_flight_.empty()) retire(true);
  } catch (...) {
    if (!error) error = std::current_exception();
    in_flight_.clear();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
    cancelled_ = cancelled;
    finished_ = true;
  }
  ready_cv_.notify_all();
}

std::shared_ptr<DeviceBuffer> TransferEngine::acquire(size_t part) {
  std::shared_ptr<DeviceBuffer> b = pools_[part]->acquire();
  if (b) return b;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stuck_since_ = {};
    release_requested_ = release_done_ = false;
  }
  int64_t handed = -1;
  while (!(b = pools_[part]->acquire_waiting(std::chrono::milliseconds(20)))) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) throw Stopped();
    // Not stuck while the consumer has batches to take or still takes them: it will drop some.
    // (Its next() waits in slices; between them it is not waiting, and that changes nothing.)
    if (!ready_.empty() || handed != handed_) {
      handed = handed_;
      stuck_since_ = {};
      continue;
    }
    if (waiting_consumers_ == 0) continue;
    const auto now = std::chrono::steady_clock::now();
    if (stuck_since_ == std::chrono::steady_clock::time_point{}) stuck_since_ = now;
    if (cache_release_available_ && !release_done_) {
      release_requested_ = true;  // the consumer's next() sees it within its wait slice
      continue;
    }
    if (now - stuck_since_ >= kStuckPatience) throw OutOfMemory(out_of_memory_message(part));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  release_requested_ = false;
  return b;
}


bool TransferEngine::cache_release_requested() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return release_requested_ && !release_done_;
}

void TransferEngine::cache_released() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_done_ = true;
  release_requested_ = false;
  stuck_since_ = std::chrono::steady_clock::now();  // patience anew, with the cache gone
}

std::string TransferEngine::out_of_memory_message(size_t part) const {
  // Called with mutex_ held, on the transfer thread (its context current, capture mode relaxed).
  size_t free_bytes = 0, total_bytes = 0;
  const bool info = driver().cuMemGetInfo(&free_bytes, &total_bytes) == api::CUDA_SUCCESS;
  int64_t held = 0, buffers = 0, spare = 0;
  for (const auto& pool : pools_) {
    buffers += pool->live();
    held += pool->live() * static_cast<int64_t>(pool->buffer_bytes());
    spare += pool->spare();
  }
  int64_t ready_parts = 0;
  for (const DeviceBatch& b : ready_) ready_parts += static_cast<int64_t>(b.parts.size());
  const std::vector<std::string> names = layout_->names();
  const std::string device = "cuda:" + std::to_string(ctx_->device());
  std::string m = "fastload: out of device memory on " + device + ": cuMemAlloc failed: " +
                  error_text(api::CUDA_ERROR_OUT_OF_MEMORY) + " for " +
                  megabytes(static_cast<double>(pools_[part]->buffer_bytes())) + " (column '" +
                  (part < names.size() ? names[part] : std::to_string(part)) + "' of the next batch)";
  if (info)
    m += "; the driver reports " + megabytes(static_cast<double>(free_bytes)) + " free of " +
         megabytes(static_cast<double>(total_bytes));
  m += ". fastload holds " + std::to_string(buffers) + " device buffers (" + megabytes(static_cast<double>(held)) +
       ") on " + device + ", " + std::to_string(std::max<int64_t>(0, buffers - spare - ready_parts)) +
       " of them in batches you still hold; the loop waits in next() for a batch that cannot be copied without "
       "memory. Drop batches you keep, lower prefetch or batch_size, or free memory held elsewhere";
  if (release_done_) m += " (torch.cuda.empty_cache() was called first)";
  return m;
}

void TransferEngine::retire(bool block_for_oldest) {
  while (!in_flight_.empty()) {
    InFlight& oldest = in_flight_.front();
    int64_t waited = 0;
    if (block_for_oldest) {
      // This thread cannot go on until the oldest copy is done. First until the copies could
      // start, i.e. the consumer's work released the memory they write: that stall is the
      // training step's time, counted apart. Then the copies themselves.
      const auto t0 = std::chrono::steady_clock::now();
      oldest.started->synchronize();
      waited = StageTimes::since(t0);
      oldest.copied->synchronize();
      block_for_oldest = false;
    } else if (!oldest.copied->done()) {
      return;
    }
    // The copies' own time, measured on the GPU: whenever this thread looks, it is exact.
    const auto took = static_cast<int64_t>(static_cast<double>(oldest.copied->elapsed_since(*oldest.started)) * 1e6);
    in_flight_.pop_front();  // the pinned parts return to their pools
    std::lock_guard<std::mutex> lock(mutex_);
    copy_.record(took);
    release_wait_ns_ += waited;
  }
}

void TransferEngine::issue(Batch batch, int64_t index) {
  const Stream& stream = streams_[static_cast<size_t>(index) % streams_.size()];
  const api::Functions& f = driver();
  DeviceBatch d;
  d.rows = batch.rows;
  d.step = batch.step;
  d.extras = batch.extras;
  d.copy_stream = stream.get();
  InFlight flight;
  int64_t bytes = 0;
  try {
    // All the waits first, then a timing event, then the copies back to back: the copies' own
    // time is measured apart from the time their memory took to be released.
    for (size_t p = 0; p < batch.parts.size(); ++p) {
      std::shared_ptr<DeviceBuffer> buffer = acquire(p);
      d.parts.push_back(buffer);
      if (misuse_ != Misuse::SkipReleaseWait)
        for (size_t i = 0; i < buffer->pending_releases(); ++i)
          check(f.cuStreamWaitEvent(stream.get(), buffer->release_event(i).get(), 0), "cuStreamWaitEvent");
    }
    flight.started = take_event();
    flight.started->record(stream.get());
    for (size_t p = 0; p < batch.parts.size(); ++p) {
      const size_t n = layout_->part_row_bytes[p] * static_cast<size_t>(batch.rows);
      if (n)
        check(f.cuMemcpyHtoDAsync(d.parts[p]->ptr(), batch.parts[p]->data(), n, stream.get()), "cuMemcpyHtoDAsync");
      bytes += static_cast<int64_t>(n);
    }
    d.copy_done = take_event();
    d.copy_done->record(stream.get());
  } catch (...) {
    // Copies already queued from this batch's pinned parts must finish before the parts go
    // back to the pool (and may be rewritten or freed) as this function unwinds.
    RelaxedCapture relaxed;
    log_failure(f.cuStreamSynchronize(stream.get()), "cuStreamSynchronize");
    drop(d);
    throw;
  }
  flight.copied = d.copy_done;
  if (misuse_ == Misuse::EarlyHostRelease)
    batch = Batch();  // the deliberate bug: slots back to collation while their copy may not have run
  else
    flight.host = std::move(batch);
  in_flight_.push_back(std::move(flight));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ready_.push_back(std::move(d));
    ++batches_;
    bytes_ += bytes;
  }
  ready_cv_.notify_one();
}

NextStatus TransferEngine::next(const Pipeline* epoch, api::CUstream consumer_stream,
                                std::chrono::milliseconds timeout, DeviceBatch* out) {
  std::shared_ptr<Pipeline> pipeline;
  int output;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // Re-checked after the wait too: stop() and a new start() may both happen while this thread
    // waits, and the new epoch's first batch is not this iterator's to take.
    if (pipeline_.get() != epoch) return NextStatus::Cancelled;
    ++waiting_consumers_;
    ready_cv_.wait_for(lock, timeout, [&] { return !ready_.empty() || finished_ || pipeline_.get() != epoch; });
    --waiting_consumers_;
    if (pipeline_.get() != epoch) return NextStatus::Cancelled;
    if (ready_.empty()) {
      if (error_) std::rethrow_exception(error_);
      if (!finished_) return NextStatus::Timeout;
      return cancelled_ || !pipeline_ ? NextStatus::Cancelled : NextStatus::End;
    }
    *out = std::move(ready_.front());
    ready_.pop_front();
    ++handed_;
    pipeline = pipeline_;
    output = output_;
  }
  try {
    if (misuse_ != Misuse::SkipConsumerWait) {
      ScopedContext scope(*ctx_);
      check(driver().cuStreamWaitEvent(consumer_stream, out->copy_done->get(), 0), "cuStreamWaitEvent");
    }
  } catch (...) {
    drop(*out);
    if (pipeline) pipeline->retire(output);
    throw;
  }
  out->copy_done.reset();
  if (pipeline) pipeline->retire(output);  // the batch left the loader's hands: a window place is free
  return NextStatus::Ok;
}

int64_t TransferEngine::ready_count() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(ready_.size());
}

StageTimes TransferEngine::copy_times() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return copy_;
}

int64_t TransferEngine::release_wait_ns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return release_wait_ns_;
}

TransferCounts TransferEngine::counts() const {
  TransferCounts c;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    c.batches = batches_;
    c.bytes = bytes_;
  }
  for (const auto& pool : pools_) {
    const int64_t live = pool->live();
    c.device_buffers += live;
    c.device_bytes += live * static_cast<int64_t>(pool->buffer_bytes());
    c.device_allocations += pool->allocations();
    c.device_retired += pool->retired();
  }
  return c;
}

}  // namespace fastload::cuda
