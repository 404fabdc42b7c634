// Plans over packed rows; see pack_plan.h.
#include "core/pack_plan.h"

#include <algorithm>
#include <stdexcept>

#include "core/stream_plan.h"  // kMaxStreamPosition

namespace fastload {

SamplerConfig PackEpochPlan::rows_config(SamplerConfig cfg, int64_t rows) {
  cfg.num_samples = rows;
  cfg.shuffle = false;  // the documents were shuffled; rows go in packing order
  cfg.shard_rows.clear();
  cfg.partition = Partition::Samples;
  return cfg;
}

PackEpochPlan::PackEpochPlan(std::shared_ptr<const EpochPacking> packing, SamplerConfig cfg, int64_t start)
    : packing_(std::move(packing)), plan_(rows_config(std::move(cfg), packing_->rows()), packing_->epoch(), start) {
  if (start > packing_->rows())
    throw std::invalid_argument("resume position " + std::to_string(start) + " is past the " +
                                std::to_string(packing_->rows()) + " packed rows of epoch " +
                                std::to_string(packing_->epoch()) + " (was the state saved with other packing "
                                "options or another seed?)");
}

int64_t PackEpochPlan::fill(int64_t batch, const BatchRows& out) const {
  const BatchSpan span = plan_.batch(batch);
  const int64_t rows = packing_->rows();
  for (int64_t i = 0; i < span.count; ++i) {
    const int64_t position = span.first + i;  // padding positions (>= rows) stay: empty rows
    if (out.ids) out.ids[i] = position;
    if (out.valid) out.valid[i] = position < rows;
  }
  return span.count;
}

PackedRowRef PackEpochPlan::locate(int64_t id) const {
  if (id < 0) throw std::out_of_range("packed row " + std::to_string(id) + " is negative");
  if (id >= packing_->rows()) return {};
  return {packing_, id};
}

// ------------------------------------------------------------------ streams (steps=)

PackEpochs::PackEpochs(EpochOf epoch_of, int64_t first_epoch, int64_t first_start)
    : epoch_of_(std::move(epoch_of)), first_epoch_(first_epoch) {
  auto packing = epoch_of_(first_epoch);
  epochs_.push_back({first_start, packing->rows(), std::move(packing)});
}

size_t PackEpochs::index_locked(int64_t position) const {
  if (position < epochs_.front().start)
    throw std::out_of_range("stream position " + std::to_string(position) + " is before the anchor's epoch");
  while (position >= epochs_.back().start + epochs_.back().rows) {
    const int64_t start = epochs_.back().start + epochs_.back().rows;
    auto packing = epoch_of_(first_epoch_ + static_cast<int64_t>(epochs_.size()));
    const int64_t rows = packing->rows();
    epochs_.push_back({start, rows, std::move(packing)});
    if (epochs_.size() > kKept) epochs_[epochs_.size() - kKept - 1].packing.reset();
  }
  const auto it = std::upper_bound(epochs_.begin(), epochs_.end(), position,
                                   [](int64_t p, const Known& e) { return p < e.start; });
  return static_cast<size_t>(it - epochs_.begin()) - 1;
}

std::pair<std::shared_ptr<const EpochPacking>, int64_t> PackEpochs::at(int64_t position) const {
  std::lock_guard<std::mutex> lock(mu_);  // planning a new epoch holds it: the others wait for it
  const size_t k = index_locked(position);
  Known& e = epochs_[k];
  if (!e.packing) e.packing = epoch_of_(first_epoch_ + static_cast<int64_t>(k));  // an old one, asked again
  return {e.packing, e.start};
}

std::pair<int64_t, int64_t> PackEpochs::epoch_at(int64_t position) const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t k = index_locked(position);
  return {first_epoch_ + static_cast<int64_t>(k), epochs_[k].start};
}

PackStreamPlan::PackStreamPlan(std::shared_ptr<const PackEpochs> epochs, PackAnchor anchor, int64_t batch_size,
                               int64_t replicas, int64_t rank, int64_t first_step, int64_t end_step, int64_t epoch,
                               uint64_t seed)
    : epochs_(std::move(epochs)), anchor_(anchor), batch_size_(batch_size), replicas_(replicas), rank_(rank),
      first_(first_step), end_(end_step), epoch_(epoch), seed_(seed) {
  if (batch_size <= 0 || replicas <= 0 || rank < 0 || rank >= replicas)
    throw std::invalid_argument("a packed stream needs batch_size > 0 and 0 <= rank < replicas");
  if (first_step < anchor.origin || end_step < first_step)
    throw std::invalid_argument("steps [" + std::to_string(first_step) + ", " + std::to_string(end_step) +
                                ") do not follow the anchor at step " + std::to_string(anchor.origin));
  const int64_t g = batch_size * replicas;
  if (end_step - anchor.origin > (kMaxStreamPosition - anchor.position) / g)
    throw std::invalid_argument("steps up to " + std::to_string(end_step) + " pass the stream's 2**62 positions");
}

int64_t PackStreamPlan::step_position(int64_t step) const {
  return anchor_.position + (step - anchor_.origin) * batch_size_ * replicas_;
}

int64_t PackStreamPlan::fill(int64_t batch, const BatchRows& out) const {
  const int64_t first = step_position(first_ + batch) + rank_ * batch_size_;
  for (int64_t i = 0; i < batch_size_; ++i) {
    if (out.ids) out.ids[i] = first + i;
    if (out.valid) out.valid[i] = true;
  }
  return batch_size_;
}

PackedRowRef PackStreamPlan::locate(int64_t id) const {
  auto [packing, start] = epochs_->at(id);
  return {std::move(packing), id - start};
}

}  // namespace fastload
