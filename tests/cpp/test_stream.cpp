// Tests of step-based sampling (no Python): the mixture schedule (core/mix_schedule.h) against a
// brute-force step-by-step simulation. Run under ThreadSanitizer and AddressSanitizer + UBSan by
// tests/cpp/run_sanitizers.sh (the harness is tests/cpp/harness.h).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "core/array_source.h"
#include "core/engine.h"
#include "core/mix_source.h"
#include "core/mix_schedule.h"
#include "core/stream_plan.h"
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

// ================================================================ StreamPlan

namespace {

struct StreamCase {
  std::shared_ptr<const StreamConfig> config;
  std::vector<int64_t> lengths;
};

// A stream of `sources` shuffled sources of random lengths (some sharded, some block-ordered).
StreamCase random_stream(std::mt19937_64& rng, int sources, int64_t batch, int64_t replicas, int64_t rank,
                         int64_t origin = 0) {
  for (;;) {
    const Quotas q = random_quotas(rng, sources, 2 * batch * replicas / sources + 1);
    if (q.g % replicas != 0) continue;
    auto c = std::make_shared<StreamConfig>();
    StreamCase out;
    int64_t offset = 0;
    for (int j = 0; j < sources; ++j) {
      StreamSource src;
      src.order.num_samples = 1 + static_cast<int64_t>(rng() % 40);
      src.order.seed = stream_source_seed(99, j, sources);
      src.order.shuffle = rng() % 4 != 0;
      src.order.order = rng() % 3 == 0 ? Order::Block : Order::Random;
      src.order.block_size = 1 + static_cast<int64_t>(rng() % 8);
      if (rng() % 3 == 0) {  // shards
        int64_t left = src.order.num_samples;
        while (left > 0) {
          const int64_t rows = std::min<int64_t>(left, 1 + static_cast<int64_t>(rng() % 9));
          src.order.shard_rows.push_back(rows);
          left -= rows;
        }
      }
      src.offset = offset;
      offset += src.order.num_samples;
      out.lengths.push_back(src.order.num_samples);
      c->sources.push_back(src);
      c->base_positions.push_back(origin ? static_cast<int64_t>(rng() % 100) : 0);
    }
    c->schedule = MixSchedule(q.g, q.base, q.shares, rng() % M);
    c->origin = origin;
    c->batch_size = q.g / replicas;
    c->replicas = replicas;
    c->rank = rank % replicas;
    c->seed = 99;
    out.config = c;
    return out;
  }
}

// Step `step`'s rows of the config's replica, from the definition: walk the steps from the
// origin, lay the sources end to end, deal position k*R + r to row k.
void brute_batch(const StreamConfig& c, int64_t step, std::vector<int64_t>* ids, std::vector<int64_t>* sources) {
  const int n = static_cast<int>(c.sources.size());
  std::vector<int64_t> pos(c.base_positions);
  for (int64_t s = c.origin; s < step; ++s)
    for (int j = 0; j < n; ++j) pos[static_cast<size_t>(j)] += c.schedule.count(j, s - c.origin);
  std::vector<int64_t> glob_ids, glob_src;
  for (int j = 0; j < n; ++j) {
    const StreamSource& src = c.sources[static_cast<size_t>(j)];
    for (int64_t t = 0; t < c.schedule.count(j, step - c.origin); ++t) {
      const int64_t p = pos[static_cast<size_t>(j)] + t, N = src.order.num_samples;
      const Ordering o(src.order, p / N);
      glob_ids.push_back(src.offset + o(p % N));
      glob_src.push_back(j);
    }
  }
  ids->clear();
  sources->clear();
  for (int64_t k = 0; k < c.batch_size; ++k) {
    ids->push_back(glob_ids[static_cast<size_t>(k * c.replicas + c.rank)]);
    sources->push_back(glob_src[static_cast<size_t>(k * c.replicas + c.rank)]);
  }
}

}  // namespace

TEST_CASE(stream_plan_matches_the_brute_force_stream) {
  std::mt19937_64 rng(21);
  for (int it = 0; it < 120; ++it) {
    const int64_t replicas = 1 + static_cast<int64_t>(rng() % 3);
    const StreamCase sc = random_stream(rng, 1 + static_cast<int>(rng() % 4), 1 + static_cast<int64_t>(rng() % 12),
                                        replicas, static_cast<int64_t>(rng() % 3), it % 2 ? 7 : 0);
    const int64_t first = sc.config->origin + static_cast<int64_t>(rng() % 5);
    const StreamPlan plan(sc.config, first, first + 30, 3);
    CHECK(plan.num_batches() == 30 && plan.epoch() == 3 && plan.position_after(4) == first + 4);
    std::vector<int64_t> ids(static_cast<size_t>(sc.config->batch_size)), src(ids.size()), want_ids, want_src;
    std::vector<int64_t> counts(sc.config->sources.size(), 0), want_counts(counts.size(), 0);
    // Out of order on purpose: the position cache must not depend on the order of steps.
    std::vector<int64_t> order(30);
    for (int64_t k = 0; k < 30; ++k) order[static_cast<size_t>(k)] = (k * 7) % 30;
    for (int64_t k : order) {
      BatchRows rows;
      rows.ids = ids.data();
      rows.sources = src.data();
      plan.fill(k, rows);
      brute_batch(*sc.config, first + k, &want_ids, &want_src);
      CHECK_MSG(ids == want_ids && src == want_src, "iteration " << it << " batch " << k);
      plan.add_source_rows(k, counts.data());
      for (int64_t j : want_src) want_counts[static_cast<size_t>(j)] += 1;
      CHECK(plan.sample_epoch(k) == first + k);
    }
    CHECK(counts == want_counts);
  }
}

namespace {
// Everything a stream plan writes for one batch.
struct Filled {
  std::vector<int64_t> ids, sources, local_ids, source_rows;
  bool operator==(const Filled& o) const {
    return ids == o.ids && sources == o.sources && local_ids == o.local_ids && source_rows == o.source_rows;
  }
};

Filled fill_all(const StreamPlan& plan, int64_t k, PlanCursor* cursor) {
  const size_t b = static_cast<size_t>(plan.max_batch_rows());
  Filled f{std::vector<int64_t>(b, -1), std::vector<int64_t>(b, -1), std::vector<int64_t>(b, -1),
           std::vector<int64_t>(static_cast<size_t>(plan.num_sources()) + 1, -1)};
  BatchRows rows;
  rows.ids = f.ids.data();
  rows.sources = f.sources.data();
  rows.local_ids = f.local_ids.data();
  rows.source_rows = f.source_rows.data();
  rows.cursor = cursor;
  plan.fill(k, rows);
  return f;
}
}  // namespace

TEST_CASE(stream_plan_cursor_gives_the_rows_of_a_fresh_fill) {
  // A thread's cursor steps its extras forward and back from its last batch and keeps each
  // source's epoch: batches near each other, far apart (past the cursor's reach), and across
  // source epochs (sources of a few samples) must be the rows a fill without a cursor gives, and
  // those of the brute-force stream. A cursor of another plan is not read.
  std::mt19937_64 rng(31);
  for (int it = 0; it < 60; ++it) {
    const int64_t replicas = 1 + static_cast<int64_t>(rng() % 3);
    const StreamCase sc = random_stream(rng, 1 + static_cast<int>(rng() % 4), 1 + static_cast<int64_t>(rng() % 12),
                                        replicas, static_cast<int64_t>(rng() % 3), it % 2 ? 7 : 0);
    const int64_t first = sc.config->origin + static_cast<int64_t>(rng() % 5), batches = 1200;
    const StreamPlan plan(sc.config, first, first + batches, 0);
    const StreamPlan other(sc.config, first, first + batches, 0);
    std::unique_ptr<PlanCursor> cursor = plan.cursor(), foreign = other.cursor();
    CHECK(cursor != nullptr && cursor->owner() == &plan);
    int64_t k = static_cast<int64_t>(rng() % batches);
    for (int n = 0; n < 150; ++n) {
      const Filled want = fill_all(plan, k, nullptr);
      CHECK_MSG(fill_all(plan, k, cursor.get()) == want, "iteration " << it << " batch " << k);
      if (n % 10 == 0) {
        CHECK(fill_all(plan, k, foreign.get()) == want);
        std::vector<int64_t> brute_ids, brute_src;
        brute_batch(*sc.config, first + k, &brute_ids, &brute_src);
        CHECK(want.ids == brute_ids && want.sources == brute_src);
        for (size_t j = 0; j + 1 < want.source_rows.size(); ++j)
          for (int64_t row = want.source_rows[j]; row < want.source_rows[j + 1]; ++row)
            CHECK(want.sources[static_cast<size_t>(row)] == static_cast<int64_t>(j) &&
                  want.ids[static_cast<size_t>(row)] ==
                      want.local_ids[static_cast<size_t>(row)] + sc.config->sources[j].offset);
        CHECK(want.source_rows.front() == 0 && want.source_rows.back() == sc.config->batch_size);
      }
      const int64_t move = rng() % 8 == 0 ? static_cast<int64_t>(rng() % batches) - k  // far (or anywhere)
                                          : static_cast<int64_t>(rng() % 11) - 5;     // near, either way
      k = std::clamp<int64_t>(k + move, 0, batches - 1);
    }
  }
}

TEST_CASE(stream_plan_id_blocks_across_block_and_epoch_ends) {
  // At world size 1 a source's ids are copied from blocks of consecutive positions shared by the
  // threads: sources longer than a block (runs that cross block ends and epoch ends), several
  // threads with their own cursors filling batches in any order, a plan of many blocks per
  // source (the shared ring evicts): every batch is the brute-force stream's.
  std::mt19937_64 rng(52);
  for (int it = 0; it < 6; ++it) {
    auto c = std::make_shared<StreamConfig>();
    const int64_t lengths[3] = {300 + static_cast<int64_t>(rng() % 700), 1000 + static_cast<int64_t>(rng() % 300),
                                70 + static_cast<int64_t>(rng() % 50)};
    int64_t offset = 0;
    for (int j = 0; j < 3; ++j) {
      StreamSource src;
      src.order.num_samples = lengths[j];
      src.order.seed = stream_source_seed(5, j, 3);
      src.order.shuffle = true;
      src.order.order = it % 3 == 2 ? Order::Block : Order::Random;
      src.order.block_size = 16;
      src.offset = offset;
      offset += lengths[j];
      c->sources.push_back(src);
      c->base_positions.push_back(static_cast<int64_t>(rng() % 2000));
    }
    const Quotas q = random_quotas(rng, 3, 12);
    c->schedule = MixSchedule(q.g, q.base, q.shares, rng() % M);
    c->batch_size = q.g;
    c->seed = 5;
    const int64_t steps = 300;
    const auto plan = std::make_shared<StreamPlan>(c, 0, steps, 0);
    std::vector<Filled> want;
    for (int64_t k = 0; k < steps; ++k) {
      want.push_back(fill_all(*plan, k, nullptr));
      std::vector<int64_t> brute_ids, brute_src;
      brute_batch(*c, k, &brute_ids, &brute_src);
      CHECK_MSG(want.back().ids == brute_ids && want.back().sources == brute_src, "iteration " << it << " step " << k);
    }
    std::atomic<int64_t> next{0};
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)
      threads.emplace_back([&, t] {
        std::unique_ptr<PlanCursor> cursor = plan->cursor();
        std::mt19937_64 local(static_cast<uint64_t>(t));
        for (int64_t n; (n = next.fetch_add(1)) < 2 * steps;) {
          // Mostly in order, as collation threads claim steps; sometimes anywhere.
          const int64_t k = local() % 5 == 0 ? static_cast<int64_t>(local() % steps) : n % steps;
          if (!(fill_all(*plan, k, cursor.get()) == want[static_cast<size_t>(k)])) wrong.fetch_add(1);
        }
      });
    for (auto& t : threads) t.join();
    CHECK_MSG(wrong.load() == 0, "iteration " << it << ": " << wrong.load() << " wrong batches");
  }
}

TEST_CASE(stream_plan_positions_far_away_match_the_schedule) {
  std::mt19937_64 rng(8);
  const StreamCase sc = random_stream(rng, 3, 16, 2, 1, 5);
  const int64_t far = int64_t{1} << 40;
  const StreamPlan plan(sc.config, far, far + 10, 0);
  std::vector<int64_t> pos(3);
  plan.positions(far + 3, pos.data());
  for (int j = 0; j < 3; ++j)
    CHECK(pos[static_cast<size_t>(j)] ==
          sc.config->base_positions[static_cast<size_t>(j)] + sc.config->schedule.taken(j, far + 3 - 5));
  CHECK_THROWS(plan.positions(4, pos.data()), std::out_of_range, "out of the stream's range");
  CHECK_THROWS(StreamPlan(sc.config, 4, 10, 0), std::invalid_argument, "before the schedule's origin");
  CHECK_THROWS(StreamPlan(sc.config, 10, 9, 0), std::invalid_argument, "before its first");
  CHECK_THROWS(StreamPlan(sc.config, 10, int64_t{1} << 61, 0), std::invalid_argument, "would pass 2^62");
}

TEST_CASE(stream_config_is_validated) {
  std::mt19937_64 rng(3);
  StreamCase sc = random_stream(rng, 2, 4, 1, 0);
  auto bad = std::make_shared<StreamConfig>(*sc.config);
  bad->batch_size += 1;
  CHECK_THROWS(bad->validate(), std::invalid_argument, "global batch");
  bad = std::make_shared<StreamConfig>(*sc.config);
  bad->sources[0].order.partition = Partition::Shards;
  bad->sources[0].order.shard_rows = {bad->sources[0].order.num_samples};
  CHECK_THROWS(bad->validate(), std::invalid_argument, "partition='shards'");
  bad = std::make_shared<StreamConfig>(*sc.config);
  bad->base_positions.pop_back();
  CHECK_THROWS(bad->validate(), std::invalid_argument, "one schedule quota");
  bad = std::make_shared<StreamConfig>(*sc.config);
  bad->rank = 1;
  CHECK_THROWS(bad->validate(), std::invalid_argument, "rank must be");
}

TEST_CASE(stream_plan_concurrent_fills_agree_with_one_thread) {
  // Collation threads fill batches of one plan at once: its caches are shared (ThreadSanitizer
  // checks them); every thread must see the batches one thread computes.
  std::mt19937_64 rng(4);
  const StreamCase sc = random_stream(rng, 3, 8, 1, 0);
  const int64_t steps = 3000;
  const auto plan = std::make_shared<StreamPlan>(sc.config, 0, steps, 0);
  const auto alone = std::make_shared<StreamPlan>(sc.config, 0, steps, 0);
  const size_t b = static_cast<size_t>(sc.config->batch_size);
  std::vector<std::vector<int64_t>> expected(static_cast<size_t>(steps), std::vector<int64_t>(b));
  for (int64_t k = 0; k < steps; ++k) {
    BatchRows rows;
    rows.ids = expected[static_cast<size_t>(k)].data();
    alone->fill(k, rows);
  }
  std::atomic<int64_t> next{0};
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      std::vector<int64_t> ids(b);
      for (int64_t k; (k = next.fetch_add(1)) < steps;) {
        BatchRows rows;
        rows.ids = ids.data();
        plan->fill(k, rows);
        if (ids != expected[static_cast<size_t>(k)]) wrong.fetch_add(1);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(wrong.load() == 0);
}

TEST_CASE(engine_runs_stream_plans_with_source_rows) {
  // An engine over one int64 column whose value is the row id, two outputs (replicas) of a
  // 3-source stream over the concatenated ids: each batch's rows are the plan's ids, its
  // "source" part the plan's sources.
  std::mt19937_64 rng(12);
  const StreamCase sc0 = random_stream(rng, 3, 6, 2, 0);
  int64_t total = 0;
  for (int64_t n : sc0.lengths) total += n;
  std::vector<int64_t> values(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) values[static_cast<size_t>(i)] = i * 3 + 1;
  ArrayColumn col;
  col.name = "v";
  col.dtype = kInt64;
  col.base = reinterpret_cast<const std::byte*>(values.data());
  col.rows = total;
  col.pitch = col.row_bytes = sizeof(int64_t);
  EngineOptions o;
  o.num_threads = 3;
  o.prefetch = 3;
  o.batch_size = sc0.config->batch_size;
  o.with_index = true;
  o.with_source = true;
  Engine e({col}, o);
  const int64_t steps = 50;
  std::vector<OutputSpec> outputs;
  std::vector<std::shared_ptr<const StreamPlan>> plans;
  for (int64_t r = 0; r < 2; ++r) {
    auto c = std::make_shared<StreamConfig>(*sc0.config);
    c->rank = r;
    plans.push_back(std::make_shared<StreamPlan>(c, 4, 4 + steps, 0));
    outputs.emplace_back(plans.back(), false);
  }
  auto p = e.start(std::move(outputs));
  const BatchLayout& L = e.layout();
  for (int64_t k = 0; k < steps; ++k)
    for (int d = 0; d < 2; ++d) {
      Batch b;
      NextStatus s;
      while ((s = p->next(d, std::chrono::milliseconds(20), &b)) == NextStatus::Timeout) {
      }
      CHECK(s == NextStatus::Ok);
      if (s != NextStatus::Ok) return;
      for (auto& part : b.parts) part->hand_to_user();
      std::vector<int64_t> ids(static_cast<size_t>(o.batch_size)), src(ids.size());
      BatchRows rows;
      rows.ids = ids.data();
      rows.sources = src.data();
      plans[static_cast<size_t>(d)]->fill(k, rows);
      const auto* v = reinterpret_cast<const int64_t*>(b.parts[0]->data());
      const auto* index = reinterpret_cast<const int64_t*>(b.parts[static_cast<size_t>(L.index_part)]->data());
      const auto* source = reinterpret_cast<const int64_t*>(b.parts[static_cast<size_t>(L.source_part)]->data());
      CHECK(b.rows == o.batch_size && b.step == k);
      for (size_t i = 0; i < ids.size(); ++i) {
        CHECK(v[i] == ids[i] * 3 + 1);
        CHECK(index[i] == ids[i]);
        CHECK(source[i] == src[i]);
      }
    }
  Batch b;
  CHECK(p->next(0, std::chrono::milliseconds(2000), &b) == NextStatus::End);
  CHECK(L.names() == std::vector<std::string>({"v", "index", "source"}));
  e.close();
}

// ================================================================ MixSource

namespace {
ArrayColumn int64_column(const char* name, const std::vector<int64_t>& values) {
  ArrayColumn c;
  c.name = name;
  c.dtype = kInt64;
  c.base = reinterpret_cast<const std::byte*>(values.data());
  c.rows = static_cast<int64_t>(values.size());
  c.pitch = c.row_bytes = sizeof(int64_t);
  return c;
}
}  // namespace

TEST_CASE(mix_source_fills_each_run_from_its_child) {
  // Three children of two columns ("a": 10*child + local id, "b": a window of two values); ids
  // in any order (runs of one child, and single rows): every row equals its child's row.
  std::vector<std::vector<int64_t>> a(3), b(3);
  std::vector<std::shared_ptr<BatchSource>> children;
  const int64_t sizes[3] = {5, 1, 7};
  for (int j = 0; j < 3; ++j) {
    for (int64_t i = 0; i < sizes[j]; ++i) a[j].push_back(1000 * j + i);
    for (int64_t i = 0; i < sizes[j] + 1; ++i) b[j].push_back(-(1000 * j + i));
    ArrayColumn win = int64_column("b", b[j]);
    win.row_shape = {2};
    win.row_bytes = 2 * sizeof(int64_t);
    win.rows = sizes[j];
    children.push_back(std::make_shared<ArraySource>(std::vector<ArrayColumn>{int64_column("a", a[j]), win}));
  }
  MixSource mix(children);
  CHECK(mix.size() == 13 && mix.offsets() == std::vector<int64_t>({0, 5, 6, 13}));
  std::mt19937_64 rng(2);
  for (int it = 0; it < 200; ++it) {
    const int64_t count = static_cast<int64_t>(rng() % 20);
    std::vector<int64_t> ids(static_cast<size_t>(count));
    for (int64_t& id : ids) id = static_cast<int64_t>(rng() % 13);
    if (it % 2) std::sort(ids.begin(), ids.end());  // grouped, as a stream plan gives them
    std::vector<int64_t> out_a(ids.size() + 1, 7), out_b(2 * ids.size() + 1, 7);
    std::byte* parts[2] = {reinterpret_cast<std::byte*>(out_a.data()), reinterpret_cast<std::byte*>(out_b.data())};
    FillRequest r;
    r.ids = ids.data();
    r.count = count;
    r.parts = parts;
    mix.fill(r);
    if (it % 2) {  // grouped: the plan's split (each row's local id, each source's rows) fills the same rows
      std::vector<int64_t> local, rows_of(4, 0), again_a(out_a.size(), 7), again_b(out_b.size(), 7);
      for (int64_t id : ids) {
        ++rows_of[static_cast<size_t>(id < 5 ? 1 : id < 6 ? 2 : 3)];
        local.push_back(id - (id < 5 ? 0 : id < 6 ? 5 : 6));
      }
      for (size_t j = 1; j < rows_of.size(); ++j) rows_of[j] += rows_of[j - 1];  // where each source's rows start
      std::byte* again[2] = {reinterpret_cast<std::byte*>(again_a.data()), reinterpret_cast<std::byte*>(again_b.data())};
      FillRequest g = r;
      g.parts = again;
      g.local_ids = local.data();
      g.source_rows = rows_of.data();
      g.num_sources = 3;
      mix.fill(g);
      CHECK(again_a == out_a && again_b == out_b);
    }
    for (size_t i = 0; i < ids.size(); ++i) {
      const int64_t id = ids[i];
      const int j = id < 5 ? 0 : id < 6 ? 1 : 2;
      const int64_t local = id - (j == 0 ? 0 : j == 1 ? 5 : 6);
      CHECK(out_a[i] == 1000 * j + local);
      CHECK(out_b[2 * i] == -(1000 * j + local) && out_b[2 * i + 1] == -(1000 * j + local + 1));
    }
    CHECK(out_a[ids.size()] == 7 && out_b[2 * ids.size()] == 7);  // nothing written past the batch
  }
  const int64_t bad = 13;
  std::vector<int64_t> sink(2);
  std::byte* parts[2] = {reinterpret_cast<std::byte*>(sink.data()), reinterpret_cast<std::byte*>(sink.data())};
  FillRequest r;
  r.ids = &bad;
  r.count = 1;
  r.parts = parts;
  CHECK_THROWS(mix.fill(r), std::out_of_range, "out of the mixture's range");
}

TEST_CASE(mix_source_fills_runs_from_where_each_source_starts) {
  // The plan's split as where each source's rows start (FillRequest::source_rows) fills what the
  // ids alone fill; rows that do not cover the batch in source order, or another number of
  // sources, are refused.
  std::vector<std::vector<int64_t>> a(3);
  std::vector<std::shared_ptr<BatchSource>> children;
  const int64_t sizes[3] = {5, 1, 7}, offsets[3] = {0, 5, 6};
  for (int j = 0; j < 3; ++j) {
    for (int64_t i = 0; i < sizes[j]; ++i) a[j].push_back(1000 * j + i);
    children.push_back(std::make_shared<ArraySource>(std::vector<ArrayColumn>{int64_column("a", a[j])}));
  }
  // Strided children are read straight from their columns; with a sharded child every run is
  // its child's own fill: both must fill what the ids fill.
  std::vector<int64_t> first_rows(a[2].begin(), a[2].begin() + 3), last_rows(a[2].begin() + 3, a[2].end());
  ArrayColumn sharded = int64_column("a", a[2]);
  set_shards(sharded, {Shard{reinterpret_cast<const std::byte*>(first_rows.data()), 3, 8},
                       Shard{reinterpret_cast<const std::byte*>(last_rows.data()), 4, 8}});
  auto mixed_children = children;
  mixed_children[2] = std::make_shared<ArraySource>(std::vector<ArrayColumn>{sharded});
  for (const auto& kids : {children, mixed_children}) {
    MixSource mix(kids);
    std::mt19937_64 rng(3);
    for (int it = 0; it < 200; ++it) {
      std::vector<int64_t> starts{0}, local, ids, values;
      for (int j = 0; j < 3; ++j) {
        const int64_t rows = static_cast<int64_t>(rng() % 6);  // some sources have no rows
        for (int64_t i = 0; i < rows; ++i) {
          local.push_back(static_cast<int64_t>(rng() % static_cast<uint64_t>(sizes[j])));
          ids.push_back(offsets[j] + local.back());
          values.push_back(1000 * j + local.back());
        }
        starts.push_back(starts.back() + rows);
      }
      const int64_t count = starts.back();
      std::vector<int64_t> want(static_cast<size_t>(count) + 1, 7), got(want.size(), 7);
      std::byte* want_parts[1] = {reinterpret_cast<std::byte*>(want.data())};
      std::byte* got_parts[1] = {reinterpret_cast<std::byte*>(got.data())};
      FillRequest r;
      r.ids = ids.data();
      r.count = count;
      r.parts = want_parts;
      mix.fill(r);
      FillRequest g;
      g.count = count;
      g.parts = got_parts;
      g.local_ids = local.data();
      g.source_rows = starts.data();
      g.num_sources = 3;
      mix.fill(g);
      CHECK_MSG(got == want, "iteration " << it);
      CHECK(std::equal(values.begin(), values.end(), got.begin()) && got.back() == 7);
    }
  }
  MixSource mix(children);
  std::vector<int64_t> local{0, 0, 0}, sink(3);
  std::byte* parts[1] = {reinterpret_cast<std::byte*>(sink.data())};
  FillRequest r;
  r.count = 3;
  r.parts = parts;
  r.local_ids = local.data();
  r.num_sources = 3;
  const int64_t gap[4] = {0, 1, 1, 2}, backwards[4] = {0, 2, 1, 3}, past[4] = {0, 1, 2, 4};
  r.source_rows = gap;
  CHECK_THROWS(mix.fill(r), std::logic_error, "do not cover the batch");
  r.source_rows = backwards;
  CHECK_THROWS(mix.fill(r), std::logic_error, "rows of mixture source 1");
  r.source_rows = past;
  CHECK_THROWS(mix.fill(r), std::logic_error, "rows of mixture source 2");
  const int64_t fine[4] = {0, 1, 2, 3};
  r.source_rows = fine;
  r.num_sources = 2;
  CHECK_THROWS(mix.fill(r), std::logic_error, "a plan of 2 sources");
}

TEST_CASE(engine_fills_a_mixed_source_from_the_plans_runs) {
  // An engine over a MixSource with neither an index nor a source part: the plan hands the
  // mixed source its runs and local ids only (the ids are never computed). Every batch, built
  // by several threads with their own cursors, holds the rows of the plan's ids.
  std::mt19937_64 rng(41);
  const StreamCase sc = random_stream(rng, 3, 8, 1, 0);
  std::vector<std::vector<int64_t>> values(3);
  std::vector<std::shared_ptr<BatchSource>> children;
  for (size_t j = 0; j < 3; ++j) {
    for (int64_t i = 0; i < sc.lengths[j]; ++i) values[j].push_back(sc.config->sources[j].offset + i);
    children.push_back(std::make_shared<ArraySource>(std::vector<ArrayColumn>{int64_column("v", values[j])}));
  }
  EngineOptions o;
  o.num_threads = 3;
  o.prefetch = 4;
  o.batch_size = sc.config->batch_size;
  Engine e(std::make_shared<MixSource>(children), o);
  const int64_t steps = 400;
  auto plan = std::make_shared<StreamPlan>(sc.config, 2, 2 + steps, 0);
  std::vector<OutputSpec> outputs;
  outputs.emplace_back(plan, false);
  auto p = e.start(std::move(outputs));
  for (int64_t k = 0; k < steps; ++k) {
    Batch b;
    NextStatus s;
    while ((s = p->next(0, std::chrono::milliseconds(20), &b)) == NextStatus::Timeout) {
    }
    CHECK(s == NextStatus::Ok);
    if (s != NextStatus::Ok) return;
    std::vector<int64_t> ids(static_cast<size_t>(o.batch_size));
    BatchRows rows;
    rows.ids = ids.data();
    plan->fill(k, rows);
    const auto* v = reinterpret_cast<const int64_t*>(b.parts[0]->data());
    CHECK(b.rows == o.batch_size && b.parts.size() == 1);
    for (size_t i = 0; i < ids.size(); ++i) CHECK_MSG(v[i] == ids[i], "batch " << k << " row " << i);
  }
  e.close();
}

TEST_CASE(mix_source_refuses_children_of_another_schema) {
  std::vector<int64_t> v(4, 0);
  std::vector<int32_t> w(4, 0);
  auto a = std::make_shared<ArraySource>(std::vector<ArrayColumn>{int64_column("x", v)});
  auto renamed = std::make_shared<ArraySource>(std::vector<ArrayColumn>{int64_column("y", v)});
  ArrayColumn narrow = int64_column("x", v);
  narrow.dtype = DType{kInt, 32};
  narrow.row_bytes = narrow.pitch = 4;
  narrow.base = reinterpret_cast<const std::byte*>(w.data());
  auto other_type = std::make_shared<ArraySource>(std::vector<ArrayColumn>{narrow});
  auto two = std::make_shared<ArraySource>(std::vector<ArrayColumn>{int64_column("x", v), int64_column("z", v)});
  CHECK_THROWS(MixSource({a, renamed}), std::invalid_argument, "source 1's part 0 'y'");
  CHECK_THROWS(MixSource({a, other_type}), std::invalid_argument, "32 bits");
  CHECK_THROWS(MixSource({a, two}), std::invalid_argument, "has 2 parts");
  CHECK_THROWS(MixSource({}), std::invalid_argument, "at least one source");
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_stream"); }
