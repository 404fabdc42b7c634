// Shard-local orders and the assignment of whole shards to ranks; see shard_order.h.
#include "core/shard_order.h"

#include <algorithm>
#include <functional>
#include <numeric>
#include <queue>
#include <utility>

namespace fastload {

std::vector<Segment> shard_segments(const std::vector<int64_t>& shard_rows) {
  std::vector<Segment> out;
  int64_t begin = 0;
  for (int64_t rows : shard_rows) {
    if (rows > 0) out.push_back({begin, rows});
    begin += rows;
  }
  return out;
}

std::vector<Segment> permuted(const std::vector<Segment>& segments, uint64_t seed, uint64_t key) {
  const Permutation p(segments.size(), seed, key);
  std::vector<Segment> out(segments.size());
  for (size_t j = 0; j < segments.size(); ++j) out[j] = segments[p(j)];
  return out;
}

int64_t max_window_shards(const std::vector<int64_t>& shard_rows, int64_t window_shards, int64_t window_rows) {
  std::vector<int64_t> rows;
  for (int64_t r : shard_rows)
    if (r > 0) rows.push_back(r);
  std::sort(rows.begin(), rows.end());
  // The fewest of the smallest shards that hold window_rows rows (all of them if none do).
  int64_t count = 0, held = 0;
  while (count < static_cast<int64_t>(rows.size()) && held < window_rows) held += rows[static_cast<size_t>(count++)];
  return std::min<int64_t>(static_cast<int64_t>(rows.size()), std::max(window_shards, count));
}

SegmentOrder::SegmentOrder(std::vector<Segment> segments, Mode mode, uint64_t seed, uint64_t key,
                           int64_t window_shards, int64_t window_rows)
    : segments_(std::move(segments)), mode_(mode), seed_(seed), key_(key) {
  starts_.reserve(segments_.size() + 1);
  int64_t offset = 0;
  for (const Segment& s : segments_) {
    starts_.push_back(offset);
    offset += s.rows;
  }
  starts_.push_back(offset);
  if (mode_ == Mode::Random) perm_ = Permutation(static_cast<uint64_t>(offset), seed_, key_);
  window_first_.push_back(0);
  if (mode_ != Mode::Windows) {
    window_first_.push_back(static_cast<int64_t>(segments_.size()));
    return;
  }
  int64_t count = 0, rows = 0;
  for (size_t i = 0; i < segments_.size(); ++i) {
    ++count;
    rows += segments_[i].rows;
    if (count >= window_shards && rows >= window_rows && i + 1 < segments_.size()) {
      window_first_.push_back(static_cast<int64_t>(i + 1));
      count = rows = 0;
    }
  }
  window_first_.push_back(static_cast<int64_t>(segments_.size()));
}

// The sample at a concatenation offset, searching segments [lo, hi) (the offset lies in them).
int64_t SegmentOrder::sample_at(int64_t offset, int64_t lo, int64_t hi) const {
  const auto it = std::upper_bound(starts_.begin() + lo + 1, starts_.begin() + hi, offset);
  const int64_t i = (it - starts_.begin()) - 1;
  return segments_[i].begin + (offset - starts_[i]);
}

int64_t SegmentOrder::window_of(int64_t position) const {
  // The last window whose first offset is <= position.
  int64_t lo = 0, hi = num_windows();  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (starts_[window_first_[mid]] <= position) lo = mid; else hi = mid;
  }
  return lo;
}

Permutation SegmentOrder::window_permutation(int64_t w) const {
  const int64_t begin = starts_[window_first_[w]], end = starts_[window_first_[w + 1]];
  return Permutation(static_cast<uint64_t>(end - begin), seed_,
                     mix64(key_ ^ mix64(static_cast<uint64_t>(w) + 1)));
}

int64_t SegmentOrder::operator()(int64_t position) const {
  int64_t out;
  fill(position, 1, &out);
  return out;
}

void SegmentOrder::fill(int64_t first, int64_t count, int64_t* out) const {
  const int64_t all = static_cast<int64_t>(segments_.size());
  if (mode_ == Mode::Identity) {
    // Walk the segments alongside the positions.
    int64_t i = (std::upper_bound(starts_.begin() + 1, starts_.end() - 1, first) - starts_.begin()) - 1;
    for (int64_t k = 0; k < count; ++k) {
      const int64_t t = first + k;
      while (t >= starts_[i + 1]) ++i;
      out[k] = segments_[i].begin + (t - starts_[i]);
    }
  } else if (mode_ == Mode::Random) {
    perm_.fill(static_cast<uint64_t>(first), count, out);
    for (int64_t k = 0; k < count; ++k) out[k] = sample_at(out[k], 0, all);
  } else {
    // A batch lies in one or two windows: one permutation per run inside a window.
    int64_t done = 0;
    while (done < count) {
      const int64_t pos = first + done;
      const int64_t w = window_of(pos);
      const int64_t lo = window_first_[w], hi = window_first_[w + 1];
      const int64_t begin = starts_[lo];
      const int64_t run = std::min(count - done, starts_[hi] - pos);
      window_permutation(w).fill(static_cast<uint64_t>(pos - begin), run, out + done);
      for (int64_t k = done; k < done + run; ++k) out[k] = sample_at(begin + out[k], lo, hi);
      done += run;
    }
  }
}

ShardAssignment assign_shards(const std::vector<Segment>& ordered, int64_t world_size,
                              const std::vector<int64_t>& relabel) {
  const size_t n = ordered.size();
  std::vector<size_t> by_size(n);
  std::iota(by_size.begin(), by_size.end(), size_t{0});
  std::stable_sort(by_size.begin(), by_size.end(),
                   [&](size_t a, size_t b) { return ordered[a].rows > ordered[b].rows; });
  // Min-heap of (rows so far, bin): the lightest bin, the lowest on ties.
  using Load = std::pair<int64_t, int64_t>;
  std::priority_queue<Load, std::vector<Load>, std::greater<Load>> heap;
  for (int64_t b = 0; b < world_size; ++b) heap.push({0, b});
  std::vector<int64_t> owner(n);
  for (size_t j : by_size) {
    Load l = heap.top();
    heap.pop();
    owner[j] = relabel[l.second];
    l.first += ordered[j].rows;
    heap.push(l);
  }
  ShardAssignment a;
  a.segments.resize(world_size);
  a.rows.assign(world_size, 0);
  for (size_t j = 0; j < n; ++j) {
    a.segments[owner[j]].push_back(ordered[j]);
    a.rows[owner[j]] += ordered[j].rows;
  }
  return a;
}

}  // namespace fastload
