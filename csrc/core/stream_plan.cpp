// Step-based sampling; see stream_plan.h.
#include "core/stream_plan.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

namespace fastload {

namespace {
constexpr uint64_t kSourceSeedSalt = 0x57e4a35000000000ULL;

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

// to[i] = from[i] + offset: the ids in the mixture from a source's own (vectorised: no aliasing).
void add_offset(const int64_t* __restrict from, int64_t* __restrict to, int64_t count, int64_t offset) {
  for (int64_t i = 0; i < count; ++i) to[i] = from[i] + offset;
}

}  // namespace

uint64_t stream_source_seed(uint64_t seed, int source, int num_sources) {
  if (num_sources == 1) return seed;
  return mix64(seed ^ mix64(kSourceSeedSalt + static_cast<uint64_t>(source)));
}

void StreamConfig::validate() const {
  const size_t n = sources.size();
  if (n == 0) bad("a stream needs at least one source");
  if (static_cast<size_t>(schedule.num_sources()) != n || base_positions.size() != n)
    bad("a stream needs one schedule quota and one base position per source");
  if (batch_size <= 0) bad("batch_size must be positive, got " + std::to_string(batch_size));
  if (replicas <= 0) bad("world_size must be positive, got " + std::to_string(replicas));
  if (rank < 0 || rank >= replicas)
    bad("rank must be in [0, world_size=" + std::to_string(replicas) + "), got " + std::to_string(rank));
  if (batch_size > kMaxGlobalBatch / replicas || batch_size * replicas != schedule.global_batch())
    bad("batch_size * world_size must be the schedule's global batch " + std::to_string(schedule.global_batch()) +
        ", got batch_size=" + std::to_string(batch_size) + " and world_size=" + std::to_string(replicas));
  if (origin < 0 || origin >= kMaxStreamPosition) bad("the schedule's origin step is out of range");
  for (size_t j = 0; j < n; ++j) {
    const StreamSource& s = sources[j];
    const std::string which = "stream source " + std::to_string(j);
    if (s.order.partition != Partition::Samples)
      bad("partition='shards' is not available for step-based sampling (steps= or a Mix): " + which);
    if (s.order.world_size != 1 || s.order.rank != 0) bad(which + ": its order is of the whole source");
    s.order.validate();
    if (s.offset < 0 || s.offset > kMaxStreamPosition - s.order.num_samples) bad(which + ": id offset out of range");
    if (base_positions[j] < 0 || base_positions[j] >= kMaxStreamPosition)
      bad(which + ": base position out of range, got " + std::to_string(base_positions[j]));
  }
}

StreamPlan::StreamPlan(std::shared_ptr<const StreamConfig> config, int64_t first_step, int64_t end_step, int64_t epoch)
    : config_(std::move(config)), first_(first_step), end_(end_step), epoch_(epoch) {
  if (!config_) bad("a stream plan needs a configuration");
  config_->validate();
  if (first_ < config_->origin)
    bad("step " + std::to_string(first_) + " is before the schedule's origin " + std::to_string(config_->origin));
  if (end_ < first_) bad("the stream's end step " + std::to_string(end_) + " is before its first " + std::to_string(first_));
  if (end_ >= kMaxStreamPosition) bad("step " + std::to_string(end_) + " is past 2^62");
  const __int128 steps = end_ - config_->origin;
  for (int j = 0; j < num_sources(); ++j) {
    const __int128 last = config_->base_positions[static_cast<size_t>(j)] +
                          steps * (config_->schedule.base(j) + 1);
    if (last >= kMaxStreamPosition)
      bad("source " + std::to_string(j) + "'s stream position would pass 2^62 by step " + std::to_string(end_));
  }
  extras_cache_.resize(kExtrasCache);
  const size_t n = config_->sources.size();
  orderings_.assign(n, std::vector<CachedOrdering>(kOrderingsPerSource));
  orderings_next_.assign(n, 0);
  blocks_.assign(n, std::vector<std::shared_ptr<const IdBlock>>(kBlocksPerSource));
  blocks_next_.assign(n, 0);
  block_ids_.assign(n, 0);
  if (config_->replicas == 1)  // a rank of several reads every R-th position: a block would be mostly waste
    for (int j = 0; j < num_sources(); ++j) {
      const int64_t per_step = config_->schedule.base(j) + 1;
      block_ids_[static_cast<size_t>(j)] =
          std::clamp<int64_t>((kStepsPerBlock * per_step + 63) / 64 * 64, kMinBlock, kMaxBlock);
    }
}

int64_t StreamPlan::rows(int64_t batch) const {
  if (batch < 0 || batch >= num_batches())
    throw std::out_of_range("batch " + std::to_string(batch) + " out of range [0, " + std::to_string(num_batches()) +
                            ")");
  return config_->batch_size;
}

int64_t StreamPlan::position_after(int64_t batches_done) const {
  return first_ + std::clamp<int64_t>(batches_done, 0, num_batches());
}

void StreamPlan::rows_of(int64_t start, int64_t count, int64_t* lo, int64_t* hi) const {
  // Row k holds global position k*R + r: the first row at or after position x is ceil((x-r)/R).
  const int64_t R = config_->replicas, r = config_->rank;
  if (R == 1) {
    *lo = start;
    *hi = start + count;
    return;
  }
  auto first_row_at = [&](int64_t x) { return x <= r ? 0 : (x - r + R - 1) / R; };
  *lo = first_row_at(start);
  *hi = first_row_at(start + count);
}

bool StreamPlan::cached_extras_locked(int64_t local, int64_t* out) const {
  const MixSchedule& s = config_->schedule;
  const int n = num_sources();
  const Extras* best = nullptr;
  for (const Extras& e : extras_cache_)
    if (e.step >= 0 && e.step <= local && local - e.step <= kMaxAdvance && (!best || e.step > best->step)) best = &e;
  if (!best) return false;
  std::copy(best->sum.begin(), best->sum.begin() + n, out);
  if (best->step == local) return true;
  for (int64_t step = best->step; step < local; ++step)
    for (int j = 0; j < n; ++j) out[j] += s.extra(j, step);
  store_extras_locked(local, out);
  return true;
}

void StreamPlan::store_extras_locked(int64_t local, const int64_t* sums) const {
  Extras& slot = extras_cache_[extras_next_];
  extras_next_ = (extras_next_ + 1) % kExtrasCache;
  slot.step = local;
  slot.sum.assign(sums, sums + num_sources());
}

void StreamPlan::extras_at(int64_t local, int64_t* out) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_extras_locked(local, out)) return;
  }
  // Far from every cached step: two floor sums per source, outside the lock.
  for (int j = 0; j < num_sources(); ++j) out[j] = config_->schedule.extras_before(j, local);
  std::lock_guard<std::mutex> lock(mutex_);
  store_extras_locked(local, out);
}

std::shared_ptr<const Ordering> StreamPlan::cached_ordering_locked(int source, int64_t epoch) const {
  for (const CachedOrdering& c : orderings_[static_cast<size_t>(source)])
    if (c.epoch == epoch) return c.ordering;
  return nullptr;
}

std::shared_ptr<const Ordering> StreamPlan::ordering(int source, int64_t epoch) const {
  const size_t j = static_cast<size_t>(source);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto found = cached_ordering_locked(source, epoch)) return found;
  }
  auto built = std::make_shared<const Ordering>(config_->sources[j].order, epoch);  // O(shards): unlocked
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto found = cached_ordering_locked(source, epoch)) return found;  // another thread was first
  CachedOrdering& slot = orderings_[j][orderings_next_[j]];
  orderings_next_[j] = (orderings_next_[j] + 1) % kOrderingsPerSource;
  slot.epoch = epoch;
  slot.ordering = built;
  return built;
}

std::shared_ptr<const StreamPlan::IdBlock> StreamPlan::id_block(int source, int64_t epoch, int64_t within,
                                                                const Ordering& order) const {
  const size_t j = static_cast<size_t>(source);
  const int64_t len = block_ids_[j], first = within / len * len;
  auto find_locked = [&]() -> std::shared_ptr<const IdBlock> {
    for (const auto& b : blocks_[j])
      if (b && b->epoch == epoch && b->first == first) return b;
    return nullptr;
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto found = find_locked()) return found;
  }
  auto built = std::make_shared<IdBlock>();  // one permutation pass, unlocked
  built->epoch = epoch;
  built->first = first;
  built->size = std::min(len, order.size() - first);
  built->ids.reset(new int64_t[static_cast<size_t>(built->size)]);
  order.fill(first, built->size, built->ids.get());
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto found = find_locked()) return found;  // another thread was first
  blocks_[j][blocks_next_[j]] = built;
  blocks_next_[j] = (blocks_next_[j] + 1) % kBlocksPerSource;
  return built;
}

void StreamPlan::positions(int64_t step, int64_t* out) const {
  if (step < config_->origin || step > end_)
    throw std::out_of_range("step " + std::to_string(step) + " out of the stream's range [" +
                            std::to_string(config_->origin) + ", " + std::to_string(end_) + "]");
  const int64_t local = step - config_->origin;
  extras_at(local, out);
  for (int j = 0; j < num_sources(); ++j)
    out[j] += config_->base_positions[static_cast<size_t>(j)] + local * config_->schedule.base(j);
}

void StreamPlan::step_counts(int64_t step, int64_t* out) const {
  if (step < config_->origin) throw std::out_of_range("step before the schedule's origin");
  config_->schedule.counts(step - config_->origin, out);
}

void StreamPlan::add_source_rows(int64_t batch, int64_t* counts) const {
  const int64_t step = first_ + batch;
  if (step < config_->origin) throw std::out_of_range("step before the schedule's origin");
  int64_t start = 0;
  for (int j = 0; j < num_sources(); ++j) {
    const int64_t d = config_->schedule.count(j, step - config_->origin);
    int64_t lo, hi;
    rows_of(start, d, &lo, &hi);
    counts[j] += hi - lo;
    start += d;
  }
}

// A thread's last schedule step with every source's extras up to it, and for each source the
// epoch its last run fell in (the epoch's first stream position and its ordering, held here so
// that a batch in the same epoch takes no lock and touches no shared reference count).
class StreamPlan::Cursor final : public PlanCursor {
 public:
  struct Epoch {
    int64_t number = 0;
    int64_t first = 0;  // stream position of the epoch's first sample
    std::shared_ptr<const Ordering> ordering;  // null: none yet
    std::shared_ptr<const IdBlock> block;      // the ids it last copied (world size 1)
  };
  Cursor(const StreamPlan* plan, size_t sources) : PlanCursor(plan), extras(sources), epochs(sources) {}
  int64_t local = -1;           // the schedule step `extras` is at (-1: none yet)
  std::vector<int64_t> extras;  // E_j(local)
  std::vector<Epoch> epochs;
};

std::unique_ptr<PlanCursor> StreamPlan::cursor() const {
  return std::make_unique<Cursor>(this, config_->sources.size());
}

void StreamPlan::move_extras(Cursor& cur, int64_t local) const {
  if (cur.local == local) return;
  const int n = num_sources();
  const MixSchedule& s = config_->schedule;
  if (cur.local >= 0 && local >= cur.local - kMaxAdvance && local <= cur.local + kMaxAdvance) {
    // Threads take nearby steps (a few apart): step from the last one, either way.
    for (int64_t step = cur.local; step < local; ++step)
      for (int j = 0; j < n; ++j) cur.extras[static_cast<size_t>(j)] += s.extra(j, step);
    for (int64_t step = local; step < cur.local; ++step)
      for (int j = 0; j < n; ++j) cur.extras[static_cast<size_t>(j)] -= s.extra(j, step);
  } else {
    extras_at(local, cur.extras.data());
  }
  cur.local = local;
}

void StreamPlan::fill_source(Cursor& cur, int j, int64_t first, int64_t lo, int64_t hi, const BatchRows& out) const {
  const StreamConfig& c = *config_;
  const StreamSource& src = c.sources[static_cast<size_t>(j)];
  const int64_t N = src.order.num_samples, R = c.replicas;
  Cursor::Epoch& e = cur.epochs[static_cast<size_t>(j)];
  for (int64_t k = lo; k < hi;) {
    // Rows k, k+1, ... hold stream positions p, p+R, ...: fill the run that stays in one epoch.
    const int64_t p = first + (k - lo) * R;
    if (!e.ordering || p < e.first || p - e.first >= N) {
      e.number = p / N;
      e.ordering = ordering(j, e.number);
      e.first = e.number * N;
    }
    const int64_t within = p - e.first;
    const int64_t run = std::min(hi - k, R == 1 ? N - within : (N - within + R - 1) / R);
    // The source's own ids (into local_ids when asked), then the ids in the mixture.
    int64_t* ids = out.ids ? out.ids + k : nullptr;
    int64_t* own = out.local_ids ? out.local_ids + k : ids;
    if (R == 1) {
      for (int64_t done = 0; done < run;) {  // copied from the source's id blocks
        const int64_t at = within + done;
        const IdBlock* b = e.block.get();
        if (!b || b->epoch != e.number || at < b->first || at - b->first >= b->size) {
          e.block = id_block(j, e.number, at, *e.ordering);
          b = e.block.get();
        }
        const int64_t n = std::min(run - done, b->first + b->size - at);
        std::memcpy(own + done, b->ids.get() + (at - b->first), static_cast<size_t>(n) * sizeof(int64_t));
        done += n;
      }
    } else {
      e.ordering->fill_strided(within, R, run, own);  // this replica's every R-th position
    }
    if (!ids) {
    } else if (own != ids) {
      add_offset(own, ids, run, src.offset);
    } else if (src.offset != 0) {
      for (int64_t i = 0; i < run; ++i) ids[i] += src.offset;
    }
    if (out.sources) std::fill(out.sources + k, out.sources + k + run, static_cast<int64_t>(j));
    if (out.valid) std::fill(out.valid + k, out.valid + k + run, true);
    if (out.epochs) std::fill(out.epochs + k, out.epochs + k + run, e.number);
    k += run;
  }
}

int64_t StreamPlan::fill(int64_t batch, const BatchRows& out) const {
  rows(batch);  // range check
  if (out.cursor && out.cursor->owner() == this)
    return fill_with(batch, out, *static_cast<Cursor*>(out.cursor));
  Cursor fresh(this, config_->sources.size());
  return fill_with(batch, out, fresh);
}

int64_t StreamPlan::fill_with(int64_t batch, const BatchRows& out, Cursor& cur) const {
  const StreamConfig& c = *config_;
  const int n = num_sources();
  const int64_t local = first_ + batch - c.origin;
  const int64_t R = c.replicas, r = c.rank;
  move_extras(cur, local);
  int64_t at = 0;  // where source j's samples start in the step
  for (int j = 0; j < n; ++j) {
    const int64_t count = c.schedule.count(j, local);
    int64_t lo, hi;
    rows_of(at, count, &lo, &hi);
    if (out.source_rows) out.source_rows[j] = lo;
    if (lo < hi) {
      // Source j's stream position at the step, then that of this replica's row lo.
      const int64_t pos = c.base_positions[static_cast<size_t>(j)] + local * c.schedule.base(j) +
                          cur.extras[static_cast<size_t>(j)];
      fill_source(cur, j, pos + lo * R + r - at, lo, hi, out);
    }
    at += count;
  }
  if (out.source_rows) out.source_rows[n] = c.batch_size;
  return c.batch_size;
}

}  // namespace fastload
