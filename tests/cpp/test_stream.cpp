// Tests of step-based sampling (no Python): the mixture schedule (core/mix_schedule.h) against a
// brute-force step-by-step simulation. Run under ThreadSanitizer and AddressSanitizer + UBSan by
// tests/cpp/run_sanitizers.sh (the harness is tests/cpp/harness.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/mix_schedule.h"
#include "harness.h"

using namespace fastload;

namespace {

using u128 = unsigned __int128;
constexpr uint64_t M = MixSchedule::kScale;

u128 brute_floor_sum(uint64_t n, uint64_t m, uint64_t a, uint64_t b) {
  u128 total = 0;
  for (uint64_t i = 0; i < n; ++i) total += (static_cast<u128>(a) * i + b) / m;
  return total;
}

// Random valid quotas: base counts, and shares a_j <= M adding up to R*M (R extras per step).
struct Quotas {
  int64_t g;
  std::vector<int64_t> base;
  std::vector<uint64_t> shares;
};

Quotas random_quotas(std::mt19937_64& rng, int sources, int64_t max_base) {
  for (;;) {
    Quotas q{0, {}, {}};
    const uint64_t extras = rng() % static_cast<uint64_t>(sources);  // R < sources: some shares are < M
    std::vector<uint64_t> x(static_cast<size_t>(sources));
    u128 sum = 0;
    for (uint64_t& v : x) {
      v = (rng() % 3 == 0) ? 0 : 1 + rng() % 1000000;  // some sources get no extras at all
      sum += v;
    }
    if (sum == 0) continue;
    u128 total = 0;
    for (uint64_t v : x) {
      q.shares.push_back(static_cast<uint64_t>(static_cast<u128>(extras) * M * v / sum));
      total += q.shares.back();
    }
    for (size_t j = 0; j < x.size() && total < static_cast<u128>(extras) * M; ++j) {
      const u128 add = std::min<u128>(static_cast<u128>(extras) * M - total, M - q.shares[j]);
      if (x[j] == 0) continue;
      q.shares[j] += static_cast<uint64_t>(add);
      total += add;
    }
    if (total != static_cast<u128>(extras) * M) continue;
    bool fits = true;
    for (uint64_t a : q.shares) fits &= a <= M;
    if (!fits) continue;
    int64_t g = static_cast<int64_t>(extras);
    for (int j = 0; j < sources; ++j) {
      q.base.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(max_base + 1)));
      g += q.base.back();
    }
    if (g == 0) continue;
    q.g = g;
    return q;
  }
}

// e_j(s) straight from the definition: some integer k with F_j <= u_s + k*M < F_j + a_j.
std::vector<int> brute_extras(const MixSchedule& s, int64_t step) {
  const uint64_t u = (static_cast<uint64_t>(step) * MixSchedule::kRotation + s.phase()) % M;
  std::vector<int> out;
  u128 start = 0;
  for (int j = 0; j < s.num_sources(); ++j) {
    const u128 lo = start, hi = start + s.share(j);
    int hit = 0;
    for (u128 x = u; x < hi; x += M)
      if (x >= lo) hit = 1;
    out.push_back(hit);
    start = hi;
  }
  return out;
}

}  // namespace

TEST_CASE(floor_sum_matches_brute_force) {
  std::mt19937_64 rng(7);
  for (int it = 0; it < 3000; ++it) {
    const uint64_t n = rng() % 300, m = 1 + rng() % ((it % 3 == 0) ? 7 : (uint64_t{1} << 33));
    const uint64_t a = rng() % (2 * m + 1), b = rng() % (2 * m + 1);
    CHECK_MSG(floor_sum(n, m, a, b) == brute_floor_sum(n, m, a, b), "n=" << n << " m=" << m << " a=" << a << " b=" << b);
  }
  // The schedule's own arguments, far along: compared with the sum split in two halves computed
  // by the identity sum_{i<2h} = sum_{i<h} + sum_{i<h} with b shifted by a*h.
  for (uint64_t n : {uint64_t{1} << 20, uint64_t{1} << 40, (uint64_t{1} << 62) - 3}) {
    const uint64_t h = n / 2, b = 12345;
    const u128 whole = floor_sum(2 * h, M, MixSchedule::kRotation, b);
    const u128 shifted_b = static_cast<u128>(MixSchedule::kRotation) * h + b;
    const u128 second = floor_sum(h, M, MixSchedule::kRotation, static_cast<uint64_t>(shifted_b % M)) +
                        static_cast<u128>(h) * (shifted_b / M);
    CHECK(whole == floor_sum(h, M, MixSchedule::kRotation, b) + second);
  }
}

TEST_CASE(mix_schedule_every_step_sums_to_the_global_batch_and_matches_the_definition) {
  std::mt19937_64 rng(11);
  for (int it = 0; it < 200; ++it) {
    const int sources = 1 + static_cast<int>(rng() % 6);
    const Quotas q = random_quotas(rng, sources, 60);
    const int64_t g = q.g;
    const MixSchedule s(g, q.base, q.shares, rng() % M);
    std::vector<int64_t> d(static_cast<size_t>(sources)), cumulative(static_cast<size_t>(sources), 0);
    const int64_t steps = 400;
    for (int64_t step = 0; step < steps; ++step) {
      s.counts(step, d.data());
      int64_t sum = 0;
      const std::vector<int> e = brute_extras(s, step);
      for (int j = 0; j < sources; ++j) {
        sum += d[static_cast<size_t>(j)];
        CHECK(d[static_cast<size_t>(j)] == q.base[static_cast<size_t>(j)] + e[static_cast<size_t>(j)]);
        CHECK(s.extras_before(j, step) == cumulative[static_cast<size_t>(j)]);
        cumulative[static_cast<size_t>(j)] += e[static_cast<size_t>(j)];
      }
      CHECK_MSG(sum == g, "step " << step << " sums to " << sum << ", not " << g);
    }
  }
}

TEST_CASE(mix_schedule_extras_before_far_steps_by_stepping_from_a_far_point) {
  // E_j(S + k) - E_j(S) for S up to 10^12 and beyond equals the extras counted step by step.
  std::mt19937_64 rng(5);
  for (int it = 0; it < 60; ++it) {
    const int sources = 2 + static_cast<int>(rng() % 4);
    const Quotas q = random_quotas(rng, sources, 30);
    const MixSchedule s(q.g, q.base, q.shares, rng() % M);
    const int64_t far = static_cast<int64_t>(rng() % (it % 2 ? uint64_t{1000000000000} : (uint64_t{1} << 61)));
    for (int j = 0; j < sources; ++j) {
      int64_t stepped = s.extras_before(j, far);
      for (int64_t k = 0; k < 300; ++k) {
        CHECK(s.extras_before(j, far + k) == stepped);
        stepped += s.extra(j, far + k);
      }
      // Long-run share: within a few samples of steps * a_j / M (exactly, in 128 bits).
      const u128 scaled = static_cast<u128>(far) * q.shares[static_cast<size_t>(j)];
      const u128 got = static_cast<u128>(s.extras_before(j, far)) * M;
      const u128 gap = got > scaled ? got - scaled : scaled - got;
      CHECK_MSG(gap < static_cast<u128>(64) * M, "E=" << s.extras_before(j, far) << " far=" << far);
    }
  }
}

TEST_CASE(mix_schedule_refuses_quotas_that_do_not_add_up) {
  CHECK_THROWS(MixSchedule(10, {3, 3}, {0, 0}, 0), std::invalid_argument, "do not add up");
  CHECK_THROWS(MixSchedule(10, {3, 6}, {M / 2, M / 4}, 0), std::invalid_argument, "do not add up");
  CHECK_THROWS(MixSchedule(10, {-1, 11}, {0, 0}, 0), std::invalid_argument, "base count");
  CHECK_THROWS(MixSchedule(10, {5, 4}, {M + 1, 0}, 0), std::invalid_argument, "extra share");
  CHECK_THROWS(MixSchedule(10, {5, 5}, {0, 0}, M), std::invalid_argument, "phase");
  const MixSchedule ok(10, {3, 6}, {M / 2, M / 2}, 0);
  CHECK_THROWS(ok.extras_before(0, -1), std::out_of_range, "out of range");
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_stream"); }
