// The epoch pipeline; see pipeline.h.
#include "core/pipeline.h"

#include <algorithm>
#include <limits>

#include "core/fork_guard.h"

namespace fastload {

namespace {
// Part pointers of a batch live on the stack up to this many parts.
constexpr size_t kMaxInlineParts = 32;
}  // namespace

Pipeline::Pipeline(std::shared_ptr<BatchSource> source, std::shared_ptr<const BatchLayout> layout,
                   std::vector<OutputSpec> outputs, int64_t prefetch, const std::vector<std::shared_ptr<BufferPool>>& pools,
                   int64_t fail_at_step)
    : Pipeline(std::move(source), std::move(layout), outputs, prefetch,
               std::vector<std::vector<std::shared_ptr<BufferPool>>>(outputs.size(), pools), fail_at_step) {}

Pipeline::Pipeline(std::shared_ptr<BatchSource> source, std::shared_ptr<const BatchLayout> layout,
                   std::vector<OutputSpec> outputs, int64_t prefetch,
                   std::vector<std::vector<std::shared_ptr<BufferPool>>> pools, int64_t fail_at_step)
    : source_(std::move(source)), layout_(std::move(layout)), prefetch_(prefetch), worker_wake_places_(std::max<int64_t>(1, prefetch / 4)),
      pools_(std::move(pools)),
      fail_at_step_(fail_at_step), fork_generation_(fork_generation()) {
  if (prefetch <= 0)
    throw std::invalid_argument("prefetch must be positive, got " + std::to_string(prefetch));
  if (pools_.size() != outputs.size())
    throw std::invalid_argument("one set of buffer pools per output is needed");
  for (const auto& set : pools_)
    if (set.size() != layout_->num_parts()) throw std::invalid_argument("one buffer pool per batch part is needed");
  if (!source_ || source_->schema().size() != layout_->source_parts)
    throw std::invalid_argument("the batch layout was not made for this source");
  for (OutputSpec& spec : outputs) {
    if (!spec.plan) throw std::invalid_argument("an output needs a plan");
    if (spec.plan->max_batch_rows() > layout_->max_rows)
      throw std::invalid_argument("plan batch size exceeds the batch layout");
    // A Python consumer pays a few µs per wake-up (more than building a small batch): wake it
    // for half the window at once. A transfer thread wants each batch as soon as it exists.
    const int64_t wake = spec.native_consumer ? 1 : std::max<int64_t>(1, prefetch / 2);
    const bool by_source = source_->wants_sources() && spec.plan->fills_sources();
    outputs_.push_back(std::make_unique<Output>(std::move(spec.plan), spec.native_consumer, wake, by_source));
    outputs_.back()->slots.resize(static_cast<size_t>(prefetch));
  }
}

Pipeline::~Pipeline() { release_unconsumed(); }

void Pipeline::cancel() {
  if (fork_generation() != fork_generation_) return;  // no thread of ours runs here to stop
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelled_ = true;
  }
  work_cv_.notify_all();
  for (auto& out : outputs_) out->ready_cv.notify_all();
}

bool Pipeline::cancelled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancelled_;
}

void Pipeline::release_unconsumed() {
  if (fork_generation() != fork_generation_) return;
  std::vector<Batch> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& out : outputs_)
      for (Slot& s : out->slots)
        if (s.ready) {
          dropped.push_back(std::move(s.batch));
          s.batch = Batch();
          s.ready = false;
          s.step = -1;
        }
  }
  // `dropped` returns the buffers to their pools here, outside mutex_.
}

namespace {
std::exception_ptr collation_error(const std::string& context, const std::exception_ptr& e) {
  std::string what = "unknown error";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
  }
  return std::make_exception_ptr(CollationError(context + ": " + what, e));
}
}  // namespace

void Pipeline::fail_locked(const std::string& context, std::exception_ptr e) {
  if (!error_) error_ = collation_error(context, e);  // the first failure stops the claims
  work_cv_.notify_all();
  for (auto& out : outputs_) out->ready_cv.notify_all();
}

void Pipeline::fail_step_locked(Output& o, int64_t step, std::exception_ptr e) {
  // Batches are counted from 0 within this iterator's run, and every batch before the failed
  // one is handed out first: the number in the message is always the count handed out before it.
  const std::string context = "fastload collation thread failed on batch " + std::to_string(step) +
                              " of epoch " + std::to_string(o.plan->epoch()) + " (this iterator's batches, counted " +
                              "from 0: the " + std::to_string(step) + " before it were handed out)";
  if (o.failed_step < 0 || step < o.failed_step) {
    o.failed_step = step;
    o.failure = collation_error(context, e);
  }
  fail_locked(context, std::move(e));
}

bool Pipeline::failed_here_locked(const Output& o) const {
  if (!error_) return false;
  // Every batch claimed before the failure is still built (or fails too, moving failed_step
  // earlier): the consumer waits for those and raises once it reaches the failure.
  return o.taken >= (o.failed_step >= 0 ? o.failed_step : o.next_claim);
}

int64_t Pipeline::taken(int output) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outputs_[output]->taken;
}

int64_t Pipeline::ready_count(int output) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ready_count_locked(*outputs_[output]);
}

int64_t Pipeline::ready_count_locked(const Output& o) const {
  int64_t n = 0;
  while (o.taken + n < o.next_claim) {
    const Slot& s = o.slots[static_cast<size_t>((o.taken + n) % prefetch_)];
    if (!s.ready || s.step != o.taken + n) break;
    ++n;
  }
  return n;
}

int64_t Pipeline::fetch_wait_ns() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fetch_wait_ns_;
}

StageTimes Pipeline::collation_times() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return collation_;
}

bool Pipeline::claim(int* output, int64_t* step) {
  // The output furthest behind goes first, so outputs consumed from separate threads progress
  // together and one stalled output never blocks the others.
  int best = -1;
  for (int d = 0; d < num_outputs(); ++d) {
    const Output& o = *outputs_[d];
    if (o.next_claim >= o.num_batches || o.next_claim >= o.retired + prefetch_) continue;
    if (best < 0 || o.next_claim < outputs_[best]->next_claim) best = d;
  }
  if (best < 0) return false;
  *output = best;
  *step = outputs_[best]->next_claim++;
  return true;
}

bool Pipeline::worth_waking_worker(const Output& o) const {
  // Free places: those a worker may claim now. Every consumer waiting on an unclaimed batch has
  // the whole window free (prefetch >= worker_wake_places_), so this never starves a consumer.
  return o.retired + prefetch_ - o.next_claim >= worker_wake_places_ && o.next_claim < o.num_batches;
}

bool Pipeline::worth_waking(const Output& o) const {
  // Never more than is already claimed: the first batch of an epoch (or after a stall) is not
  // held back for batches nobody is building yet.
  const int64_t wanted =
      std::min({o.num_batches - o.taken, o.wake_batch, o.next_claim - o.taken});
  for (int64_t i = 0; i < wanted; ++i) {
    const Slot& s = o.slots[static_cast<size_t>((o.taken + i) % prefetch_)];
    if (!s.ready || s.step != o.taken + i) return false;
  }
  return true;
}

void Pipeline::build(int output, int64_t step, int thread, WorkerScratch& scratch, Batch* batch) {
  if (step == fail_at_step_)
    throw std::runtime_error("injected failure (test hook) at batch " + std::to_string(step));
  const Output& o = *outputs_[output];
  const BatchPlan& plan = *o.plan;
  const BatchLayout& L = *layout_;
  batch->step = step;
  batch->parts.resize(L.num_parts());
  for (size_t p = 0; p < L.num_parts(); ++p) batch->parts[p] = pools_[static_cast<size_t>(output)][p]->acquire(thread);
  BatchRows out;
  out.ids = L.with_index ? reinterpret_cast<int64_t*>(batch->parts[L.index_part]->data()) : scratch.ids.data();
  out.valid = L.with_valid ? reinterpret_cast<bool*>(batch->parts[L.valid_part]->data()) : nullptr;
  out.sources = L.with_source ? reinterpret_cast<int64_t*>(batch->parts[L.source_part]->data()) : nullptr;
  out.cursor = scratch.cursors[static_cast<size_t>(output)].get();
  if (o.by_source) {
    // The mixed source reads each source's rows and local ids: the ids go unread unless they
    // are a part of the batch, and the rows' sources unless the batch has a "source" part.
    out.local_ids = scratch.local_ids.data();
    out.source_rows = scratch.source_rows.data();
    if (!L.with_index) out.ids = nullptr;
  }
  // Each row's epoch of its own source, where the plan has them and the source reads them.
  const bool source_epochs = !scratch.epochs.empty() && plan.fills_epochs();
  if (source_epochs) out.epochs = scratch.epochs.data();
  batch->rows = plan.fill(step, out);
  std::byte* parts[kMaxInlineParts];
  std::vector<std::byte*> many;
  std::byte** part_ptrs = parts;
  if (L.source_parts > kMaxInlineParts) {
    many.resize(L.source_parts);
    part_ptrs = many.data();
  }
  for (size_t p = 0; p < L.source_parts; ++p) part_ptrs[p] = batch->parts[p]->data();
  FillRequest request;
  request.ids = out.ids;
  request.count = batch->rows;
  request.parts = part_ptrs;
  request.seed = o.seed;
  request.epoch = plan.sample_epoch(step);
  request.step = step;
  request.thread = thread;
  request.extras = &batch->extras;
  request.plan = &plan;
  if (source_epochs) request.source_epochs = out.epochs;
  if (o.by_source) {
    request.local_ids = out.local_ids;
    request.source_rows = out.source_rows;
    request.num_sources = plan.num_sources();
  }
  source_->fill(request);
}

void Pipeline::work(int thread) {
  WorkerScratch scratch;
  try {
    const size_t rows = static_cast<size_t>(layout_->max_rows);
    int sources = 0;  // a mixture's, for each source's first row
    for (const auto& o : outputs_) {
      if (o->by_source) sources = std::max(sources, o->plan->num_sources());
      scratch.cursors.push_back(o->plan->cursor());
    }
    if (!layout_->with_index) scratch.ids.resize(rows);
    if (source_->wants_source_epochs()) scratch.epochs.resize(rows);
    if (sources > 0) {
      scratch.local_ids.resize(rows);
      scratch.source_rows.resize(static_cast<size_t>(sources) + 1);
    }
  } catch (...) {
    // An exception escaping a pool thread would std::terminate the process: report it instead.
    std::lock_guard<std::mutex> lock(mutex_);
    fail_locked("fastload collation thread could not allocate its scratch", std::current_exception());
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  // The consumer this worker's last publish made worth waking. It is notified only after
  // mutex_ is released: woken under the lock, it would find mutex_ held and sleep again on the
  // mutex itself, a second futex wait and wake per wake-up (measured: half the loop thread's
  // context switches on the small-batch benchmarks).
  std::condition_variable* wake_consumer = nullptr;
  auto unlock_and_wake = [&] {
    lock.unlock();
    if (wake_consumer) wake_consumer->notify_all();
    wake_consumer = nullptr;
  };
  for (;;) {
    int output;
    int64_t step;
    while (!cancelled_ && !error_ && !claim(&output, &step)) {
      bool anything_left = false;
      for (auto& o : outputs_) anything_left |= o->next_claim < o->num_batches;
      if (!anything_left) return unlock_and_wake();
      if (wake_consumer) {  // never sleep on a pending wake-up: only that consumer may free a place
        unlock_and_wake();
        lock.lock();
        continue;
      }
      work_cv_.wait(lock);
    }
    if (cancelled_ || error_) return unlock_and_wake();
    unlock_and_wake();
    Batch batch;
    std::exception_ptr failure;
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t fetch_wait0 = t_fetch_wait_ns;
    try {
      build(output, step, thread, scratch, &batch);
    } catch (...) {
      failure = std::current_exception();
    }
    const int64_t took = StageTimes::since(t0);
    if (failure) batch = Batch();  // buffers back to their pools, outside mutex_
    lock.lock();
    collation_.record(took);
    fetch_wait_ns_ += t_fetch_wait_ns - fetch_wait0;
    Output& o = *outputs_[output];
    if (failure) {
      fail_step_locked(o, step, failure);
      return;
    }
    Slot& slot = o.slots[static_cast<size_t>(step % prefetch_)];
    slot.step = step;
    slot.ready = true;
    slot.batch = std::move(batch);
    // After a failure the batch that would complete a wake-up run may never come: wake at once.
    if (o.waiting > 0 && (error_ || worth_waking(o))) wake_consumer = &o.ready_cv;
  }
}

NextStatus Pipeline::next(int output, std::chrono::milliseconds timeout, Batch* out, int64_t* ready_at_entry) {
  if (fork_generation() != fork_generation_)
    throw std::runtime_error("this epoch's threads belong to the parent of a fork()");
  std::unique_lock<std::mutex> lock(mutex_);
  Output& o = *outputs_.at(static_cast<size_t>(output));
  if (ready_at_entry) *ready_at_entry = ready_count_locked(o);
  // The slot is looked up afresh on every wake: another consumer of this output may have taken
  // the batch this thread was waiting for.
  auto ready = [&] {
    if (o.taken >= o.num_batches) return true;
    const Slot& s = o.slots[static_cast<size_t>(o.taken % prefetch_)];
    return s.ready && s.step == o.taken;
  };
  ++o.waiting;
  const bool arrived =
      o.ready_cv.wait_for(lock, timeout, [&] { return cancelled_ || failed_here_locked(o) || ready(); });
  --o.waiting;
  if (failed_here_locked(o)) std::rethrow_exception(o.failure ? o.failure : error_);
  if (cancelled_) return NextStatus::Cancelled;
  if (!arrived) return NextStatus::Timeout;
  if (o.taken >= o.num_batches) return NextStatus::End;
  Slot& slot = o.slots[static_cast<size_t>(o.taken % prefetch_)];
  *out = std::move(slot.batch);
  slot.batch = Batch();
  slot.ready = false;
  slot.step = -1;
  ++o.taken;
  bool wake_worker = false;
  if (!o.native_consumer) {  // a Python consumer's take frees the window place (see retire)
    ++o.retired;
    wake_worker = worth_waking_worker(o);
  }
  // Another consumer of this output may already be able to take the next batch (woken after
  // the unlock, as in work()).
  const bool wake_other = o.waiting > 0 && ready();
  lock.unlock();
  if (wake_other) o.ready_cv.notify_one();
  if (wake_worker) work_cv_.notify_one();
  return NextStatus::Ok;
}

void Pipeline::retire(int output) {
  if (fork_generation() != fork_generation_) return;
  bool wake_worker;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Output& o = *outputs_.at(static_cast<size_t>(output));
    if (o.retired >= o.taken) return;  // nothing taken is unretired: a double retire is harmless
    ++o.retired;
    wake_worker = worth_waking_worker(o);
  }
  if (wake_worker) work_cv_.notify_one();
}

}  // namespace fastload
