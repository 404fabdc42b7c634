// The per-step quotas of a weighted mixture: how many of each global step's samples come from
// each source, exact in every step and computed in O(log) for any step, with no stored state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastload {

// sum_{i < n} floor((a*i + b) / m) for m > 0, in 128 bits (O(log m) steps, Euclid-like).
// n < 2^62 and a, b, m < 2^33 keep every intermediate inside 128 bits.
unsigned __int128 floor_sum(uint64_t n, uint64_t m, uint64_t a, uint64_t b);

// The schedule. Global batch G; source j has quota Q_j = G*w_j = base_j + f_j (f_j in [0, 1)),
// and R = G - sum(base_j) = sum(f_j) samples of each step are "extras". In fixed point M = 2^32
// source j owns the interval [F_j, F_j + a_j) of [0, R*M), F_j = sum_{i<j} a_i, a_j ~ f_j*M (the
// caller rounds, see fastload/_mix_quota.py). Step s draws u_s = (s*ALPHA + phase) mod M, a
// golden-ratio rotation (low discrepancy), and source j gets one extra sample iff u_s + k*M lies in its
// interval for some integer k. The intervals tile [0, R*M) and none is longer than M, so exactly
// R sources get an extra in every step: step s holds d_j(s) = base_j + e_j(s) samples of source j
// (floor(Q_j) or floor(Q_j) + 1, summing to G). e_j(s) = 1 iff (u_s - F_j) mod M < a_j, so the
// extras source j got before step S, E_j(S), is a difference of two floor sums (see extras_before).
class MixSchedule {
 public:
  static constexpr uint64_t kScale = uint64_t{1} << 32;      // M
  static constexpr uint64_t kRotation = 2654435769ULL;        // ALPHA: odd, ~ M*(sqrt(5)-1)/2
  static constexpr int64_t kMaxSteps = int64_t{1} << 62;      // steps the floor sums can count

  MixSchedule() = default;
  // Throws std::invalid_argument unless base_j >= 0, a_j <= M, sum(a_j) = R*M with
  // R = G - sum(base_j) >= 0, and phase < M.
  MixSchedule(int64_t global_batch, std::vector<int64_t> base, std::vector<uint64_t> shares, uint64_t phase);

  int num_sources() const { return static_cast<int>(base_.size()); }
  int64_t global_batch() const { return global_batch_; }
  int64_t base(int j) const { return base_[static_cast<size_t>(j)]; }
  uint64_t share(int j) const { return share_[static_cast<size_t>(j)]; }
  uint64_t phase() const { return phase_; }

  // e_j(step): 1 if source j gets one of the step's extra samples. O(1).
  int extra(int j, int64_t step) const {
    const uint64_t v = (static_cast<uint64_t>(step) * kRotation + offset_[static_cast<size_t>(j)]) & (kScale - 1);
    return v < share_[static_cast<size_t>(j)] ? 1 : 0;
  }
  int64_t count(int j, int64_t step) const { return base_[static_cast<size_t>(j)] + extra(j, step); }
  // d_j(step) for every source (out has num_sources() entries). O(sources).
  void counts(int64_t step, int64_t* out) const;
  // E_j(steps): extras of source j in steps [0, steps). O(log M).
  int64_t extras_before(int j, int64_t steps) const;
  // Samples of source j in steps [0, steps): steps*base_j + E_j(steps).
  int64_t taken(int j, int64_t steps) const;

 private:
  int64_t global_batch_ = 0;
  std::vector<int64_t> base_;
  std::vector<uint64_t> share_;   // a_j
  std::vector<uint64_t> offset_;  // (phase - F_j) mod M: e_j(s) = ((s*ALPHA + offset_j) mod M) < a_j
  uint64_t phase_ = 0;
};

// The schedule's phase (BETA) for a loader seed: a pure function of the seed.
uint64_t mix_phase(uint64_t seed);

}  // namespace fastload
