// The sampling contract over packed rows. The sample space of a loader over fl.Pack is an
// epoch's packed rows (EpochPacking): their number depends on the epoch's order of documents, so
// the plan asks the packing for it and then deals rows to ranks exactly as EpochPlan deals
// samples (rows in packing order; each step's rows split by rank; even= and drop_last as
// always). Padding rows of even="pad"/"mask" are empty rows (all padding), not repeated ones:
// no document is seen twice. A batch's ids are packed-row ids that only the plan can resolve
// (PackPlan::locate): the epoch's row number (epochs), or the stream position (steps=).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/batch_plan.h"
#include "core/pack_epoch.h"
#include "core/sampler.h"

namespace fastload {

// A packed row: row `row` of `packing`, or an empty row (padding) when packing is null.
struct PackedRowRef {
  std::shared_ptr<const EpochPacking> packing;
  int64_t row = -1;
};

class PackPlan : public BatchPlan {
 public:
  virtual PackedRowRef locate(int64_t id) const = 0;
};

// One rank's batches of one epoch of packed rows, from a global row position (0, or a resume).
class PackEpochPlan final : public PackPlan {
 public:
  // cfg: the batch geometry (batch_size, world_size, rank, even, drop_last, seed); its
  // num_samples, shuffle and shard settings are replaced: rows in packing order.
  PackEpochPlan(std::shared_ptr<const EpochPacking> packing, SamplerConfig cfg, int64_t start_position);

  int64_t num_batches() const override { return plan_.num_batches(); }
  int64_t max_batch_rows() const override { return plan_.max_batch_rows(); }
  int64_t epoch() const override { return plan_.epoch(); }
  uint64_t seed() const override { return plan_.seed(); }
  int64_t rows(int64_t batch) const override { return plan_.rows(batch); }
  int64_t fill(int64_t batch, const BatchRows& out) const override;
  int64_t position_after(int64_t batches_done) const override { return plan_.position_after(batches_done); }
  PackedRowRef locate(int64_t id) const override;
  const EpochPlan& rows_plan() const { return plan_; }
  const std::shared_ptr<const EpochPacking>& packing() const { return packing_; }

 private:
  static SamplerConfig rows_config(SamplerConfig cfg, int64_t rows);
  std::shared_ptr<const EpochPacking> packing_;
  EpochPlan plan_;
};

// Where a stream of packed rows (steps=) is anchored: global step `origin` starts at stream
// position `position`, which lies in epoch `epoch` starting at stream position `epoch_start`.
// Each epoch's rows follow the previous epoch's.
struct PackAnchor {
  int64_t origin = 0;
  int64_t position = 0;
  int64_t epoch = 0;
  int64_t epoch_start = 0;
};

// The epochs of a stream of packed rows, planned as positions reach them: epoch_of(e) packs
// epoch e. Where each epoch starts is kept (one int64 per epoch); the plans of the last few.
class PackEpochs {
 public:
  using EpochOf = std::function<std::shared_ptr<const EpochPacking>(int64_t epoch)>;
  PackEpochs(EpochOf epoch_of, int64_t first_epoch, int64_t first_start);
  // The epoch holding stream position p (>= the first epoch's start): (its packing, its start).
  std::pair<std::shared_ptr<const EpochPacking>, int64_t> at(int64_t position) const;
  // The epoch holding stream position p and where it starts (plans epochs up to it).
  std::pair<int64_t, int64_t> epoch_at(int64_t position) const;

 private:
  struct Known {
    int64_t start = 0, rows = 0;
    std::shared_ptr<const EpochPacking> packing;  // dropped for all but the last kKept epochs
  };
  static constexpr size_t kKept = 4;
  size_t index_locked(int64_t position) const;
  EpochOf epoch_of_;
  mutable std::mutex mu_;
  mutable std::vector<Known> epochs_;
  int64_t first_epoch_;
};

// One replica's batches of global steps [first_step, end_step) of the endless stream of packed
// rows: step g holds the stream positions [P(g), P(g) + G), P(g) = position + (g - origin) * G,
// G = batch_size * replicas; replica r takes [P(g) + r * batch_size, + batch_size). Every step is
// full (a step at an epoch's end takes the next epoch's first rows).
class PackStreamPlan final : public PackPlan {
 public:
  PackStreamPlan(std::shared_ptr<const PackEpochs> epochs, PackAnchor anchor, int64_t batch_size, int64_t replicas,
                 int64_t rank, int64_t first_step, int64_t end_step, int64_t epoch, uint64_t seed);

  int64_t num_batches() const override { return end_ - first_; }
  int64_t max_batch_rows() const override { return batch_size_; }
  int64_t epoch() const override { return epoch_; }
  uint64_t seed() const override { return seed_; }
  int64_t rows(int64_t) const override { return batch_size_; }
  int64_t fill(int64_t batch, const BatchRows& out) const override;
  int64_t sample_epoch(int64_t batch) const override { return first_ + batch; }
  int64_t position_after(int64_t batches_done) const override { return first_ + std::min(batches_done, end_ - first_); }
  PackedRowRef locate(int64_t id) const override;
  // The stream position where global step `step` starts.
  int64_t step_position(int64_t step) const;

 private:
  std::shared_ptr<const PackEpochs> epochs_;
  PackAnchor anchor_;
  int64_t batch_size_, replicas_, rank_, first_, end_, epoch_;
  uint64_t seed_;
};

}  // namespace fastload
