// Step-based sampling: an endless stream of full global steps over one source or a weighted
// mixture of several, each source read in its own epochs (its Ordering, one epoch after the
// other). A StreamPlan is one rank's batches of a range of global steps; every batch is computed
// from the configuration and its step alone (no index array; O(sources * log) per batch at most).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/batch_plan.h"
#include "core/mix_schedule.h"
#include "core/sampler.h"

namespace fastload {

// One source of a stream: how it is ordered within each of its epochs (an Ordering of its own
// num_samples, shuffle, order, block and shard settings and seed; the batch geometry fields are
// unused) and its first id in the loader's id space (a mixture's sources are laid end to end).
struct StreamSource {
  SamplerConfig order;
  int64_t offset = 0;
};

// Stream positions and global steps stay below this (room to add a batch without overflow).
inline constexpr int64_t kMaxStreamPosition = int64_t{1} << 62;

// The seed of source j's orderings: the loader's own for a stream of one source (so steps over
// one source run exactly the epochs a Loader without steps= runs), else a seed keyed by j.
uint64_t stream_source_seed(uint64_t seed, int source, int num_sources);

// Global step g (g >= origin) holds d_j(g - origin) samples of source j (the schedule), laid end
// to end in source order. Source j's samples of step g are its stream positions
// p = base_positions[j] + schedule.taken(j, g - origin) + t, t < d_j; position p is sample
// Ordering_j(epoch p / N_j)(p mod N_j), id offset_j + that. Replica r of R takes global batch
// positions k*R + r for rows k = 0..batch_size-1 (a round-robin deal: every replica gets each
// source's share to within one sample), so a batch's rows are grouped by source.
struct StreamConfig {
  std::vector<StreamSource> sources;
  MixSchedule schedule;
  int64_t origin = 0;                   // the global step where the schedule's step 0 is
  std::vector<int64_t> base_positions;  // each source's stream position at the origin
  int64_t batch_size = 1;               // rows per batch of each replica
  int64_t replicas = 1;                 // batch_size * replicas = the schedule's global batch
  int64_t rank = 0;                     // this replica, in [0, replicas)
  uint64_t seed = 0;                    // the loader's (per-sample randomness)
  void validate() const;                // throws std::invalid_argument naming the field
};

class StreamPlan final : public BatchPlan {
 public:
  // This replica's batches of global steps [first_step, end_step); `epoch` is the loader's epoch
  // it runs (0 for steps=). Throws std::invalid_argument if a position would pass 2^62.
  StreamPlan(std::shared_ptr<const StreamConfig> config, int64_t first_step, int64_t end_step, int64_t epoch);

  int64_t num_batches() const override { return end_ - first_; }
  int64_t max_batch_rows() const override { return config_->batch_size; }
  int64_t epoch() const override { return epoch_; }
  uint64_t seed() const override { return config_->seed; }
  int64_t rows(int64_t batch) const override;
  int64_t fill(int64_t batch, const BatchRows& out) const override;
  // Per-sample randomness is keyed by the global step: a sample drawn again in a later epoch
  // of its source is in another step.
  int64_t sample_epoch(int64_t batch) const override { return first_ + batch; }
  int64_t position_after(int64_t batches_done) const override;  // the global step to resume at
  int num_sources() const override { return static_cast<int>(config_->sources.size()); }
  bool fills_sources() const override { return true; }
  bool fills_epochs() const override { return true; }
  void add_source_rows(int64_t batch, int64_t* counts) const override;
  // A thread's cursor keeps its last step's extras and each source's current epoch: its next
  // batch advances them in O(sources * steps apart), with no lock and no shared reference count.
  std::unique_ptr<PlanCursor> cursor() const override;

  int64_t first_step() const { return first_; }
  int64_t end_step() const { return end_; }
  const StreamConfig& config() const { return *config_; }
  // Every source's stream position at the start of global step `step` (origin <= step <= end).
  void positions(int64_t step, int64_t* out) const;
  // Samples of each source in global step `step` (all replicas together).
  void step_counts(int64_t step, int64_t* out) const;

 private:
  class Cursor;  // stream_plan.cpp
  struct Extras {
    int64_t step = -1;         // schedule step (global step - origin)
    std::vector<int64_t> sum;  // E_j(step) of every source
  };
  struct CachedOrdering {
    int64_t epoch = -1;
    std::shared_ptr<const Ordering> ordering;
  };
  // A source's ids at consecutive positions of one of its epochs (world size 1): computed once,
  // in one long permutation pass, and copied into the batches of every thread.
  struct IdBlock {
    int64_t epoch = 0;
    int64_t first = 0;  // the epoch position of ids[0]
    int64_t size = 0;
    std::unique_ptr<int64_t[]> ids;  // not zeroed first: every id is written once
  };
  void extras_at(int64_t local_step, int64_t* out) const;
  // Under mutex_: E_j at local_step from the cache (advanced, stored), or false if no cached step
  // is near enough (then the caller computes it with floor sums, unlocked, and stores it).
  bool cached_extras_locked(int64_t local_step, int64_t* out) const;
  void store_extras_locked(int64_t local_step, const int64_t* sums) const;
  std::shared_ptr<const Ordering> cached_ordering_locked(int source, int64_t epoch) const;
  std::shared_ptr<const Ordering> ordering(int source, int64_t epoch) const;
  // The block of source j's epoch `epoch` holding position `within`: from the shared ring, or
  // computed with `order` (unlocked) and stored there.
  std::shared_ptr<const IdBlock> id_block(int source, int64_t epoch, int64_t within, const Ordering& order) const;
  // Rows [*lo, *hi) of this replica's batch come from the step's positions [start, start + count).
  void rows_of(int64_t start, int64_t count, int64_t* lo, int64_t* hi) const;
  // The cursor's extras moved to schedule step `local` (stepped from its last step when near).
  void move_extras(Cursor& cursor, int64_t local) const;
  // Source j's rows [lo, hi) of a batch whose stream positions start at `first` (row lo's).
  void fill_source(Cursor& cursor, int j, int64_t first, int64_t lo, int64_t hi, const BatchRows& out) const;
  int64_t fill_with(int64_t batch, const BatchRows& out, Cursor& cursor) const;

  std::shared_ptr<const StreamConfig> config_;
  int64_t first_, end_, epoch_;
  // What a cursor does not have yet (a thread's first batch, a far jump, a source's new epoch or
  // id block) comes from these caches, shared by the threads: E_j at a recent step advances in
  // O(sources) per step instead of two O(log M) floor sums per source, orderings are built once
  // per (source, epoch) (O(shards) for a shard-aware order), and at world size 1 a source's ids
  // come in blocks of about 16 steps' share, so that a batch copies each source's run instead of
  // computing it (a short run of a permutation costs several times its share of a long one). All
  // are small (a block is at most kMaxBlock ids) and guarded by mutex_.
  static constexpr size_t kExtrasCache = 8;
  static constexpr int64_t kMaxAdvance = 256;
  static constexpr size_t kOrderingsPerSource = 4;
  static constexpr size_t kBlocksPerSource = 4;
  static constexpr int64_t kStepsPerBlock = 16, kMinBlock = 64, kMaxBlock = 4096;
  std::vector<int64_t> block_ids_;  // per source: ids in a block (0: no blocks, world size > 1)
  mutable std::mutex mutex_;
  mutable std::vector<Extras> extras_cache_;
  mutable size_t extras_next_ = 0;
  mutable std::vector<std::vector<CachedOrdering>> orderings_;  // per source, kOrderingsPerSource
  mutable std::vector<size_t> orderings_next_;
  mutable std::vector<std::vector<std::shared_ptr<const IdBlock>>> blocks_;  // per source, kBlocksPerSource
  mutable std::vector<size_t> blocks_next_;
};

}  // namespace fastload
