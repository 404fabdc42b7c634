// Orders over shards: the shard-local shuffle of order="block" on a sharded source, and the
// assignment of whole shards to ranks (partition="shards"). O(shards) memory, never O(samples).
#pragma once
#include <cstdint>
#include <vector>

#include "core/permutation.h"

namespace fastload {

// One shard: the sample ids [begin, begin + rows).
struct Segment {
  int64_t begin = 0;
  int64_t rows = 0;
};

// The non-empty shards of a source, in id order (shard_rows[i] samples each, consecutive ids).
std::vector<Segment> shard_segments(const std::vector<int64_t>& shard_rows);

// The epoch's shard order: segments[perm(j)] for j = 0, 1, ...; perm is keyed by (seed, key).
std::vector<Segment> permuted(const std::vector<Segment>& segments, uint64_t seed, uint64_t key);

// An order of the positions [0, n) of a sequence of segments laid end to end (n = their rows):
//   Identity: position t is the t-th sample of the concatenation.
//   Random:   position t is sample c(P(t)), P a keyed permutation of [0, n), c the concatenation.
//   Windows:  consecutive segments are grouped into windows, each closed once it holds at least
//             window_shards segments and window_rows rows (the last one takes what is left);
//             position t in window w (starting at offset o_w, size n_w) is c(o_w + P_w(t - o_w)),
//             P_w a permutation of [0, n_w) keyed by (seed, mix64(key ^ mix64(w + 1))).
// So a window's positions read only its own segments, and the windows follow the segments' order.
class SegmentOrder {
 public:
  enum class Mode { Identity, Random, Windows };

  SegmentOrder() = default;
  SegmentOrder(std::vector<Segment> segments, Mode mode, uint64_t seed, uint64_t key,
               int64_t window_shards = 1, int64_t window_rows = 1);

  int64_t size() const { return starts_.empty() ? 0 : starts_.back(); }
  int64_t operator()(int64_t position) const;
  void fill(int64_t first, int64_t count, int64_t* out) const;  // positions in [0, size())
  int64_t num_windows() const { return static_cast<int64_t>(window_first_.size()) - 1; }

 private:
  int64_t sample_at(int64_t offset, int64_t lo_segment, int64_t hi_segment) const;
  int64_t window_of(int64_t position) const;
  Permutation window_permutation(int64_t window) const;

  std::vector<Segment> segments_;
  std::vector<int64_t> starts_;        // starts_[i]: offset of segment i; back() = size()
  std::vector<int64_t> window_first_;  // first segment of each window; back() = segment count
  Mode mode_ = Mode::Identity;
  uint64_t seed_ = 0, key_ = 0;
  Permutation perm_;  // Random
};

// The most segments one Windows-mode window can hold, whatever order the shards come in (each
// epoch permutes them) and whichever of them a rank owns: a window closes at the first segment
// that brings it to window_shards segments and window_rows rows, so the worst case is a run of the
// smallest shards. Empty shards are no segments. What a cache must hold to keep a window decoded.
int64_t max_window_shards(const std::vector<int64_t>& shard_rows, int64_t window_shards, int64_t window_rows);

// Whole shards per rank: the shards are taken in the given order, stably sorted by rows
// (largest first), and each goes to the bin with the fewest rows so far (lowest bin on ties):
// greedy longest-first. Bin b is rank relabel[b]. Each rank's segments keep the given order.
struct ShardAssignment {
  std::vector<std::vector<Segment>> segments;  // per rank
  std::vector<int64_t> rows;                   // per rank
};
ShardAssignment assign_shards(const std::vector<Segment>& ordered, int64_t world_size,
                              const std::vector<int64_t>& relabel);

}  // namespace fastload
