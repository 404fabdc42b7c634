// The loader runtime; see loader_runtime.h.
#include "runtime/loader_runtime.h"

#include <algorithm>
#include <stdexcept>

#include "cuda/deferred_free.h"
#include "cuda/memory.h"

namespace fastload {

LoaderRuntime::LoaderRuntime(std::shared_ptr<BatchSource> source, const RuntimeOptions& options)
    : prefetch_(options.engine.prefetch), streams_(options.streams), cache_release_(options.cache_release),
      shared_memory_(options.host_memory) {
  if (streams_ <= 0) throw std::invalid_argument("copy_streams must be positive, got " + std::to_string(streams_));
  engine_ = std::make_unique<Engine>(std::move(source), options.engine,
                                     options.host_memory ? options.host_memory : make_aligned_allocator());
  layout_ = engine_->layout_ptr();
}

LoaderRuntime::~LoaderRuntime() {
  engine_->cancel_current();
  stop_transfers();
  transfers_.clear();
  engine_.reset();
}

void LoaderRuntime::close() {
  engine_->close();  // cancels the epoch: transfer threads see Cancelled and finish
  for (auto& t : transfers_)
    if (t) t->close();  // drains the streams; device buffers users hold stay valid
  transfers_.clear();
  if (pinned_) cuda::flush_deferred_frees();  // the pinned slots the engine's close() let go
}

void LoaderRuntime::stop_epoch() {
  engine_->cancel_current();  // first: transfer threads waiting on the pipeline see Cancelled
  stop_transfers();
  engine_->stop_epoch();
}

void LoaderRuntime::stop_transfers() {
  for (auto& t : transfers_)
    if (t) t->stop();
}

std::shared_ptr<Run> LoaderRuntime::start(std::vector<std::shared_ptr<const BatchPlan>> plans,
                                          int64_t fail_at_step, const std::vector<int>& devices) {
  if (devices.size() != plans.size()) throw std::invalid_argument("one device per sampler is needed");
  engine_->check_not_forked();
  auto run = std::make_shared<Run>();
  run->epoch = plans.empty() ? 0 : plans[0]->epoch();
  run->handed.assign(devices.size(), 0);
  if (!plans.empty() && plans[0]->num_sources() > 1)
    run->stats.source_rows.assign(static_cast<size_t>(plans[0]->num_sources()), 0);
  std::vector<OutputSpec> outputs;
  for (size_t d = 0; d < plans.size(); ++d) outputs.push_back({std::move(plans[d]), devices[d] >= 0, nullptr});
  // The old epoch first: its transfer threads then see Cancelled at once instead of at their
  // next timeout, and stop before the pipeline they feed from is replaced.
  engine_->cancel_current();
  stop_transfers();
  run->transfers.resize(devices.size());
  int64_t extra = 0;
  for (size_t d = 0; d < devices.size(); ++d) {
    if (devices[d] < 0) continue;
    if (transfers_.size() <= d) transfers_.resize(d + 1);
    if (!transfers_[d] || transfers_[d]->device() != devices[d]) {
      transfers_[d] = std::make_shared<cuda::TransferEngine>(devices[d], streams_, layout_, prefetch_, misuse_);
      transfers_[d]->set_cache_release(cache_release_);
    }
    run->transfers[d] = transfers_[d];
    extra += transfers_[d]->in_flight_limit();
    if (!pinned_) {
      // Worker processes write into shared-memory slots: those are page-locked in place, so the
      // transfer engine copies straight from what the workers wrote.
      if (shared_memory_)
        pinned_ = std::make_shared<cuda::RegisteredAllocator>(transfers_[d]->context(), shared_memory_,
                                                              misuse_ == cuda::Misuse::SkipHostRegister);
      else
        pinned_ = std::make_shared<cuda::PinnedAllocator>(transfers_[d]->context());
    }
    // Page-locked slots for a GPU output only: a CPU output of the same loader gets ordinary
    // memory, so that a non_blocking .to("cuda") of its batches is a staged copy that is done
    // when it returns, not a DMA still reading a slot the loader recycles.
    outputs[d].memory = pinned_;
  }
  run->pipeline = engine_->start(std::move(outputs), fail_at_step, nullptr, extra);
  for (size_t d = 0; d < devices.size(); ++d)
    if (run->transfers[d]) run->transfers[d]->start(run->pipeline, static_cast<int>(d));
  return run;
}

NextStatus LoaderRuntime::next_host(const Run& run, int output, std::chrono::milliseconds timeout, Batch* out,
                                    int64_t* ready) {
  return run.pipeline->next(output, timeout, out, ready);
}

NextStatus LoaderRuntime::next_device(const Run& run, int output, cuda::api::CUstream stream,
                                      std::chrono::milliseconds timeout, cuda::DeviceBatch* out, int64_t* ready) {
  cuda::TransferEngine& transfer = *run.transfers.at(static_cast<size_t>(output));
  if (ready) *ready = transfer.ready_count();
  return transfer.next(run.pipeline.get(), stream, timeout, out);
}

bool LoaderRuntime::stall_figures(const Run& run, double share, StallFigures* out, int64_t user_ns, bool processes) {
  if (stall_warned_ || share <= RunStats::kStallShare) return false;
  stall_warned_ = true;
  // Which stage is busy most of the time since the epoch began points to the knob.
  const double wall = std::chrono::duration<double, std::nano>(RunStats::Clock::now() - run.stats.started).count();
  const double collation_ns = static_cast<double>(run.pipeline->collation_times().total_ns());
  StallFigures f;
  f.share = share;
  f.collating = collation_ns / (wall * std::max(1, engine_->num_threads()));
  f.user_share = user_ns < 0 ? -1.0 : static_cast<double>(user_ns) / std::max(1.0, collation_ns);
  f.fetch_share = static_cast<double>(run.pipeline->fetch_wait_ns()) / std::max(1.0, collation_ns);
  // Copy time is the copies' own GPU time; the time they waited for memory the consumer's work
  // had not released yet is counted apart (it is the training step's time, not the loader's).
  for (const auto& t : run.transfers) {
    if (!t) continue;
    f.copying = std::max(f.copying, static_cast<double>(t->copy_times().total_ns()) / (wall * streams_));
    f.releasing = std::max(f.releasing, static_cast<double>(t->release_wait_ns()) / wall);
  }
  f.processes = processes;
  f.num_threads = engine_->num_threads();
  f.copy_streams = streams_;
  f.prefetch = prefetch_;
  *out = f;
  return true;
}

MemoryCounts LoaderRuntime::memory() const {
  MemoryCounts m;
  m.host = engine_->host_counts();
  m.host_bytes = static_cast<int64_t>(engine_->host_bytes(false));
  m.pinned_bytes = static_cast<int64_t>(engine_->host_bytes(true));
  m.pinned_buffers = engine_->host_counts(true).live();
  for (const auto& t : transfers_) {
    if (!t) continue;
    const cuda::TransferCounts c = t->counts();
    m.device_bytes += c.device_bytes;
    m.device_buffers += c.device_buffers;
    m.device_allocations += c.device_allocations;
    m.device_retired += c.device_retired;
    m.batches_copied += c.batches;
  }
  m.num_threads = engine_->num_threads();
  return m;
}

}  // namespace fastload
