// Implementation of the sampling contract; see sampler.h.
#include "core/sampler.h"

#include <algorithm>
#include <stdexcept>

namespace fastload {

namespace {
[[noreturn]] void bad(const std::string& name, const std::string& why, long long value) {
  throw std::invalid_argument(name + " " + why + ", got " + std::to_string(value));
}

// Keys of the shard-aware orders, each xored into mix64(epoch): distinct random streams.
constexpr uint64_t kShardOrderSalt = 0x5ba4d0001ULL;  // the epoch's permutation of the shards
constexpr uint64_t kWindowSalt = 0x5ba4d0002ULL;      // windows of order="block" over shards
constexpr uint64_t kRelabelSalt = 0x5ba4d0003ULL;     // which rank gets which bin of shards
constexpr uint64_t kRankSalt = 0x5ba4d0004ULL;        // a rank's order within its own shards
}  // namespace

namespace {
template <typename E, size_t N>
E parse_option(const char* what, const char* const (&names)[N], const std::string& s) {
  std::string spelled;
  for (size_t i = 0; i < N; ++i) {
    if (s == names[i]) return static_cast<E>(i);
    spelled += (i ? (i + 1 == N ? " or '" : ", '") : "'") + std::string(names[i]) + "'";
  }
  throw std::invalid_argument(std::string(what) + " must be " + spelled + ", got '" + s + "'");
}
}  // namespace

Order parse_order(const std::string& s) { return parse_option<Order>("order", kOrderNames, s); }
Even parse_even(const std::string& s) { return parse_option<Even>("even", kEvenNames, s); }
Partition parse_partition(const std::string& s) { return parse_option<Partition>("partition", kPartitionNames, s); }

void SamplerConfig::validate() const {
  if (num_samples <= 0) bad("dataset length", "must be positive", num_samples);
  if (batch_size <= 0) bad("batch_size", "must be positive", batch_size);
  if (world_size <= 0) bad("world_size", "must be positive", world_size);
  if (rank < 0 || rank >= world_size)
    throw std::invalid_argument("rank must be in [0, world_size=" + std::to_string(world_size) +
                                "), got " + std::to_string(rank));
  if (block_size <= 0) bad("block_size", "must be positive", block_size);
  if (batch_size > kMaxGlobalBatch / world_size)
    bad("batch_size * world_size", "is too large", batch_size);
  if (window_shards <= 0) bad("window_shards", "must be positive", window_shards);
  int64_t total = 0, nonempty = 0;
  for (int64_t rows : shard_rows) {
    if (rows < 0) bad("shard_rows", "must be non-negative", rows);
    total += rows;
    nonempty += rows > 0;
  }
  if (!shard_rows.empty() && total != num_samples)
    throw std::invalid_argument("shard_rows must add up to the dataset length " +
                                std::to_string(num_samples) + ", got " + std::to_string(total));
  if (partition == Partition::Shards) {
    if (shard_rows.empty())
      throw std::invalid_argument(
          "partition='shards' needs a source with shard boundaries; this one has none");
    if (nonempty < world_size)
      throw std::invalid_argument("partition='shards' needs at least world_size=" +
                                  std::to_string(world_size) + " non-empty shards, got " +
                                  std::to_string(nonempty));
  }
}

// ---------------------------------------------------------------- Ordering

Ordering::Ordering(const SamplerConfig& cfg, int64_t epoch)
    : n_(cfg.num_samples), shuffle_(cfg.shuffle), order_(cfg.order), seed_(cfg.seed),
      epoch_(static_cast<uint64_t>(epoch)) {
  cfg.validate();  // before anything divides by the block size or the sample count
  const uint64_t e = mix64(epoch_);
  if (cfg.partition == Partition::Shards) {
    // Whole shards per rank: the epoch's shard order (ids when not shuffled), longest-first
    // bins, bins dealt to ranks at random; then an order within this rank's own shards.
    const std::vector<Segment> all = shard_segments(cfg.shard_rows);
    std::vector<int64_t> relabel(cfg.world_size);
    if (shuffle_) {
      const Permutation r(cfg.world_size, seed_, e ^ kRelabelSalt);
      for (int64_t b = 0; b < cfg.world_size; ++b) relabel[b] = static_cast<int64_t>(r(b));
    } else {
      for (int64_t b = 0; b < cfg.world_size; ++b) relabel[b] = b;
    }
    ShardAssignment a =
        assign_shards(shuffle_ ? permuted(all, seed_, e ^ kShardOrderSalt) : all, cfg.world_size, relabel);
    rank_rows_ = std::move(a.rows);
    const auto mode = !shuffle_ ? SegmentOrder::Mode::Identity
                      : order_ == Order::Random ? SegmentOrder::Mode::Random
                                                : SegmentOrder::Mode::Windows;
    const uint64_t key = mix64(e ^ kRankSalt ^ mix64(static_cast<uint64_t>(cfg.rank) + 1));
    segments_ = SegmentOrder(std::move(a.segments[cfg.rank]), mode, seed_, key, cfg.window_shards,
                             cfg.block_size);
    by_segments_ = true;
    n_ = segments_.size();
    return;
  }
  if (!shuffle_) return;
  if (order_ == Order::Block && !cfg.shard_rows.empty()) {
    // Shards in the epoch's order, samples shuffled within windows of a few consecutive shards.
    segments_ = SegmentOrder(permuted(shard_segments(cfg.shard_rows), seed_, e ^ kShardOrderSalt),
                             SegmentOrder::Mode::Windows, seed_, e ^ kWindowSalt,
                             cfg.window_shards, cfg.block_size);
    by_segments_ = true;
    return;
  }
  if (order_ == Order::Random) {
    perm_ = Permutation(n_, seed_, mix64(epoch_));
    return;
  }
  block_size_ = std::min<int64_t>(cfg.block_size, n_);
  num_blocks_ = (n_ + block_size_ - 1) / block_size_;
  last_block_size_ = n_ - (num_blocks_ - 1) * block_size_;
  perm_ = Permutation(num_blocks_, seed_, mix64(epoch_) ^ 0xb10cULL);
  // Where the (possibly shorter) last block lands in the shuffled block order.
  short_slot_ = static_cast<int64_t>(perm_.inverse(num_blocks_ - 1));
}

Ordering::BlockSlot Ordering::block_slot(int64_t i) const {
  const int64_t short_begin = short_slot_ * block_size_;
  int64_t slot, offset;
  if (i < short_begin) {
    slot = i / block_size_;
    offset = i % block_size_;
  } else if (i < short_begin + last_block_size_) {
    slot = short_slot_;
    offset = i - short_begin;
  } else {
    const int64_t t = i - short_begin - last_block_size_;
    slot = short_slot_ + 1 + t / block_size_;
    offset = t % block_size_;
  }
  return {static_cast<int64_t>(perm_(static_cast<uint64_t>(slot))), offset};
}

Permutation Ordering::inner(int64_t block) const {
  const int64_t size = block == num_blocks_ - 1 ? last_block_size_ : block_size_;
  return Permutation(size, seed_, mix64(epoch_ ^ mix64(static_cast<uint64_t>(block) + 1)));
}

int64_t Ordering::operator()(int64_t position) const {
  if (by_segments_) return segments_(position);
  if (!shuffle_) return position;
  if (order_ == Order::Random) return static_cast<int64_t>(perm_(static_cast<uint64_t>(position)));
  const BlockSlot bs = block_slot(position);
  return bs.block * block_size_ + static_cast<int64_t>(inner(bs.block)(bs.offset));
}

void Ordering::fill_strided(int64_t first, int64_t step, int64_t count, int64_t* out) const {
  if (step == 1) return fill(first, count, out);
  if (!by_segments_ && shuffle_ && order_ == Order::Random) {
    perm_.fill_strided(static_cast<uint64_t>(first), static_cast<uint64_t>(step), count, out);
  } else if (!by_segments_ && !shuffle_) {
    for (int64_t i = 0; i < count; ++i) out[i] = first + i * step;
  } else {
    for (int64_t i = 0; i < count; ++i) out[i] = (*this)(first + i * step);
  }
}

void Ordering::fill(int64_t first, int64_t count, int64_t* out) const {
  if (by_segments_) {
    segments_.fill(first, count, out);
  } else if (!shuffle_) {
    for (int64_t i = 0; i < count; ++i) out[i] = first + i;
  } else if (order_ == Order::Random) {
    perm_.fill(static_cast<uint64_t>(first), count, out);
  } else {
    // Consecutive positions mostly share a block: build each block's permutation once.
    int64_t cached_block = -1;
    Permutation in;
    for (int64_t i = 0; i < count; ++i) {
      const BlockSlot bs = block_slot(first + i);
      if (bs.block != cached_block) {
        in = inner(bs.block);
        cached_block = bs.block;
      }
      out[i] = bs.block * block_size_ + static_cast<int64_t>(in(bs.offset));
    }
  }
}

// ---------------------------------------------------------------- EpochPlan

EpochPlan::EpochPlan(const SamplerConfig& cfg, int64_t epoch, int64_t start_position)
    : cfg_(cfg), epoch_(epoch), start_(start_position), ordering_(cfg, epoch) {
  cfg_.validate();
  if (epoch < 0) bad("epoch", "must be non-negative", epoch);
  if (start_position < 0) bad("start position", "must be non-negative", start_position);
  const int64_t n = cfg.num_samples, w = cfg.world_size;
  int64_t rounded;
  if (cfg.partition == Partition::Shards) {
    // Each rank's own sequence is L long, so the global one (W*L) needs no rounding.
    const std::vector<int64_t>& rows = ordering_.rank_rows();
    local_length_ = cfg.even == Even::Drop ? *std::min_element(rows.begin(), rows.end())
                                           : *std::max_element(rows.begin(), rows.end());
    if (start_ % w != 0)
      throw std::invalid_argument(
          "with partition='shards' a resume position must be a multiple of world_size=" +
          std::to_string(w) + " (was the state saved at another world size?), got " +
          std::to_string(start_));
    rounded = std::max<int64_t>(w * local_length_ - start_, 0);
  } else {
    // The rest of the epoch is made a multiple of the world size, so every rank gets equal steps.
    const int64_t remaining = std::max<int64_t>(n - start_, 0);
    rounded = cfg.even == Even::Drop ? remaining / w * w : (remaining + w - 1) / w * w;
  }
  end_ = start_ + rounded;
  global_batch_ = cfg.batch_size * w;
  full_steps_ = rounded / global_batch_;
  const int64_t tail = rounded - full_steps_ * global_batch_;  // a multiple of w
  tail_share_ = tail / w;
  num_batches_ = full_steps_ + ((tail_share_ > 0 && !cfg.drop_last) ? 1 : 0);
}

int64_t EpochPlan::position_after(int64_t batches_done) const {
  if (batches_done >= num_batches_) return end_;
  return start_ + batches_done * global_batch_;
}

BatchSpan EpochPlan::batch(int64_t step) const {
  if (step < 0 || step >= num_batches_)
    throw std::out_of_range("batch " + std::to_string(step) + " out of range [0, " +
                            std::to_string(num_batches_) + ")");
  if (step < full_steps_)
    return {start_ + step * global_batch_ + cfg_.rank * cfg_.batch_size, cfg_.batch_size};
  return {start_ + full_steps_ * global_batch_ + cfg_.rank * tail_share_, tail_share_};
}

void EpochPlan::fill_ids(const BatchSpan& span, int64_t* ids, bool* valid) const {
  const int64_t n = ordering_.size();
  int64_t first = span.first;
  if (cfg_.partition == Partition::Shards && span.count > 0) {
    // The span is one rank's slice of a step: contiguous in that rank's own sequence.
    const int64_t q = span.first - start_, b = cfg_.batch_size;
    const int64_t local = q < full_steps_ * global_batch_
                              ? q / global_batch_ * b + q % global_batch_ % b
                              : full_steps_ * b + (q - full_steps_ * global_batch_) % tail_share_;
    first = start_ / cfg_.world_size + local;
  }
  // Padding positions p >= n wrap around to p mod n; fill in runs that do not cross a wrap.
  int64_t done = 0;
  while (done < span.count) {
    const int64_t pos = first + done;
    const int64_t wrapped = pos % n;
    const int64_t run = std::min(span.count - done, n - wrapped);
    ordering_.fill(wrapped, run, ids + done);
    if (valid) std::fill(valid + done, valid + done + run, pos < n);
    done += run;
  }
}

}  // namespace fastload
