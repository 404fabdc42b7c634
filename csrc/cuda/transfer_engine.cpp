// The per-device transfer engine; see transfer_engine.h.
#include "cuda/transfer_engine.h"

#include <utility>

namespace fastload::cuda {

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
      std::shared_ptr<DeviceBuffer> buffer = pools_[p]->acquire();
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
    ready_cv_.wait_for(lock, timeout, [&] { return !ready_.empty() || finished_ || pipeline_.get() != epoch; });
    if (pipeline_.get() != epoch) return NextStatus::Cancelled;
    if (ready_.empty()) {
      if (error_) std::rethrow_exception(error_);
      if (!finished_) return NextStatus::Timeout;
      return cancelled_ || !pipeline_ ? NextStatus::Cancelled : NextStatus::End;
    }
    *out = std::move(ready_.front());
    ready_.pop_front();
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
