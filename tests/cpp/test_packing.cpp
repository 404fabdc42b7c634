// Tests of packing (core/packing_plan.h, pack_epoch.h, pack_plan.h, pack_source.h): the window
// rule by hand, its invariants on random windows (a reused scratch included), an epoch's plan
// the same for any number of planning threads, packed batches built by several collation threads
// at once (the window and epoch caches under ThreadSanitizer), streams across epochs, and the
// error for columns of unequal lengths.
// Built and run under ThreadSanitizer and AddressSanitizer + UBSan by tests/cpp/run_sanitizers.sh.
#include <map>
#include <random>
#include <thread>

#include "core/engine.h"
#include "core/pack_plan.h"
#include "core/pack_source.h"
#include "core_fixtures.h"

namespace {

// Documents whose token t of document d is d * 1000 + t, as a one-shard ragged int32 column.
struct Docs {
  std::vector<int32_t> values;
  std::vector<int64_t> offsets{0};
  std::vector<int64_t> lengths;
  Docs(const std::vector<int64_t>& lens) : lengths(lens) {
    for (size_t d = 0; d < lens.size(); ++d) {
      for (int64_t t = 0; t < lens[d]; ++t) values.push_back(static_cast<int32_t>(d * 1000 + t));
      offsets.push_back(static_cast<int64_t>(values.size()));
    }
  }
  ArrayColumn column(const char* name) const {
    ArrayColumn c;
    c.name = name;
    c.dtype = DType{kInt, 32};
    const int64_t longest = std::max<int64_t>(1, *std::max_element(lengths.begin(), lengths.end()));
    c.row_shape = {longest};
    c.ragged = true;
    c.item_bytes = 4;
    c.row_bytes = longest * 4;
    c.pad = {std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}};
    Shard s;
    s.base = reinterpret_cast<const std::byte*>(values.data());
    s.rows = static_cast<int64_t>(lengths.size());
    s.pitch = 4;
    s.offsets = offsets.data();
    s.items = static_cast<int64_t>(values.size());
    set_shards(c, {s});
    return c;
  }
};

std::vector<int64_t> random_lengths(std::mt19937_64& rng, int64_t n, int64_t longest, int64_t zero_every = 13) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (auto& x : out) x = rng() % static_cast<uint64_t>(zero_every) == 0 ? 0 : 1 + static_cast<int64_t>(rng() % longest);
  return out;
}

PackOptions options(int64_t length, PackSplit split = PackSplit::Truncate, int64_t max_segments = 0) {
  PackOptions o;
  o.length = length;
  o.split = split;
  o.max_segments = max_segments;
  return o;
}

SamplerConfig order_of(int64_t docs, uint64_t seed, bool shuffle = true) {
  return SamplerConfig(docs, 1, 1, 0, seed, shuffle, Order::Random, Even::Pad, false, 4096);
}

std::string rows_text(const PackedWindow& w) {
  std::ostringstream s;
  for (int64_t r = 0; r < w.rows; ++r) {
    s << "[";
    for (int64_t k = w.row_start[static_cast<size_t>(r)]; k < w.row_start[static_cast<size_t>(r) + 1]; ++k) {
      const PackSegment& g = w.segments[static_cast<size_t>(k)];
      s << "(" << g.doc << "," << g.start << "," << g.count << ")";
    }
    s << "]";
  }
  return s.str();
}

}  // namespace

TEST_CASE(window_rule_by_hand) {
  PackScratch scratch;
  PackedWindow w;
  const std::vector<int64_t> docs{10, 11, 12, 13, 14}, lens{5, 3, 6, 2, 4};
  pack_window(docs.data(), lens.data(), 5, options(8), false, scratch, w);
  CHECK_MSG(rows_text(w) == "[(10,0,5)(11,0,3)][(12,0,6)(13,0,2)][(14,0,4)]", rows_text(w));
  const std::vector<int64_t> one{1}, nineteen{19};
  pack_window(one.data(), nineteen.data(), 1, options(8, PackSplit::Split), false, scratch, w);
  CHECK_MSG(rows_text(w) == "[(1,0,8)][(1,8,8)][(1,16,3)]", rows_text(w));
  pack_window(one.data(), nineteen.data(), 1, options(8), false, scratch, w);
  CHECK(rows_text(w) == "[(1,0,8)]" && w.truncated == 11 && w.tokens == 8);
  const std::vector<int64_t> two{1, 2}, threes{3, 3};
  pack_window(two.data(), threes.data(), 2, options(8, PackSplit::Truncate, 1), false, scratch, w);
  CHECK(rows_text(w) == "[(1,0,3)][(2,0,3)]");
  CHECK_THROWS(pack_window(one.data(), nineteen.data(), 1, options(8, PackSplit::Error), false, scratch, w),
               std::invalid_argument, "document 1 has 19 tokens, more than length=8");
}

TEST_CASE(window_invariants_on_random_windows_with_a_reused_scratch) {
  std::mt19937_64 rng(3);
  PackScratch reused;
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t length = 1 + static_cast<int64_t>(rng() % 300);
    const int64_t n = static_cast<int64_t>(rng() % 200);
    const PackSplit split = trial % 3 == 0 ? PackSplit::Split : PackSplit::Truncate;
    const int64_t max_segments = trial % 4 == 0 ? 1 + static_cast<int64_t>(rng() % 5) : 0;
    const PackOptions o = options(length, split, max_segments);
    std::vector<int64_t> docs(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) docs[static_cast<size_t>(i)] = 100 + i;
    const std::vector<int64_t> lens = random_lengths(rng, n, 2 * length);
    PackedWindow laid, fresh, counted;
    PackScratch new_scratch;
    pack_window(docs.data(), lens.data(), n, o, false, reused, laid);
    pack_window(docs.data(), lens.data(), n, o, false, new_scratch, fresh);
    pack_window(docs.data(), lens.data(), n, o, true, reused, counted);
    CHECK_MSG(rows_text(laid) == rows_text(fresh), "trial " << trial);  // the reused scratch was left clean
    CHECK(counted.rows == laid.rows && counted.tokens == laid.tokens && counted.row_start.empty());
    std::map<int64_t, int64_t> placed;
    std::pair<int64_t, int64_t> last_first{-1, -1};
    for (int64_t r = 0; r < laid.rows; ++r) {
      const int64_t a = laid.row_start[static_cast<size_t>(r)], b = laid.row_start[static_cast<size_t>(r) + 1];
      int64_t tokens = 0;
      CHECK(b > a && (max_segments == 0 || b - a <= max_segments));
      // Rows by their first segment (document, then start: a split document's pieces in order).
      const std::pair<int64_t, int64_t> first{laid.segments[static_cast<size_t>(a)].doc,
                                              laid.segments[static_cast<size_t>(a)].start};
      CHECK(first > last_first);
      last_first = first;
      for (int64_t k = a; k < b; ++k) {
        const PackSegment& g = laid.segments[static_cast<size_t>(k)];
        tokens += g.count;
        placed[g.doc] += g.count;
        CHECK(g.doc_length == lens[static_cast<size_t>(g.doc - 100)]);
        if (k > a) CHECK(g.doc > laid.segments[static_cast<size_t>(k) - 1].doc);  // window order in a row
      }
      CHECK(tokens <= length);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t want = split == PackSplit::Split ? lens[static_cast<size_t>(i)]
                                                     : std::min(lens[static_cast<size_t>(i)], length);
      CHECK_MSG(placed[100 + i] == want, "trial " << trial << " document " << i);
    }
  }
}

TEST_CASE(epoch_plan_is_the_same_for_any_number_of_planning_threads) {
  std::mt19937_64 rng(5);
  const Docs docs(random_lengths(rng, 20000, 90));
  auto reader = std::make_shared<RaggedDocuments>(std::vector<ArrayColumn>{docs.column("ids")});
  const EpochPacking one(reader, options(128), 300, order_of(20000, 9), 4, 1);
  for (int threads : {2, 4, 7}) {
    const EpochPacking many(reader, options(128), 300, order_of(20000, 9), 4, threads);
    CHECK(many.rows() == one.rows() && many.num_windows() == one.num_windows());
    CHECK(many.totals().tokens == one.totals().tokens && many.totals().empty == one.totals().empty);
    for (int64_t w = 0; w <= one.num_windows(); w += 7) CHECK(many.first_row(w) == one.first_row(w));
  }
  const EpochPacking other(reader, options(128), 300, order_of(20000, 9), 5, 2);
  CHECK(other.totals().tokens == one.totals().tokens);  // every epoch places the same tokens
  for (int64_t row : {int64_t{0}, one.rows() / 2, one.rows() - 1}) {
    const auto [w, k] = one.locate(row);
    CHECK(one.first_row(w) + k == row && k < one.first_row(w + 1) - one.first_row(w));
  }
  CHECK_THROWS(one.locate(one.rows()), std::out_of_range, "out of range");
}

namespace {
// Every batch of every output: rows hold whole documents' tokens in order, the parts agree.
void check_batches(Pipeline& p, int outputs, int64_t length, std::map<int64_t, int64_t>* seen) {
  for (int o = 0; o < outputs; ++o) {
    for (;;) {
      Batch b;
      const NextStatus s = next_blocking(p, o, &b);
      if (s == NextStatus::End) break;
      CHECK(s == NextStatus::Ok);
      if (s != NextStatus::Ok) return;
      hand_out(b);
      const auto* ids = reinterpret_cast<const int32_t*>(b.parts[0]->data());
      const auto* seg = reinterpret_cast<const int32_t*>(b.parts[1]->data());
      const auto* pos = reinterpret_cast<const int64_t*>(b.parts[2]->data());
      const auto* cu = reinterpret_cast<const int32_t*>(b.parts[3]->data());
      const auto* info = static_cast<const PackedBatchInfo*>(b.extras.get());
      CHECK(info != nullptr);
      if (!info) return;
      int64_t e = 0;
      CHECK(cu[e++] == 0);
      int64_t total = 0;
      for (int64_t r = 0; r < b.rows; ++r) {
        for (int64_t t = 0; t < length;) {
          int64_t end = t;
          while (end < length && seg[r * length + end] == seg[r * length + t]) ++end;
          total += end - t;
          CHECK(cu[e++] == total);
          for (int64_t k = t; k < end; ++k) CHECK(pos[r * length + k] == k - t);
          if (seg[r * length + t] > 0) {
            const int64_t doc = ids[r * length + t] / 1000, first = ids[r * length + t] % 1000;
            (*seen)[doc] += end - t;
            for (int64_t k = t; k < end; ++k) CHECK(ids[r * length + k] == doc * 1000 + first + (k - t));
          } else {
            CHECK(end == length);  // padding only at the row's end
          }
          t = end;
        }
      }
      CHECK(e == info->cu_entries);
    }
  }
}
}  // namespace

TEST_CASE(packed_batches_from_several_threads_and_ranks) {
  std::mt19937_64 rng(8);
  const Docs docs(random_lengths(rng, 3000, 60));
  auto reader = std::make_shared<RaggedDocuments>(std::vector<ArrayColumn>{docs.column("ids")});
  auto source = std::make_shared<PackSource>(reader, options(96), 0, std::vector<std::vector<std::byte>>{{std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}}}, false, 2);
  EngineOptions o;
  o.num_threads = 3;
  o.prefetch = 4;
  o.batch_size = 5;
  Engine engine(source, o);
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    const SamplerConfig order = order_of(3000, 21);
    auto packing = source->epoch(order, epoch, 2);
    CHECK(packing.get() == source->epoch(order, epoch, 1).get());  // cached
    std::vector<OutputSpec> outputs;
    for (int64_t rank = 0; rank < 2; ++rank)
      outputs.emplace_back(std::make_shared<PackEpochPlan>(
          packing, SamplerConfig(1, 5, 2, rank, 21, false, Order::Random, Even::Pad, false, 4096), 0));
    auto p = engine.start(std::move(outputs));
    std::map<int64_t, int64_t> seen;
    check_batches(*p, 2, 96, &seen);
    for (size_t d = 0; d < docs.lengths.size(); ++d)
      CHECK_MSG(seen[static_cast<int64_t>(d)] == std::min<int64_t>(docs.lengths[d], 96), "epoch " << epoch << " doc " << d);
  }
  engine.close();
}

TEST_CASE(stream_of_packed_rows_crosses_epochs) {
  std::mt19937_64 rng(2);
  const Docs docs(random_lengths(rng, 500, 40));
  auto reader = std::make_shared<RaggedDocuments>(std::vector<ArrayColumn>{docs.column("ids")});
  auto source = std::make_shared<PackSource>(reader, options(64), 100, std::vector<std::vector<std::byte>>{{std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}}}, false, 1);
  const SamplerConfig order = order_of(500, 4);
  auto epochs = std::make_shared<PackEpochs>([&](int64_t e) { return source->epoch(order, e, 2); }, 0, 0);
  const int64_t rows0 = source->epoch(order, 0, 1)->rows();
  const auto [e1, start1] = epochs->epoch_at(rows0 + 3);
  CHECK(e1 == 1 && start1 == rows0);
  PackAnchor anchor;
  PackStreamPlan plan(epochs, anchor, 4, 2, 1, rows0 / 8 - 1, rows0 / 8 + 3, 0, 4);
  std::vector<int64_t> ids(4);
  BatchRows out;
  out.ids = ids.data();
  for (int64_t b = 0; b < plan.num_batches(); ++b) {
    plan.fill(b, out);
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t position = (rows0 / 8 - 1 + b) * 8 + 4 + i;
      CHECK(ids[static_cast<size_t>(i)] == position);
      const PackedRowRef ref = plan.locate(position);
      CHECK(ref.packing->epoch() == (position < rows0 ? 0 : 1));
      CHECK(ref.row == (position < rows0 ? position : position - rows0));
    }
  }
}

TEST_CASE(an_epoch_planned_ahead_is_planned_once_and_shared) {
  std::mt19937_64 rng(6);
  const Docs docs(random_lengths(rng, 40000, 50));
  auto reader = std::make_shared<RaggedDocuments>(std::vector<ArrayColumn>{docs.column("ids")});
  for (int trial = 0; trial < 3; ++trial) {
    auto source = std::make_shared<PackSource>(reader, options(64), 0, std::vector<std::vector<std::byte>>{{std::byte{0}, std::byte{0}, std::byte{0}, std::byte{0}}}, false, 1);
    const SamplerConfig order = order_of(40000, 11);
    source->plan_ahead(order, 1, 1);
    source->plan_ahead(order, 1, 1);  // already being planned: nothing more
    std::vector<std::shared_ptr<const EpochPacking>> got(4);
    std::vector<std::thread> askers;
    for (size_t k = 0; k < got.size(); ++k) askers.emplace_back([&, k] { got[k] = source->epoch(order, 1, 2); });
    for (std::thread& t : askers) t.join();
    for (const auto& g : got) CHECK(g.get() == got[0].get());  // one plan, whoever made it
    const EpochPacking fresh(reader, options(64), source->scan().window, order, 1, 1);
    CHECK(got[0]->rows() == fresh.rows());
    source->plan_ahead(order, 2, 1);  // and one still running when the source goes: joined
  }
}

TEST_CASE(unequal_column_lengths_fail_the_batch_naming_the_document) {
  const Docs a({3, 2, 4}), b({3, 5, 4});
  auto reader = std::make_shared<RaggedDocuments>(std::vector<ArrayColumn>{a.column("a"), b.column("b")});
  std::vector<std::vector<std::byte>> pads(2, std::vector<std::byte>(4, std::byte{0}));
  CHECK_THROWS(PackSource(reader, options(8), 0, pads, false, 1), std::invalid_argument,
               "document 1: column 'b' has 5 items and column 'a' 2");
  std::vector<DocumentPiece> pieces{{1, 0, 2, 2, 0}};
  std::vector<int32_t> dst(8);
  CHECK_THROWS(reader->copy(1, pieces.data(), 1, reinterpret_cast<std::byte*>(dst.data())), std::invalid_argument,
               "document 1: column 'b' has 5 items where the first packed column has 2");
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_packing"); }
