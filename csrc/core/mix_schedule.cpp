// The mixture schedule; see mix_schedule.h.
#include "core/mix_schedule.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "core/permutation.h"

namespace fastload {

namespace {
using u128 = unsigned __int128;
constexpr uint64_t kPhaseSalt = 0x6d69785f70686173ULL;  // keys the phase apart from other seed uses
}  // namespace

unsigned __int128 floor_sum(uint64_t n_in, uint64_t m_in, uint64_t a_in, uint64_t b_in) {
  // The sum counts lattice points (i, k), 0 <= i < n, 1 <= k, k*m <= a*i + b. Whole multiples of
  // m in a and b are summed directly; what is left (a, b < m) is the same count seen from the
  // other axis: with y = a*n + b, it equals the sum over n' = floor(y/m) terms of
  // floor((m*i + (y mod m)) / a). Each round replaces (m, a) by (a, m mod a): Euclid's steps.
  u128 n = n_in, m = m_in, a = a_in, b = b_in, total = 0;
  for (;;) {
    if (a >= m) {
      total += (n * (n - (n > 0 ? 1 : 0)) / 2) * (a / m);
      a %= m;
    }
    if (b >= m) {
      total += n * (b / m);
      b %= m;
    }
    const u128 y = a * n + b;
    if (y < m) return total;  // every remaining term is 0
    n = y / m;
    b = y % m;
    std::swap(m, a);
  }
}

MixSchedule::MixSchedule(int64_t global_batch, std::vector<int64_t> base, std::vector<uint64_t> shares,
                         uint64_t phase)
    : global_batch_(global_batch), base_(std::move(base)), share_(std::move(shares)), phase_(phase) {
  if (global_batch_ <= 0)
    throw std::invalid_argument("a mixture's global batch must be positive, got " + std::to_string(global_batch_));
  if (base_.empty() || base_.size() != share_.size())
    throw std::invalid_argument("a mixture needs one base count and one share per source");
  if (phase_ >= kScale) throw std::invalid_argument("the mixture phase must be below 2^32");
  int64_t base_sum = 0;
  u128 share_sum = 0;
  for (size_t j = 0; j < base_.size(); ++j) {
    if (base_[j] < 0 || base_[j] > global_batch_)
      throw std::invalid_argument("source " + std::to_string(j) + "'s base count must be in [0, " +
                                  std::to_string(global_batch_) + "], got " + std::to_string(base_[j]));
    if (share_[j] > kScale)
      throw std::invalid_argument("source " + std::to_string(j) + "'s extra share must be at most 2^32, got " +
                                  std::to_string(share_[j]));
    base_sum += base_[j];
    share_sum += share_[j];
  }
  const int64_t extras = global_batch_ - base_sum;
  if (extras < 0 || share_sum != static_cast<u128>(extras) * kScale)
    throw std::invalid_argument("the mixture's quotas do not add up to the global batch " +
                                std::to_string(global_batch_) + " (base counts sum to " + std::to_string(base_sum) +
                                ", shares to a non-matching multiple of 2^32)");
  uint64_t start = 0;  // F_j mod M
  for (size_t j = 0; j < base_.size(); ++j) {
    offset_.push_back((phase_ + kScale - start) & (kScale - 1));
    start = (start + share_[j]) & (kScale - 1);
  }
}

void MixSchedule::counts(int64_t step, int64_t* out) const {
  for (int j = 0; j < num_sources(); ++j) out[j] = count(j, step);
}

int64_t MixSchedule::extras_before(int j, int64_t steps) const {
  if (steps < 0 || steps > kMaxSteps)
    throw std::out_of_range("mixture step " + std::to_string(steps) + " out of range [0, 2^62]");
  const uint64_t a = share_[static_cast<size_t>(j)];
  if (a == 0 || steps == 0) return 0;
  if (a == kScale) return steps;
  // With x_s = s*ALPHA + offset_j and v_s = x_s mod M: [v_s >= a] = floor((x_s + M - a)/M) -
  // floor(x_s/M), so the steps without an extra are a difference of two floor sums.
  const uint64_t n = static_cast<uint64_t>(steps), off = offset_[static_cast<size_t>(j)];
  const u128 without = floor_sum(n, kScale, kRotation, off + kScale - a) - floor_sum(n, kScale, kRotation, off);
  return steps - static_cast<int64_t>(without);
}

int64_t MixSchedule::taken(int j, int64_t steps) const {
  return steps * base_[static_cast<size_t>(j)] + extras_before(j, steps);
}

uint64_t mix_phase(uint64_t seed) { return mix64(seed ^ kPhaseSalt) >> 32; }

}  // namespace fastload
