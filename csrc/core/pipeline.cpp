// The epoch pipeline; see pipeline.h.
#include "core/pipeline.h"

#include <algorithm>
#include <stdexcept>

#include "core/fork_guard.h"

namespace fastload {

namespace {
constexpr size_t kAlign = 64;  // every part starts on its own cache line
size_t align_up(size_t x) { return (x + kAlign - 1) / kAlign * kAlign; }
}  // namespace

BatchLayout::BatchLayout(std::vector<ColumnSpec> cols, bool index, bool valid, int64_t rows)
    : columns(std::move(cols)), with_index(index), with_valid(valid), max_rows(rows) {
  size_t offset = 0;
  for (const ColumnSpec& c : columns) {
    column_offsets.push_back(offset);
    offset = align_up(offset + static_cast<size_t>(c.row_bytes) * static_cast<size_t>(rows));
  }
  index_offset = offset;
  if (with_index) offset = align_up(offset + sizeof(int64_t) * static_cast<size_t>(rows));
  valid_offset = offset;
  if (with_valid) offset = align_up(offset + static_cast<size_t>(rows));
  total_bytes = offset;
}

Pipeline::Pipeline(std::shared_ptr<const BatchLayout> layout, std::vector<EpochPlan> plans,
                   int64_t prefetch, std::shared_ptr<BufferPool> pool, int64_t fail_at_step)
    : layout_(std::move(layout)), prefetch_(prefetch),
      wake_batch_(prefetch / 2 > 1 ? prefetch / 2 : 1), pool_(std::move(pool)),
      fail_at_step_(fail_at_step), fork_generation_(fork_generation()) {
  if (prefetch <= 0)
    throw std::invalid_argument("prefetch must be positive, got " + std::to_string(prefetch));
  for (EpochPlan& p : plans) {
    if (p.max_batch_rows() > layout_->max_rows)
      throw std::invalid_argument("plan batch size exceeds the batch layout");
    outputs_.push_back(std::make_unique<Output>(std::move(p)));
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

void Pipeline::release_unconsumed() {
  if (fork_generation() != fork_generation_) return;
  std::vector<std::shared_ptr<HostBuffer>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& out : outputs_)
      for (Slot& s : out->slots)
        if (s.batch.buffer) {
          pool_->left_pipeline();
          dropped.push_back(std::move(s.batch.buffer));
          s.ready = false;
          s.step = -1;
        }
  }
  // `dropped` returns the buffers to the pool here, outside mutex_.
}

void Pipeline::fail_locked(const std::string& message) {
  if (error_.empty()) error_ = message;  // the first failure is the one reported
  work_cv_.notify_all();
  for (auto& out : outputs_) out->ready_cv.notify_all();
}

int64_t Pipeline::handed_out(int output) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return outputs_[output]->consumed;
}

bool Pipeline::claim(int* output, int64_t* step) {
  // The output furthest behind goes first, so outputs consumed from separate threads progress
  // together and one stalled output never blocks the others.
  int best = -1;
  for (int d = 0; d < num_outputs(); ++d) {
    const Output& o = *outputs_[d];
    if (o.next_claim >= o.plan.num_batches() || o.next_claim >= o.consumed + prefetch_) continue;
    if (best < 0 || o.next_claim < outputs_[best]->next_claim) best = d;
  }
  if (best < 0) return false;
  *output = best;
  *step = outputs_[best]->next_claim++;
  return true;
}

bool Pipeline::worth_waking(const Output& o) const {
  // Never more than is already claimed: the first batch of an epoch (or after a stall) is not
  // held back for batches nobody is building yet.
  const int64_t wanted =
      std::min({o.plan.num_batches() - o.consumed, wake_batch_, o.next_claim - o.consumed});
  for (int64_t i = 0; i < wanted; ++i) {
    const Slot& s = o.slots[static_cast<size_t>((o.consumed + i) % prefetch_)];
    if (!s.ready || s.step != o.consumed + i) return false;
  }
  return true;
}

void Pipeline::build(int output, int64_t step, std::vector<int64_t>& ids_scratch, Batch* batch) {
  if (step == fail_at_step_)
    throw std::runtime_error("injected failure (test hook) at batch " + std::to_string(step));
  const EpochPlan& plan = outputs_[output]->plan;
  const BatchSpan span = plan.batch(step);
  const BatchLayout& L = *layout_;
  batch->buffer = pool_->acquire();
  batch->rows = span.count;
  batch->step = step;
  std::byte* base = batch->buffer->data();
  int64_t* ids = L.with_index ? reinterpret_cast<int64_t*>(base + L.index_offset)
                              : ids_scratch.data();
  bool* valid = L.with_valid ? reinterpret_cast<bool*>(base + L.valid_offset) : nullptr;
  plan.fill_ids(span, ids, valid);
  for (size_t c = 0; c < L.columns.size(); ++c)
    gather_rows(L.columns[c], ids, span.count, base + L.column_offsets[c]);
}

void Pipeline::work() {
  std::vector<int64_t> ids_scratch;
  try {
    // Only needed when the ids are not written into the batch buffer itself.
    if (!layout_->with_index) ids_scratch.resize(static_cast<size_t>(layout_->max_rows));
  } catch (const std::exception& e) {
    // An exception escaping a pool thread would std::terminate the process: report it instead.
    std::lock_guard<std::mutex> lock(mutex_);
    fail_locked(std::string("fastload collation thread could not allocate its id scratch: ") +
                e.what());
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    int output;
    int64_t step;
    while (!cancelled_ && error_.empty() && !claim(&output, &step)) {
      bool anything_left = false;
      for (auto& o : outputs_) anything_left |= o->next_claim < o->plan.num_batches();
      if (!anything_left) return;
      work_cv_.wait(lock);
    }
    if (cancelled_ || !error_.empty()) return;
    lock.unlock();
    Batch batch;
    std::string failure;
    try {
      build(output, step, ids_scratch, &batch);
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "unknown error";
    }
    lock.lock();
    Output& o = *outputs_[output];
    if (!failure.empty()) {
      if (batch.buffer) {
        pool_->left_pipeline();
        batch.buffer.reset();
      }
      fail_locked("fastload collation thread failed on batch " + std::to_string(step) +
                  " of epoch " + std::to_string(o.plan.epoch()) + ": " + failure);
      return;
    }
    Slot& slot = o.slots[static_cast<size_t>(step % prefetch_)];
    slot.step = step;
    slot.ready = true;
    slot.batch = std::move(batch);
    if (o.consumer_waiting && worth_waking(o)) o.ready_cv.notify_one();
  }
}

NextStatus Pipeline::next(int output, std::chrono::milliseconds timeout, Batch* out) {
  if (fork_generation() != fork_generation_)
    throw std::runtime_error("this epoch's threads belong to the parent of a fork()");
  std::unique_lock<std::mutex> lock(mutex_);
  Output& o = *outputs_.at(static_cast<size_t>(output));
  if (!error_.empty()) throw std::runtime_error(error_);
  if (o.consumed >= o.plan.num_batches()) return NextStatus::End;
  Slot& slot = o.slots[static_cast<size_t>(o.consumed % prefetch_)];
  o.consumer_waiting = true;
  const bool arrived = o.ready_cv.wait_for(lock, timeout, [&] {
    return cancelled_ || !error_.empty() || (slot.ready && slot.step == o.consumed);
  });
  o.consumer_waiting = false;
  if (!error_.empty()) throw std::runtime_error(error_);
  if (cancelled_) throw std::runtime_error("this epoch's batches were cancelled");
  if (!arrived) return NextStatus::Timeout;
  *out = std::move(slot.batch);
  slot.ready = false;
  slot.step = -1;
  ++o.consumed;
  pool_->left_pipeline();
  lock.unlock();
  work_cv_.notify_one();  // a slot is free: one waiting worker may claim
  return NextStatus::Ok;
}

}  // namespace fastload
