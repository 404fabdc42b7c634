// Tests of the sampler: the seeded permutation (core/permutation.h) and the epoch plans of the
// sampling contract (core/sampler.h), against a reference written from shared/DESIGN.md.
// Built and run under ThreadSanitizer and AddressSanitizer + UBSan by tests/cpp/run_sanitizers.sh.
#include "core/permutation.h"
#include "core/sampler.h"
#include "core_fixtures.h"

// ================================================================ Permutation

TEST_CASE(permutation_is_a_bijection_with_inverse_and_fill) {
  std::vector<uint64_t> sizes = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 100, 1000, 1024, 4097};
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 5; ++i) sizes.push_back(1 + rng() % 100000);
  sizes.push_back(100000);
  for (uint64_t n : sizes) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{7}, ~uint64_t{0}}) {
      const Permutation p(n, seed, 3);
      CHECK(p.size() == n);
      std::vector<char> seen(n, 0);
      bool in_range = true, unique = true, inverts = true;
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t v = p(i);
        if (v >= n) {
          in_range = false;
          break;
        }
        if (seen[v]++) unique = false;
        if (p.inverse(v) != i) inverts = false;
      }
      CHECK_MSG(in_range && unique, "n=" << n << " seed=" << seed);
      CHECK_MSG(inverts, "inverse(P(i)) != i, n=" << n);
      // fill == operator() on the whole range and on inner ranges.
      std::vector<int64_t> out(n);
      p.fill(0, static_cast<int64_t>(n), out.data());
      bool fill_ok = true;
      for (uint64_t i = 0; i < n; ++i) fill_ok &= static_cast<uint64_t>(out[i]) == p(i);
      const uint64_t first = n / 3, count = n - first - n / 4;
      std::vector<int64_t> part(count + 1);
      p.fill(first, static_cast<int64_t>(count), part.data());
      for (uint64_t i = 0; i < count; ++i) fill_ok &= static_cast<uint64_t>(part[i]) == p(first + i);
      CHECK_MSG(fill_ok, "fill differs from operator(), n=" << n);
    }
  }
  // Huge n: spot checks (values in range, inverse inverts, fill agrees).
  for (uint64_t n : {(uint64_t{1} << 40) + 3, (uint64_t{1} << 63) + 5, ~uint64_t{0}}) {
    const Permutation p(n, 42, 1);
    bool ok = true;
    for (int k = 0; k < 2000; ++k) {
      const uint64_t x = rng() % n;
      const uint64_t v = p(x);
      ok &= v < n && p.inverse(v) == x;
    }
    CHECK_MSG(ok, "huge n=" << n);
    int64_t out[8];
    p.fill(1000, 8, out);
    bool fill_ok = true;
    for (int i = 0; i < 8; ++i) fill_ok &= static_cast<uint64_t>(out[i]) == p(1000 + i);
    CHECK_MSG(fill_ok, "huge n fill, n=" << n);
  }
}

TEST_CASE(permutation_fill_of_short_ranges_matches_and_writes_only_its_range) {
  // Short counts end in a partial vector pass (computed aside) and cycle-walk in passes padded
  // to whole vectors: every count from 0 to 40 at random offsets, sizes that walk and that don't.
  std::mt19937_64 rng(77);
  for (uint64_t n : {uint64_t{1}, uint64_t{9}, uint64_t{100}, uint64_t{129}, uint64_t{4096}, uint64_t{5000},
                     uint64_t{262143}, uint64_t{175781}}) {
    const Permutation p(n, rng(), 5);
    for (int64_t count = 0; count <= 40; ++count) {
      if (static_cast<uint64_t>(count) > n) break;
      const uint64_t first = rng() % (n - static_cast<uint64_t>(count) + 1);
      std::vector<int64_t> out(static_cast<size_t>(count) + 8, -7);
      p.fill(first, count, out.data());
      bool ok = true;
      for (int64_t i = 0; i < count; ++i) ok &= static_cast<uint64_t>(out[static_cast<size_t>(i)]) == p(first + i);
      for (size_t i = static_cast<size_t>(count); i < out.size(); ++i) ok &= out[i] == -7;
      CHECK_MSG(ok, "n=" << n << " first=" << first << " count=" << count);
    }
  }
}

TEST_CASE(permutation_and_ordering_fill_strided_match_position_by_position) {
  // Every step-th position (a rank's share of a stream) through the vector loop: the values of
  // operator() at those positions, for permutations that walk and orders of every kind.
  std::mt19937_64 rng(78);
  for (uint64_t n : {uint64_t{1}, uint64_t{37}, uint64_t{1000}, uint64_t{4096}, uint64_t{175781}}) {
    const Permutation p(n, rng(), 9);
    for (int it = 0; it < 40; ++it) {
      const uint64_t step = 1 + rng() % 9;
      const int64_t count = static_cast<int64_t>(std::min<uint64_t>(rng() % 300, (n - 1) / step + 1));
      const uint64_t last = static_cast<uint64_t>(count > 0 ? count - 1 : 0) * step;
      const uint64_t first = rng() % (n - last);
      std::vector<int64_t> out(static_cast<size_t>(count) + 8, -7);
      p.fill_strided(first, step, count, out.data());
      bool ok = true;
      for (int64_t i = 0; i < count; ++i)
        ok &= static_cast<uint64_t>(out[static_cast<size_t>(i)]) == p(first + static_cast<uint64_t>(i) * step);
      for (size_t i = static_cast<size_t>(count); i < out.size(); ++i) ok &= out[i] == -7;
      CHECK_MSG(ok, "n=" << n << " first=" << first << " step=" << step << " count=" << count);
    }
  }
  for (int mode = 0; mode < 4; ++mode) {
    SamplerConfig cfg;
    cfg.num_samples = 5003;
    cfg.seed = 4;
    cfg.shuffle = mode != 0;
    cfg.order = mode >= 2 ? Order::Block : Order::Random;
    cfg.block_size = 64;
    if (mode == 3) cfg.shard_rows = {1000, 3, 2000, 2000};
    const Ordering o(cfg, 2);
    for (int64_t step : {1, 2, 3, 8}) {
      std::vector<int64_t> out(600);
      o.fill_strided(17, step, 600, out.data());
      bool ok = true;
      for (int64_t i = 0; i < 600; ++i) ok &= out[static_cast<size_t>(i)] == o(17 + i * step);
      CHECK_MSG(ok, "mode " << mode << " step " << step);
    }
  }
}

TEST_CASE(permutation_depends_on_seed_and_stream) {
  const uint64_t n = 1000;
  std::set<std::vector<uint64_t>> distinct;
  int count = 0;
  for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{12345}, ~uint64_t{0}}) {
    for (uint64_t stream : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}}) {
      const Permutation p(n, seed, stream);
      std::vector<uint64_t> v(n);
      size_t fixed_points = 0;
      for (uint64_t i = 0; i < n; ++i) fixed_points += (v[i] = p(i)) == i;
      CHECK_MSG(fixed_points < n / 10, "seed=" << seed << " stream=" << stream
                                               << ": looks like the identity");
      distinct.insert(v);
      ++count;
      // Deterministic: the same key gives the same permutation.
      const Permutation q(n, seed, stream);
      bool same = true;
      for (uint64_t i = 0; i < n; ++i) same &= q(i) == v[i];
      CHECK(same);
    }
  }
  CHECK_MSG(static_cast<int>(distinct.size()) == count,
            distinct.size() << " distinct of " << count);
}

// ================================================================ Ordering / EpochPlan

TEST_CASE(ordering_random_and_block_are_bijections) {
  for (int64_t n : {1, 2, 3, 5, 7, 8, 100, 1000, 4097, 10007}) {
    for (int64_t bs : {1, 2, 7, 64, 4096, 100000}) {
      for (int64_t epoch : {0, 1, 5}) {
        for (Order order : {Order::Random, Order::Block}) {
          if (order == Order::Random && bs != 4096) continue;
          const SamplerConfig c = make_cfg(n, 1, 1, 0, true, order, Even::Pad, false, 99, bs);
          const Ordering o(c, epoch);
          std::vector<int64_t> pos_of(static_cast<size_t>(n), -1);
          bool ok = true;
          std::vector<int64_t> seq(static_cast<size_t>(n));
          for (int64_t p = 0; p < n; ++p) {
            const int64_t id = o(p);
            seq[static_cast<size_t>(p)] = id;
            if (id < 0 || id >= n || pos_of[static_cast<size_t>(id)] >= 0) {
              ok = false;
              break;
            }
            pos_of[static_cast<size_t>(id)] = p;
          }
          CHECK_MSG(ok, "not a bijection: " << describe(c) << " epoch=" << epoch);
          if (!ok) continue;
          // fill == operator() over a few ranges.
          std::vector<int64_t> out(static_cast<size_t>(n) + 1);
          for (int64_t first : {int64_t{0}, n / 3, n - 1}) {
            const int64_t count = std::min<int64_t>(n - first, 1 + n / 2);
            o.fill(first, count, out.data());
            bool same = true;
            for (int64_t i = 0; i < count; ++i)
              same &= out[static_cast<size_t>(i)] == seq[static_cast<size_t>(first + i)];
            CHECK_MSG(same, "fill != operator(): " << describe(c) << " first=" << first);
          }
          if (order == Order::Block) {
            // Locality: each block of ids occupies one contiguous run of positions.
            const int64_t b = std::min(bs, n);
            const int64_t blocks = (n + b - 1) / b;
            int64_t changes = 0;
            for (int64_t p = 1; p < n; ++p)
              changes += seq[static_cast<size_t>(p)] / b != seq[static_cast<size_t>(p - 1)] / b;
            CHECK_MSG(changes == blocks - 1, "block order is not block-contiguous: "
                                                 << describe(c) << " changes=" << changes);
          }
        }
      }
    }
  }
  // Shuffle off is the identity; different epochs differ; the same epoch is reproducible.
  const Ordering id(make_cfg(50, 1, 1, 0, false), 3);
  bool identity = true;
  for (int64_t p = 0; p < 50; ++p) identity &= id(p) == p;
  CHECK(identity);
  for (Order order : {Order::Random, Order::Block}) {
    const SamplerConfig c = make_cfg(5000, 1, 1, 0, true, order, Even::Pad, false, 1, 64);
    const Ordering e0(c, 0), e0b(c, 0), e1(c, 1);
    int64_t same01 = 0;
    bool repro = true;
    for (int64_t p = 0; p < 5000; ++p) {
      same01 += e0(p) == e1(p);
      repro &= e0(p) == e0b(p);
    }
    CHECK(repro);
    CHECK_MSG(same01 < 500, "epochs 0 and 1 agree on " << same01 << " of 5000 positions");
  }
}

namespace {

struct RefSpan {
  int64_t first, count;
};

// The sampling contract of shared/DESIGN.md, written independently of sampler.cpp: the epoch's
// sequence has length L (N made a multiple of W: up for pad/mask, down for drop); step s, rank r
// gets positions [s*G + r*B, s*G + (r+1)*B) with G = B*W; the last shorter step is split into W
// equal contiguous shares, dropped by drop_last. A resume start is a multiple of G (or >= L).
std::vector<RefSpan> reference_spans(const SamplerConfig& c, int64_t start) {
  const int64_t n = c.num_samples, b = c.batch_size, w = c.world_size, r = c.rank;
  const int64_t len = c.even == Even::Drop ? n / w * w : (n + w - 1) / w * w;
  const int64_t g = b * w;
  const int64_t full = len / g;
  std::vector<RefSpan> out;
  if (start >= len) return out;
  for (int64_t s = start / g; s < full; ++s) out.push_back({s * g + r * b, b});
  const int64_t tail = len - full * g;
  if (tail > 0 && !c.drop_last) out.push_back({full * g + r * (tail / w), tail / w});
  return out;
}

int64_t reference_length(const SamplerConfig& c) {
  const int64_t n = c.num_samples, w = c.world_size;
  return c.even == Even::Drop ? n / w * w : (n + w - 1) / w * w;
}

// P[p] for the epoch's sequence, padding wrapping around: P[N + i] = P[i mod N].
int64_t reference_id(const SamplerConfig& c, const Ordering& o, int64_t position) {
  const int64_t p = position % c.num_samples;
  return c.shuffle ? o(p) : p;
}

// The plan's batches equal the reference from `start` (spans, ids, valid flags). Returns "" or
// what differs.
std::string compare_plan(const SamplerConfig& c, int64_t epoch, int64_t start) {
  std::ostringstream err;
  const EpochPlan plan(c, epoch, start);
  const std::vector<RefSpan> ref = reference_spans(c, start);
  const Ordering o(c, epoch);
  if (plan.num_batches() != static_cast<int64_t>(ref.size())) {
    err << "num_batches " << plan.num_batches() << ", reference " << ref.size();
    return err.str();
  }
  std::vector<int64_t> ids, ids2;
  std::vector<char> valid_storage;
  for (int64_t s = 0; s < plan.num_batches(); ++s) {
    const BatchSpan span = plan.batch(s);
    if (span.first != ref[static_cast<size_t>(s)].first ||
        span.count != ref[static_cast<size_t>(s)].count) {
      err << "step " << s << ": span [" << span.first << ", +" << span.count
          << "), reference [" << ref[static_cast<size_t>(s)].first << ", +"
          << ref[static_cast<size_t>(s)].count << ")";
      return err.str();
    }
    ids.assign(static_cast<size_t>(span.count), -1);
    ids2.assign(static_cast<size_t>(span.count), -1);
    std::unique_ptr<bool[]> valid(new bool[static_cast<size_t>(span.count) + 1]);
    plan.fill_ids(span, ids.data(), valid.get());
    plan.fill_ids(span, ids2.data(), nullptr);
    for (int64_t i = 0; i < span.count; ++i) {
      const int64_t pos = span.first + i;
      const int64_t want = reference_id(c, o, pos);
      if (ids[static_cast<size_t>(i)] != want || ids2[static_cast<size_t>(i)] != want) {
        err << "step " << s << " position " << pos << ": id " << ids[static_cast<size_t>(i)]
            << ", reference " << want;
        return err.str();
      }
      if (valid[i] != (pos < c.num_samples)) {
        err << "step " << s << " position " << pos << ": valid " << valid[i];
        return err.str();
      }
    }
  }
  return "";
}

}  // namespace

TEST_CASE(epoch_plan_matches_the_sampling_contract) {
  const int64_t ns[] = {1, 2, 3, 5, 7, 8, 10, 17, 31, 64, 100, 257, 1000};
  const int64_t bs[] = {1, 3, 8, 32};
  const int64_t ws[] = {1, 2, 3, 4, 8};
  int64_t configs = 0;
  for (int64_t n : ns)
    for (int64_t b : bs)
      for (int64_t w : ws)
        for (Even even : {Even::Pad, Even::Drop, Even::Mask})
          for (bool drop_last : {false, true})
            for (int mode = 0; mode < 3; ++mode) {  // no shuffle, random, block(7)
              const bool shuffle = mode > 0;
              const Order order = mode == 2 ? Order::Block : Order::Random;
              const int64_t epoch = (n + b + w) % 3;
              ++configs;
              const SamplerConfig base =
                  make_cfg(n, b, w, 0, shuffle, order, even, drop_last, 1234 + n, 7);
              const int64_t len = reference_length(base);
              const int64_t g = b * w, full = len / g, tail = len - full * g;
              int64_t nb0 = -1;
              std::vector<int64_t> count(static_cast<size_t>(n), 0);
              int64_t positions = 0, padding = 0;
              for (int64_t r = 0; r < w; ++r) {
                SamplerConfig c = base;
                c.rank = r;
                const EpochPlan plan(c, epoch, 0);
                if (r == 0) nb0 = plan.num_batches();
                CHECK_MSG(plan.num_batches() == nb0, "ranks differ in num_batches: " << describe(c));
                CHECK_MSG(plan.end_position() == len, describe(c) << " end " << plan.end_position());
                CHECK(plan.global_batch() == g);
                CHECK(plan.start_position() == 0);
                CHECK(plan.epoch() == epoch);
                const std::string e = compare_plan(c, epoch, 0);
                CHECK_MSG(e.empty(), describe(c) << ": " << e);
                if (!e.empty()) continue;
                for (int64_t s = 0; s < plan.num_batches(); ++s) {
                  const BatchSpan span = plan.batch(s);
                  std::vector<int64_t> ids(static_cast<size_t>(span.count));
                  std::unique_ptr<bool[]> valid(new bool[static_cast<size_t>(span.count) + 1]);
                  plan.fill_ids(span, ids.data(), valid.get());
                  for (int64_t i = 0; i < span.count; ++i) {
                    ++positions;
                    if (valid[i])
                      ++count[static_cast<size_t>(ids[static_cast<size_t>(i)])];
                    else
                      ++padding;
                  }
                }
                // position_after: k*G for k < num_batches, the end after the last batch.
                for (int64_t k = 0; k <= plan.num_batches() + 1; ++k) {
                  const int64_t want = k >= plan.num_batches() ? len : k * g;
                  CHECK_MSG(plan.position_after(k) == want, describe(c) << " k=" << k);
                }
                CHECK_THROWS(plan.batch(plan.num_batches()), std::out_of_range, "out of range");
                CHECK_THROWS(plan.batch(-1), std::out_of_range, "out of range");
              }
              // Coverage over all ranks.
              const bool tail_dropped = drop_last && tail > 0;
              int64_t covered = 0, duplicated = 0;
              for (int64_t k : count) {
                covered += k > 0;
                duplicated += k > 1;
              }
              CHECK_MSG(duplicated == 0, describe(base) << ": " << duplicated << " ids repeated");
              if (!tail_dropped) {
                CHECK_MSG(positions == len, describe(base) << " positions " << positions);
                if (even == Even::Drop) {
                  CHECK_MSG(covered == n / w * w && padding == 0, describe(base));
                } else {
                  CHECK_MSG(covered == n, describe(base) << " covered " << covered);
                  CHECK_MSG(padding == len - n, describe(base) << " padding " << padding);
                }
              } else {
                CHECK_MSG(positions == full * g, describe(base) << " positions " << positions);
                CHECK_MSG(padding == 0 || full * g > n, describe(base));
              }
              if (n < w && even == Even::Drop) CHECK(nb0 == 0);

              // Resume: from position_after(k), the rest of the uninterrupted plan.
              const EpochPlan plan0(base, epoch, 0);
              std::set<int64_t> ks = {1, nb0 / 2, std::min(full, nb0), nb0};
              for (int64_t k : ks) {
                if (k < 0 || k > nb0) continue;
                const int64_t start = plan0.position_after(k);
                for (int64_t r = 0; r < w; ++r) {
                  SamplerConfig c = base;
                  c.rank = r;
                  const EpochPlan whole(c, epoch, 0), resumed(c, epoch, start);
                  CHECK_MSG(resumed.num_batches() == whole.num_batches() - k,
                            describe(c) << " resume k=" << k << ": " << resumed.num_batches());
                  bool same = resumed.num_batches() == whole.num_batches() - k;
                  for (int64_t s = 0; same && s < resumed.num_batches(); ++s) {
                    const BatchSpan a = resumed.batch(s), bb = whole.batch(s + k);
                    same = a.first == bb.first && a.count == bb.count;
                  }
                  CHECK_MSG(same, describe(c) << " resume k=" << k << " spans differ");
                  const std::string e = compare_plan(c, epoch, start);
                  CHECK_MSG(e.empty(), describe(c) << " resume k=" << k << ": " << e);
                }
              }

              // Elastic: another world size W2 with the same G has the same full global steps,
              // and resuming there from k*G follows the reference for W2.
              for (int64_t w2 : {1, 2, 4, 8}) {
                if (w2 == w || g % w2 != 0) continue;
                const int64_t b2 = g / w2;
                SamplerConfig base2 = base;
                base2.world_size = w2;
                base2.batch_size = b2;
                const int64_t full2 = reference_length(base2) / g;
                const int64_t steps = std::min(full, full2);
                if (steps == 0) continue;
                std::vector<std::vector<int64_t>> seq1(static_cast<size_t>(steps)),
                    seq2(static_cast<size_t>(steps));
                for (int pass = 0; pass < 2; ++pass) {
                  const SamplerConfig& bc = pass ? base2 : base;
                  auto& seq = pass ? seq2 : seq1;
                  for (int64_t r = 0; r < bc.world_size; ++r) {
                    SamplerConfig c = bc;
                    c.rank = r;
                    const EpochPlan plan(c, epoch, 0);
                    for (int64_t s = 0; s < steps; ++s) {
                      const BatchSpan span = plan.batch(s);
                      std::vector<int64_t> ids(static_cast<size_t>(span.count));
                      plan.fill_ids(span, ids.data(), nullptr);
                      seq[static_cast<size_t>(s)].insert(seq[static_cast<size_t>(s)].end(),
                                                         ids.begin(), ids.end());
                    }
                  }
                }
                CHECK_MSG(seq1 == seq2, describe(base) << ": full steps differ at W2=" << w2);
                const int64_t k = steps / 2 + 1 <= steps ? steps / 2 + 1 : steps;
                for (int64_t r = 0; r < w2; ++r) {
                  SamplerConfig c = base2;
                  c.rank = r;
                  const std::string e = compare_plan(c, epoch, k * g);
                  CHECK_MSG(e.empty(), describe(c) << " elastic resume at " << k * g << ": " << e);
                }
              }
            }
  std::printf("    (%lld sampler configurations)\n", static_cast<long long>(configs));
}

TEST_CASE(epoch_plan_small_cases_by_hand) {
  // N=10, B=2, W=3, pad, no shuffle: L=12, G=6; steps 0,1 are full: rank1 gets [2,4) and [8,10).
  {
    const EpochPlan p(make_cfg(10, 2, 3, 1, false), 0, 0);
    CHECK(p.num_batches() == 2);
    CHECK(p.batch(0).first == 2 && p.batch(0).count == 2);
    CHECK(p.batch(1).first == 8 && p.batch(1).count == 2);
    const EpochPlan p2(make_cfg(10, 2, 3, 2, false, Order::Random, Even::Mask), 0, 0);
    int64_t ids[2];
    bool valid[2];
    p2.fill_ids(p2.batch(1), ids, valid);  // positions 10, 11 wrap to 0, 1 and are padding
    CHECK(ids[0] == 0 && ids[1] == 1 && !valid[0] && !valid[1]);
  }
  // N=10, B=4, W=3, drop: L=9, G=12: no full step, one tail step of 3 per rank.
  {
    const EpochPlan p(make_cfg(10, 4, 3, 2, false, Order::Random, Even::Drop), 0, 0);
    CHECK(p.num_batches() == 1);
    CHECK(p.batch(0).first == 6 && p.batch(0).count == 3);
    const EpochPlan q(make_cfg(10, 4, 3, 2, false, Order::Random, Even::Drop, true), 0, 0);
    CHECK(q.num_batches() == 0);
  }
  // N=2 < W=4: pad gives every rank one sample (wrapping twice); drop gives nothing.
  {
    for (int64_t r = 0; r < 4; ++r) {
      const EpochPlan p(make_cfg(2, 8, 4, r, false, Order::Random, Even::Mask), 0, 0);
      CHECK(p.num_batches() == 1 && p.batch(0).count == 1 && p.batch(0).first == r);
      int64_t id;
      bool valid;
      p.fill_ids(p.batch(0), &id, &valid);
      CHECK(id == r % 2 && valid == (r < 2));
      const EpochPlan d(make_cfg(2, 8, 4, r, false, Order::Random, Even::Drop), 0, 0);
      CHECK(d.num_batches() == 0);
    }
  }
}

TEST_CASE(sampler_rejects_bad_configurations) {
  auto plan = [](SamplerConfig c, int64_t epoch = 0, int64_t start = 0) {
    EpochPlan p(c, epoch, start);
    return p.num_batches();
  };
  CHECK_THROWS(plan(make_cfg(0, 1, 1, 0, false)), std::invalid_argument, "dataset length");
  CHECK_THROWS(plan(make_cfg(-3, 1, 1, 0, true)), std::invalid_argument, "dataset length");
  CHECK_THROWS(plan(make_cfg(10, 0, 1, 0, false)), std::invalid_argument, "batch_size");
  CHECK_THROWS(plan(make_cfg(10, 1, 0, 0, false)), std::invalid_argument, "world_size");
  CHECK_THROWS(plan(make_cfg(10, 1, 2, 2, false)), std::invalid_argument, "rank");
  CHECK_THROWS(plan(make_cfg(10, 1, 2, -1, false)), std::invalid_argument, "rank");
  CHECK_THROWS(plan(make_cfg(10, 1, 1, 0, false, Order::Random, Even::Pad, false, 0, 0)),
               std::invalid_argument, "block_size");
  CHECK_THROWS(plan(make_cfg(10, 1, 1, 0, false), -1), std::invalid_argument, "epoch");
  CHECK_THROWS(plan(make_cfg(10, 1, 1, 0, false), 0, -1), std::invalid_argument, "start");
  CHECK_THROWS(plan(make_cfg(10, int64_t{1} << 40, 2, 0, false)), std::invalid_argument,
               "too large");
  CHECK_THROWS(parse_order("blocks"), std::invalid_argument, "order");
  CHECK_THROWS(parse_even("wrap"), std::invalid_argument, "even");
  CHECK(parse_order("block") == Order::Block && parse_even("mask") == Even::Mask);

  // Shuffled block order: an invalid configuration must also be an invalid_argument, not a
  // crash (EpochPlan builds its Ordering before validating; Ordering divides by the block
  // size). Run in a child process: a division by zero would end this one.
  struct Bad {
    const char* what;
    SamplerConfig cfg;
  };
  const Bad bad[] = {
      {"block order, num_samples=0", make_cfg(0, 1, 1, 0, true, Order::Block)},
      {"block order, block_size=0", make_cfg(10, 1, 1, 0, true, Order::Block, Even::Pad, false, 0, 0)},
      {"block order, block_size=-4", make_cfg(10, 1, 1, 0, true, Order::Block, Even::Pad, false, 0, -4)},
  };
  for (const Bad& b : bad) {
    const SamplerConfig cfg = b.cfg;
    const int rc = run_in_child([cfg] {
      try {
        EpochPlan p(cfg, 0, 0);
        return false;
      } catch (const std::invalid_argument&) {
        return true;
      }
    });
    CHECK_MSG(rc == 0, b.what << ": EpochPlan should throw std::invalid_argument; child exit "
                              << rc << (rc >= 128 ? " (killed by a signal)" : ""));
  }
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_sampler"); }
