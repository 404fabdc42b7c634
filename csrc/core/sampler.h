// The sampling contract: which sample ids each rank's batches hold, as a pure function of the
// configuration, the epoch and the resume position (see shared/DESIGN.md, "Sampling contract").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/batch_plan.h"
#include "core/permutation.h"
#include "core/shard_order.h"

namespace fastload {

enum class Order { Random, Block };
enum class Even { Pad, Drop, Mask };
enum class Partition { Samples, Shards };

// The one spelling of each option's values, in enum order (Python reads them from fastload._C).
inline const char* const kOrderNames[] = {"random", "block"};
inline const char* const kEvenNames[] = {"pad", "drop", "mask"};
inline const char* const kPartitionNames[] = {"samples", "shards"};

// The largest global batch (batch_size x replicas) a sampler takes: positions within an epoch and
// padding stay far inside int64. The one copy of the limit (Python reads fastload._C.MAX_GLOBAL_BATCH).
constexpr int64_t kMaxGlobalBatch = int64_t{1} << 40;

// order="block": samples per block (large enough that a block is a long sequential read) and, over
// shards, the fewest shards whose samples are shuffled together (more small ones, until a window
// holds kBlockSize samples). The one copy (Python reads fastload._C.BLOCK_SIZE and WINDOW_SHARDS).
constexpr int64_t kBlockSize = 4096;
constexpr int64_t kWindowShards = 4;

Order parse_order(const std::string& s);
Even parse_even(const std::string& s);
Partition parse_partition(const std::string& s);

struct SamplerConfig {
  SamplerConfig() = default;
  // The fields every caller sets (the Python binding, the C++ tests); the shard fields and the
  // partition keep their defaults. Not validated: the caller does that.
  SamplerConfig(int64_t num_samples, int64_t batch_size, int64_t world_size, int64_t rank, uint64_t seed,
                bool shuffle, Order order, Even even, bool drop_last, int64_t block_size)
      : num_samples(num_samples), batch_size(batch_size), world_size(world_size), rank(rank), seed(seed),
        shuffle(shuffle), order(order), even(even), drop_last(drop_last), block_size(block_size) {}

  int64_t num_samples = 0;
  int64_t batch_size = 1;
  int64_t world_size = 1;
  int64_t rank = 0;
  uint64_t seed = 0;
  bool shuffle = false;
  Order order = Order::Random;
  Even even = Even::Pad;
  bool drop_last = false;
  int64_t block_size = kBlockSize;  // samples per block for Order::Block (no shards); min window rows
  // Samples per shard, in id order (empty: no shard structure). With shards, Order::Block
  // shuffles the shards, then the samples within windows of window_shards consecutive shards.
  std::vector<int64_t> shard_rows;
  int64_t window_shards = kWindowShards;
  Partition partition = Partition::Samples;
  void validate() const;      // throws std::invalid_argument naming the field and value
};

// The epoch's order of samples: position p in [0, size()) -> sample id. Shuffle off is the
// identity. With Partition::Samples it orders the whole source (size() = num_samples); with
// Partition::Shards it orders this rank's own shards (size() = their rows).
class Ordering {
 public:
  Ordering(const SamplerConfig& cfg, int64_t epoch);
  int64_t size() const { return n_; }
  int64_t operator()(int64_t position) const;
  void fill(int64_t first, int64_t count, int64_t* out) const;  // positions in [0, size())
  // out[i] = (*this)(first + i * step): a rank's every world_size-th position of a stream.
  void fill_strided(int64_t first, int64_t step, int64_t count, int64_t* out) const;
  // Partition::Shards: the rows of every rank's shards this epoch (empty otherwise).
  const std::vector<int64_t>& rank_rows() const { return rank_rows_; }

 private:
  struct BlockSlot { int64_t block, offset; };
  BlockSlot block_slot(int64_t position) const;
  Permutation inner(int64_t block) const;

  int64_t n_;
  bool shuffle_;
  Order order_;
  uint64_t seed_, epoch_;
  Permutation perm_;  // whole range (Random) or the blocks (Block)
  int64_t block_size_ = 0, num_blocks_ = 0, last_block_size_ = 0, short_slot_ = 0;
  bool by_segments_ = false;  // shard-aware: segments_ decides (Block over shards, or Shards)
  SegmentOrder segments_;
  std::vector<int64_t> rank_rows_;
};

// A contiguous run of epoch positions: one batch of one rank (or device).
struct BatchSpan {
  int64_t first = 0;  // epoch position of the batch's first sample
  int64_t count = 0;  // samples in the batch
};

// One rank's batches for one epoch, starting at a global position (0, or where a resumed run
// stopped). Step s covers positions [start + s*G, start + (s+1)*G) with G = batch_size*world_size;
// rank r takes the r-th slice of batch_size. The epoch's length is made a multiple of world_size
// (pad/mask wrap around, drop cuts); a final shorter step is split into equal contiguous shares.
// Partition::Shards: every rank's own sequence is made L long (pad/mask: the largest rank's rows,
// wrapping around its own order; drop: the smallest's), and the global sequence is W*L long:
// position start + q, inside rank r's slice, is the rank's local position start/W + (the number
// of the rank's positions before it in the steps from start). start must be a multiple of W.
class EpochPlan final : public BatchPlan {
 public:
  EpochPlan(const SamplerConfig& cfg, int64_t epoch, int64_t start_position);

  int64_t num_batches() const override { return num_batches_; }
  int64_t epoch() const override { return epoch_; }
  int64_t sample_epoch(int64_t /*step*/) const override { return epoch_; }
  uint64_t seed() const override { return cfg_.seed; }
  int64_t start_position() const { return start_; }
  int64_t end_position() const { return end_; }        // length of the epoch's sequence
  int64_t global_batch() const { return global_batch_; }
  int64_t max_batch_rows() const override { return full_steps_ > 0 ? cfg_.batch_size : tail_share_; }
  // Global position after this rank has handed out k batches (the resume point).
  int64_t position_after(int64_t batches_done) const override;
  BatchSpan batch(int64_t step) const;
  // ids[i] = sample id of the batch's i-th row; valid[i] = not padding (valid may be null).
  void fill_ids(const BatchSpan& span, int64_t* ids, bool* valid) const;
  int64_t rows(int64_t step) const override { return batch(step).count; }
  int64_t fill(int64_t step, const BatchRows& out) const override {
    const BatchSpan span = batch(step);
    fill_ids(span, out.ids, out.valid);
    return span.count;
  }
  const SamplerConfig& config() const { return cfg_; }

 private:
  SamplerConfig cfg_;
  int64_t epoch_, start_, end_;
  int64_t global_batch_, full_steps_, tail_share_, num_batches_;
  Ordering ordering_;
  int64_t local_length_ = 0;  // Partition::Shards: L
};

}  // namespace fastload
