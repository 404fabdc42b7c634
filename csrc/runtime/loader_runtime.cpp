// The loader runtime; see loader_runtime.h.
#include "runtime/loader_runtime.h"

#include <algorithm>
#include <stdexcept>

#include "cuda/memory.h"

namespace fastload {

LoaderRuntime::LoaderRuntime(std::shared_ptr<BatchSource> source, const RuntimeOptions& options)
    : prefetch_(options.engine.prefetch), streams_(options.streams) {
  if (streams_ <= 0) throw std::invalid_argument("streams must be positive, got " + std::to_string(streams_));
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
  for (size_t d = 0; d < plans.size(); ++d) outputs.push_back({std::move(plans[d]), devices[d] >= 0});
  // The old epoch first: its transfer threads then see Cancelled at once instead of at their
  // next timeout, and stop before the pipeline they feed from is replaced.
  engine_->cancel_current();
  stop_transfers();
  run->transfers.resize(devices.size());
  std::shared_ptr<HostAllocator> host_memory;
  int64_t extra = 0;
  for (size_t d = 0; d < devices.size(); ++d) {
    if (devices[d] < 0) continue;
    if (transfers_.size() <= d) transfers_.resize(d + 1);
    if (!transfers_[d] || transfers_[d]->device() != devices[d])
      transfers_[d] = std::make_shared<cuda::TransferEngine>(devices[d], streams_, layout_, prefetch_, misuse_);
    run->transfers[d] = transfers_[d];
    extra += transfers_[d]->in_flight_limit();
    if (!pinned_) pinned_ = std::make_shared<cuda::PinnedAllocator>(transfers_[d]->context());
    host_memory = pinned_;
  }
  run->pipeline = engine_->start(std::move(outputs), fail_at_step, host_memory, extra);
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

std::string LoaderRuntime::stall_hint(const Run& run, double share, int64_t user_ns, bool processes) {
  if (stall_warned_ || share <= RunStats::kStallShare) return "";
  stall_warned_ = true;
  // Which stage is busy most of the time since the epoch began points to the knob.
  const double wall = std::chrono::duration<double, std::nano>(RunStats::Clock::now() - run.stats.started).count();
  const double collation_ns = static_cast<double>(run.pipeline->collation_times().total_ns());
  const double collating = collation_ns / (wall * std::max(1, engine_->num_threads()));
  const double user_share = user_ns < 0 ? -1.0 : static_cast<double>(user_ns) / std::max(1.0, collation_ns);
  double copying = 0;
  for (const auto& t : run.transfers)
    if (t) copying = std::max(copying, static_cast<double>(t->copy_times().total_ns()) / (wall * streams_));
  const std::string knob =
      stall_advice(collating, copying, engine_->num_threads(), streams_, prefetch_, user_share, processes);
  return "fastload: the training loop waited for data " + std::to_string(static_cast<int>(share * 100)) +
         "% of the time over the last " + std::to_string(RunStats::kWindow) + " batches; " + knob +
         ". See loader.stats().";
}

MemoryCounts LoaderRuntime::memory() const {
  MemoryCounts m;
  m.host = engine_->host_counts();
  const bool pinned = pinned_ != nullptr;
  const int64_t bytes = static_cast<int64_t>(engine_->host_bytes());
  m.host_bytes = pinned ? 0 : bytes;
  m.pinned_bytes = pinned ? bytes : 0;
  m.pinned_buffers = pinned ? m.host.live() : 0;
  for (const auto& t : transfers_) {
    if (!t) continue;
    const cuda::TransferCounts c = t->counts();
    m.device_bytes += c.device_bytes;
    m.device_buffers += c.device_buffers;
    m.device_allocations += c.device_allocations;
    m.batches_copied += c.batches;
  }
  m.num_threads = engine_->num_threads();
  return m;
}

}  // namespace fastload
