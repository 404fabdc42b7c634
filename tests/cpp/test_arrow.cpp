// The Arrow sources without Python: arrays built by hand through the C data interface (offsets,
// validity, dictionaries, fixed-size lists, string and list views, bit-packed list items, lists
// of lists of a declared shape), ArrowSource against a reference computed here, and
// RowGroupSource's cache of decoded groups filled from several threads at once (a small budget,
// so that groups are decoded, evicted and decoded again while others gather from them).
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>

#include "core/arrow_source.h"
#include "core/mix_source.h"
#include "core/row_group_source.h"
#include "core/sampler.h"
#include "harness.h"

using namespace fastload;

namespace {

std::atomic<int64_t> g_live{0};  // arrays and schemas not yet released

// A schema node owning its strings and children; released (deleted) from the root.
struct SchemaNode {
  std::string format, name;
  std::vector<std::unique_ptr<SchemaNode>> kids;
  std::vector<ArrowSchema*> kid_ptrs;
  ArrowSchema s{};
};
// The release callback of a root handed out by adopt(): deletes its node tree.
template <typename Node, typename C>
void release_tree(C* c) {
  delete static_cast<Node*>(c->private_data);
  c->release = nullptr;
  --g_live;
}
// The C struct of a root node (an ArrowSchema or ArrowArray, the node's member `c`), owning the
// node and everything under it until released.
template <typename Node, typename C>
C adopt(std::unique_ptr<Node> root, C Node::*c) {
  Node* n = root.release();
  C out = n->*c;
  out.private_data = n;
  out.release = release_tree<Node, C>;
  ++g_live;
  return out;
}

std::unique_ptr<SchemaNode> field(const std::string& format, const std::string& name,
                                  std::vector<std::unique_ptr<SchemaNode>> kids = {}) {
  auto n = std::make_unique<SchemaNode>();
  n->format = format, n->name = name, n->kids = std::move(kids);
  for (auto& k : n->kids) n->kid_ptrs.push_back(&k->s);
  n->s.format = n->format.c_str();
  n->s.name = n->name.c_str();
  n->s.n_children = static_cast<int64_t>(n->kids.size());
  n->s.children = n->kid_ptrs.data();
  return n;
}
ArrowSchema root_schema(std::unique_ptr<SchemaNode> root) { return adopt(std::move(root), &SchemaNode::s); }

// An array node owning its buffers and children.
struct ArrayNode {
  std::vector<std::vector<std::byte>> data;
  std::vector<const void*> bufs;
  std::vector<std::unique_ptr<ArrayNode>> kids;
  std::vector<ArrowArray*> kid_ptrs;
  ArrowArray a{};
};
template <typename T>
std::vector<std::byte> bytes_of(const std::vector<T>& v) {
  std::vector<std::byte> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}
// buffers: empty vector = a null buffer.
std::unique_ptr<ArrayNode> node(int64_t length, int64_t null_count, int64_t offset,
                                std::vector<std::vector<std::byte>> buffers,
                                std::vector<std::unique_ptr<ArrayNode>> kids = {}) {
  auto n = std::make_unique<ArrayNode>();
  n->data = std::move(buffers);
  for (auto& b : n->data) n->bufs.push_back(b.empty() ? nullptr : b.data());
  n->kids = std::move(kids);
  for (auto& k : n->kids) n->kid_ptrs.push_back(&k->a);
  n->a.length = length, n->a.null_count = null_count, n->a.offset = offset;
  n->a.n_buffers = static_cast<int64_t>(n->bufs.size());
  n->a.buffers = n->bufs.data();
  n->a.n_children = static_cast<int64_t>(n->kids.size());
  n->a.children = n->kid_ptrs.data();
  return n;
}
ArrowArray root_array(std::unique_ptr<ArrayNode> root) { return adopt(std::move(root), &ArrayNode::a); }

// A record batch of `rows` rows starting at global row `start`: id int64 (= global row), tokens
// list<int32> (row r: r % 5 items, item k = r * 10 + k), flag bool (r % 3 == 0), maybe int32
// null where r % 4 == 1, else r. Sliced by `offset` at the record batch level.
std::shared_ptr<ArrowTable> batch_table(int64_t start, int64_t rows, int64_t offset = 0) {
  const int64_t n = rows + offset;
  std::vector<int64_t> id(n);
  std::vector<int32_t> offs{0}, items;
  std::vector<uint8_t> flags((n + 7) / 8, 0), valid((n + 7) / 8, 0);
  std::vector<int32_t> maybe(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = start + i - offset;
    id[i] = r;
    for (int64_t k = 0; k < (r % 5 + 5) % 5; ++k) items.push_back(static_cast<int32_t>(r * 10 + k));
    offs.push_back(static_cast<int32_t>(items.size()));
    if (r % 3 == 0) flags[i / 8] |= uint8_t(1u << (i % 8));
    if (r % 4 != 1) valid[i / 8] |= uint8_t(1u << (i % 8));
    maybe[i] = static_cast<int32_t>(r);
  }
  std::vector<std::unique_ptr<ArrayNode>> cols;
  cols.push_back(node(n, 0, 0, {{}, bytes_of(id)}));
  std::vector<std::unique_ptr<ArrayNode>> values;
  values.push_back(node(static_cast<int64_t>(items.size()), 0, 0, {{}, bytes_of(items)}));
  cols.push_back(node(n, 0, 0, {{}, bytes_of(offs)}, std::move(values)));
  cols.push_back(node(n, 0, 0, {{}, bytes_of(flags)}));
  cols.push_back(node(n, -1, 0, {bytes_of(valid), bytes_of(maybe)}));
  ArrowArray batch = root_array(node(rows, 0, offset, {{}}, std::move(cols)));
  std::vector<std::unique_ptr<SchemaNode>> fields;
  fields.push_back(field("l", "id"));
  std::vector<std::unique_ptr<SchemaNode>> item;
  item.push_back(field("i", "item"));
  fields.push_back(field("+l", "tokens", std::move(item)));
  fields.push_back(field("b", "flag"));
  fields.push_back(field("i", "maybe"));
  ArrowSchema schema = root_schema(field("+s", "", std::move(fields)));
  std::vector<ArrowArray*> batches{&batch};
  return std::make_shared<ArrowTable>(&schema, batches);
}

std::vector<ArrowColumnRequest> requests(int64_t max_items) {
  ArrowColumnRequest id, tokens, flag, maybe;
  id.name = "id", tokens.name = "tokens", flag.name = "flag", maybe.name = "maybe";
  id.pad = flag.pad = maybe.pad = {std::byte{0}};
  tokens.max_items = max_items;
  tokens.pad = std::vector<std::byte>(4, std::byte{0xff});  // -1 as int32
  maybe.fill = true;
  maybe.with_valid = true;
  const int32_t minus7 = -7;
  maybe.fill_value = bytes_of(std::vector<int32_t>{minus7});
  return {id, tokens, flag, maybe};
}

// Fills a batch of `ids` and checks every part against the rule the tables were built with.
void fill_and_check(BatchSource& src, const std::vector<int64_t>& ids, int64_t max_items, int thread = 0,
                    const BatchPlan* plan = nullptr, int64_t step = 0) {
  const int64_t n = static_cast<int64_t>(ids.size());
  std::vector<int64_t> id(n), lengths(n);
  std::vector<int32_t> tokens(n * max_items), maybe(n);
  std::vector<uint8_t> flag(n), valid(n);
  std::byte* parts[] = {reinterpret_cast<std::byte*>(id.data()), reinterpret_cast<std::byte*>(tokens.data()),
                        reinterpret_cast<std::byte*>(lengths.data()), reinterpret_cast<std::byte*>(flag.data()),
                        reinterpret_cast<std::byte*>(maybe.data()), reinterpret_cast<std::byte*>(valid.data())};
  CHECK(src.schema().size() == 6u);
  FillRequest r;
  r.ids = ids.data(), r.count = n, r.parts = parts, r.thread = thread, r.plan = plan, r.step = step;
  src.fill(r);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = ids[i];
    CHECK(id[i] == g);
    const int64_t k = std::min<int64_t>(g % 5, max_items);
    CHECK(lengths[i] == k);
    for (int64_t j = 0; j < max_items; ++j) CHECK(tokens[i * max_items + j] == (j < k ? g * 10 + j : -1));
    CHECK(flag[i] == (g % 3 == 0 ? 1 : 0));
    CHECK(valid[i] == (g % 4 != 1 ? 1 : 0));
    CHECK(maybe[i] == (g % 4 != 1 ? g : -7));
  }
}

// Every batch of `plan`, filled and checked by `threads` threads taking the steps in turn, each
// naming the plan and its step (so that a source reading the plan ahead does).
void fill_epoch_from_threads(BatchSource& src, const EpochPlan& plan, int threads) {
  std::atomic<int64_t> next{0};
  std::vector<std::thread> running;
  for (int t = 0; t < threads; ++t)
    running.emplace_back([&, t] {
      for (int64_t step; (step = next++) < plan.num_batches();) {
        std::vector<int64_t> ids(static_cast<size_t>(plan.rows(step)));
        BatchRows rows;
        rows.ids = ids.data();
        plan.fill(step, rows);
        fill_and_check(src, ids, 3, t, &plan, step);
      }
    });
  for (auto& th : running) th.join();
}

// Group g decoded: rows [g * rows, (g + 1) * rows), sliced by g % slices; each holds "1000
// bytes"; `calls` counts the decodes.
// The decode function shares its counter: a decode thread may still run it after the test's
// scope has let the source go (the thread holds the source until its decode ends), so a counter
// on the test's stack would be written after it is gone.
using Counter = std::shared_ptr<std::atomic<int64_t>>;
Counter counter() { return std::make_shared<std::atomic<int64_t>>(0); }

// A decode thread may still be inside a decode that an epoch's fills no longer wait for (its
// call counted, its decode not yet): counts are compared once the decode threads settle.
bool settles_to(const std::function<bool()>& equal) {
  for (int i = 0; i < 500; ++i) {
    if (equal()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return equal();
}

RowGroupSource::Decode counting_decode(Counter calls, int64_t rows, int64_t slices) {
  return [calls, rows, slices](int64_t g, int64_t* bytes) {
    ++*calls;
    *bytes = 1000;
    return batch_table(g * rows, rows, g % slices);
  };
}

}  // namespace

TEST_CASE(arrow_source_gathers_lists_bits_and_filled_nulls_from_sliced_batches) {
  {
    auto t = batch_table(0, 300, /*offset=*/7);
    CHECK(t->rows() == 300);
    CHECK(t->column("maybe").first_null == 1);
    ArrowSource src(t, requests(3));
    std::vector<int64_t> ids(300);
    std::iota(ids.begin(), ids.end(), 0);
    std::reverse(ids.begin(), ids.end());
    fill_and_check(src, ids, 3);
    // Nulls without a fill are refused, naming the column and row.
    auto reqs = requests(3);
    reqs[3].fill = false;
    bool refused = false;
    try {
      ArrowSource bad(t, reqs);
    } catch (const std::invalid_argument& e) {
      refused = std::strstr(e.what(), "'maybe' holds nulls (the first at row 1)") != nullptr;
    }
    CHECK(refused);
  }
  CHECK(g_live.load() == 0);  // every array and schema released with its table
}

// A record batch of 4 rows (sliced by 1 at the record batch level) of the layouts added for issue
// 33: sv string_view (row r: "r" inline, or 20 letters out of line in a variadic buffer), lv
// list_view<int32> (row r: r items from r, offsets out of order), lb list<bool> (row r: r bits
// starting at an odd bit), ll list<list<int32>> of declared shape (2, 2) (row `bad_row` holds an
// inner list of 3).
std::shared_ptr<ArrowTable> view_table(int bad_row) {
  const int64_t n = 5;  // row 0 is sliced away
  std::string long_data;
  std::vector<std::byte> views(16 * n);
  for (int64_t i = 0; i < n; ++i) {
    std::byte* v = views.data() + 16 * i;
    if (i % 2) {
      const int32_t len = 20, buffer = 0, offset = static_cast<int32_t>(long_data.size());
      long_data += std::string(20, static_cast<char>('a' + i));
      std::memcpy(v, &len, 4), std::memcpy(v + 4, long_data.data() + offset, 4);
      std::memcpy(v + 8, &buffer, 4), std::memcpy(v + 12, &offset, 4);
    } else {
      const int32_t len = 1;
      std::memcpy(v, &len, 4);
      v[4] = static_cast<std::byte>('0' + i);
    }
  }
  std::vector<std::byte> data(long_data.size());
  std::memcpy(data.data(), long_data.data(), long_data.size());
  std::vector<int32_t> lv_offsets, lv_sizes, lv_items(40);
  std::iota(lv_items.begin(), lv_items.end(), 0);
  for (int64_t i = 0; i < n; ++i) lv_offsets.push_back(static_cast<int32_t>(30 - 5 * i)), lv_sizes.push_back(static_cast<int32_t>(i));
  // lb: row i holds i bits; bit k of row i is (i + k) % 2; the child starts at bit 3.
  std::vector<int32_t> lb_offsets{0};
  std::vector<uint8_t> bits(8, 0);
  int64_t at = 3;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t k = 0; k < i; ++k, ++at)
      if ((i + k) % 2) bits[at / 8] |= uint8_t(1u << (at % 8));
    lb_offsets.push_back(static_cast<int32_t>(at - 3));
  }
  // ll: row i is [[4i, 4i+1], [4i+2, 4i+3]], except bad_row: [[..], [.., .., extra]].
  std::vector<int32_t> outer{0}, inner{0}, values;
  for (int64_t i = 0; i < n; ++i) {
    for (int k = 0; k < 2; ++k) {
      const int width = (i == bad_row && k == 1) ? 3 : 2;
      for (int j = 0; j < width; ++j) values.push_back(static_cast<int32_t>(4 * i + 2 * k + j));
      inner.push_back(static_cast<int32_t>(values.size()));
    }
    outer.push_back(static_cast<int32_t>(inner.size() - 1));
  }
  std::vector<std::unique_ptr<ArrayNode>> cols;
  const int64_t sizes[] = {static_cast<int64_t>(data.size())};
  cols.push_back(node(n, 0, 0, {{}, views, data, bytes_of(std::vector<int64_t>(sizes, sizes + 1))}));
  std::vector<std::unique_ptr<ArrayNode>> lv_child;
  lv_child.push_back(node(40, 0, 0, {{}, bytes_of(lv_items)}));
  cols.push_back(node(n, 0, 0, {{}, bytes_of(lv_offsets), bytes_of(lv_sizes)}, std::move(lv_child)));
  std::vector<std::unique_ptr<ArrayNode>> lb_child;
  lb_child.push_back(node(at - 3, 0, 3, {{}, bytes_of(bits)}));
  cols.push_back(node(n, 0, 0, {{}, bytes_of(lb_offsets)}, std::move(lb_child)));
  std::vector<std::unique_ptr<ArrayNode>> leaf, mid;
  leaf.push_back(node(static_cast<int64_t>(values.size()), 0, 0, {{}, bytes_of(values)}));
  mid.push_back(node(static_cast<int64_t>(inner.size() - 1), 0, 0, {{}, bytes_of(inner)}, std::move(leaf)));
  cols.push_back(node(n, 0, 0, {{}, bytes_of(outer)}, std::move(mid)));
  ArrowArray batch = root_array(node(n - 1, 0, 1, {{}}, std::move(cols)));
  std::vector<std::unique_ptr<SchemaNode>> fields, lv_item, lb_item, ll_item, ll_leaf;
  fields.push_back(field("vu", "sv"));
  lv_item.push_back(field("i", "item"));
  fields.push_back(field("+vl", "lv", std::move(lv_item)));
  lb_item.push_back(field("b", "item"));
  fields.push_back(field("+l", "lb", std::move(lb_item)));
  ll_leaf.push_back(field("i", "item"));
  ll_item.push_back(field("+l", "item", std::move(ll_leaf)));
  fields.push_back(field("+l", "ll", std::move(ll_item)));
  ArrowSchema schema = root_schema(field("+s", "", std::move(fields)));
  std::vector<ArrowArray*> batches{&batch};
  return std::make_shared<ArrowTable>(&schema, batches);
}

std::vector<ArrowColumnRequest> view_requests() {
  ArrowColumnRequest sv, lv, lb, ll;
  sv.name = "sv", lv.name = "lv", lb.name = "lb", ll.name = "ll";
  sv.as_list = true;
  sv.pad = lv.pad = ll.pad = std::vector<std::byte>(4, std::byte{0});
  sv.pad = {std::byte{0}};
  lb.pad = {std::byte{0}};
  lv.max_items = 4, lb.max_items = 4;
  ll.list_shape = {2, 2};
  return {sv, lv, lb, ll};
}

TEST_CASE(arrow_source_gathers_views_bool_lists_and_declared_shapes) {
  {
    auto t = view_table(/*bad_row=*/-1);
    ArrowSource src(t, view_requests());
    CHECK(src.schema().size() == 5u);  // lv, lv_lengths, lb, lb_lengths, ll (sv is a list of values)
    const std::vector<int64_t> ids{3, 0, 2, 1};
    std::vector<int32_t> lv(4 * 4), ll(4 * 4);
    std::vector<int64_t> lv_len(4), lb_len(4);
    std::vector<uint8_t> lb(4 * 4);
    std::byte* parts[] = {reinterpret_cast<std::byte*>(lv.data()), reinterpret_cast<std::byte*>(lv_len.data()),
                          reinterpret_cast<std::byte*>(lb.data()), reinterpret_cast<std::byte*>(lb_len.data()),
                          reinterpret_cast<std::byte*>(ll.data())};
    std::shared_ptr<void> extras;
    FillRequest r;
    r.ids = ids.data(), r.count = 4, r.parts = parts, r.extras = &extras;
    src.fill(r);
    const auto* lists = static_cast<const ArrowStringLists*>(extras.get());
    CHECK(lists && lists->names.size() == 1u);
    for (int64_t i = 0; i < 4; ++i) {
      const int64_t row = ids[i] + 1;  // the record batch's offset of 1
      const std::string want = row % 2 ? std::string(20, static_cast<char>('a' + row)) : std::string(1, '0' + static_cast<char>(row));
      const auto& o = lists->offsets[0];
      CHECK(std::string(lists->bytes[0].data() + o[i], static_cast<size_t>(o[i + 1] - o[i])) == want);
      CHECK(lv_len[i] == std::min<int64_t>(row, 4));
      for (int64_t k = 0; k < 4; ++k) CHECK(lv[i * 4 + k] == (k < std::min<int64_t>(row, 4) ? 30 - 5 * row + k : 0));
      CHECK(lb_len[i] == std::min<int64_t>(row, 4));
      for (int64_t k = 0; k < 4; ++k) CHECK(lb[i * 4 + k] == (k < std::min<int64_t>(row, 4) ? (row + k) % 2 : 0));
      for (int64_t k = 0; k < 4; ++k) CHECK(ll[i * 4 + k] == 4 * row + k);
    }
  }
  {
    // A row of another shape than declared is an error naming the column and the row.
    ArrowSource src(view_table(/*bad_row=*/3), view_requests());
    const std::vector<int64_t> ids{0, 2};  // row 3 of the data, past the slice's offset of 1
    std::vector<std::byte> buf(256);
    std::byte* parts[] = {buf.data(), buf.data(), buf.data(), buf.data(), buf.data()};
    std::shared_ptr<void> extras;
    FillRequest r;
    r.ids = ids.data(), r.count = 2, r.parts = parts, r.extras = &extras;
    bool named = false;
    try {
      src.fill(r);
    } catch (const std::invalid_argument& e) {
      named = std::strstr(e.what(), "'ll': row 2 does not have the declared shape (2, 2)") != nullptr;
    }
    CHECK(named);
  }
  CHECK(g_live.load() == 0);
}

TEST_CASE(row_group_cache_decodes_evicts_and_gathers_from_threads) {
  {
    constexpr int64_t kGroups = 24, kRows = 50;
    const Counter decoding = counter();
    // A budget of 3 groups: most are evicted and decoded again.
    RowGroupSource src(batch_table(0, 1), requests(4), std::vector<int64_t>(kGroups, kRows),
                       std::vector<std::string>(kGroups, "group"), counting_decode(decoding, kRows, 3), 3000, 1);
    std::vector<std::thread> threads;
    std::atomic<int> done{0};
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        uint64_t x = 0x9e3779b97f4a7c15ull * (t + 1);
        for (int b = 0; b < 60; ++b) {
          std::vector<int64_t> ids(37);
          for (int64_t& id : ids) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            id = static_cast<int64_t>(x % (kGroups * kRows));
          }
          fill_and_check(src, ids, 4, t);
        }
        ++done;
      });
    for (auto& th : threads) th.join();
    CHECK(done.load() == 4);
    CHECK(src.decodes() == decoding->load());
    CHECK(src.decodes() > kGroups);  // evicted and decoded again
    CHECK(src.cached_bytes() <= 1000 * (1 + 2 * 4));  // the floor: min_groups + 2 per thread
  }
  CHECK(g_live.load() == 0);
}

TEST_CASE(row_group_decode_failure_fails_its_batches_and_no_thread_waits_forever) {
  {
    constexpr int64_t kRows = 20;
    auto schema = batch_table(0, 1);
    RowGroupSource::Decode decode = [&](int64_t g, int64_t* bytes) -> std::shared_ptr<ArrowTable> {
      *bytes = 10;
      if (g == 2) throw std::invalid_argument("group 2 is broken");
      return batch_table(g * kRows, kRows);
    };
    RowGroupSource src(schema, requests(2), std::vector<int64_t>(6, kRows), std::vector<std::string>(6, "group"),
                       decode, 1 << 20, 1);
    std::atomic<int> failed{0}, passed{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t)
      threads.emplace_back([&, t] {
        for (int b = 0; b < 20; ++b) {
          // Every batch needs group 2 and another group, in several orders.
          std::vector<int64_t> ids{(b * 7 + t) % 20 + kRows * ((b + t) % 6), 2 * kRows + b % kRows};
          if (b % 2) std::swap(ids[0], ids[1]);
          try {
            fill_and_check(src, ids, 2, t);
            ++passed;
          } catch (const std::invalid_argument& e) {
            if (std::strstr(e.what(), "group 2 is broken")) ++failed;
          }
        }
        std::vector<int64_t> fine{0, 5 * kRows + 3, kRows + 1};
        fill_and_check(src, fine, 2, t);
      });
    for (auto& th : threads) th.join();
    CHECK(failed.load() == 60);
    CHECK(passed.load() == 0);
  }
  CHECK(g_live.load() == 0);
}

TEST_CASE(row_group_decode_threads_read_the_plan_ahead) {
  {
    constexpr int64_t kGroups = 30, kRows = 40;
    const Counter decoding = counter();
    // A budget of 8 groups (4 may wait decoded ahead), windows of 4, 2 decode threads.
    auto src = std::make_shared<RowGroupSource>(batch_table(0, 1), requests(3), std::vector<int64_t>(kGroups, kRows),
                                                std::vector<std::string>(kGroups, "group"),
                                                counting_decode(decoding, kRows, 2), 8000, 4, 2);
    CHECK(src->decode_threads() == 2);
    SamplerConfig cfg;
    cfg.num_samples = kGroups * kRows, cfg.batch_size = 16, cfg.shuffle = true, cfg.order = Order::Block;
    cfg.shard_rows = std::vector<int64_t>(kGroups, kRows), cfg.seed = 7;
    cfg.block_size = 4 * kRows;  // windows of 4 groups (min_groups)
    for (int64_t epoch = 0; epoch < 2; ++epoch) fill_epoch_from_threads(*src, EpochPlan(cfg, epoch, 0), 3);
    CHECK(settles_to([&] { return src->decodes() == decoding->load(); }));
    CHECK(src->decoded_ahead() <= src->decodes());
    CHECK(src->decodes() <= 2 * (kGroups + 10));  // block order: about once per group and epoch
    // The last owner may go while a decode thread decodes: that thread lets the source go.
    std::vector<int64_t> ids{0, 5 * kRows};
    const EpochPlan plan(cfg, 5, 0);
    fill_and_check(*src, ids, 3, 0, &plan, 0);
    src.reset();
  }
  for (int i = 0; i < 500 && g_live.load() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(g_live.load() == 0);
}

TEST_CASE(row_group_decode_threads_read_ahead_inside_a_mixture) {
  // Two row-group sources in one MixSource, filled from 3 threads through the mixture's plan: each
  // reads its own view of the plan (its rows as its own ids) ahead, so both decode ahead, and
  // every batch holds the rows it names.
  {
    constexpr int64_t kGroups = 20, kRows = 40;
    const Counter first_calls = counter(), second_calls = counter();
    auto first = std::make_shared<RowGroupSource>(batch_table(0, 1), requests(3), std::vector<int64_t>(kGroups, kRows),
                                                  std::vector<std::string>(kGroups, "group"),
                                                  counting_decode(first_calls, kRows, 2), 8000, 4, 2);
    // The second source's rows hold the mixture's ids: its group g is the rows of group kGroups + g.
    RowGroupSource::Decode shifted = [second_calls](int64_t g, int64_t* bytes) {
      ++*second_calls;
      *bytes = 1000;
      return batch_table((kGroups + g) * kRows, kRows, g % 2);
    };
    auto second = std::make_shared<RowGroupSource>(batch_table(0, 1), requests(3), std::vector<int64_t>(kGroups, kRows),
                                                   std::vector<std::string>(kGroups, "group"), shifted, 8000, 4, 2);
    MixSource mix({first, second});
    SamplerConfig cfg;
    cfg.num_samples = 2 * kGroups * kRows, cfg.batch_size = 16, cfg.shuffle = true, cfg.order = Order::Block;
    cfg.shard_rows = std::vector<int64_t>(2 * kGroups, kRows), cfg.seed = 3;
    cfg.block_size = 4 * kRows;
    for (int64_t epoch = 0; epoch < 2; ++epoch) fill_epoch_from_threads(mix, EpochPlan(cfg, epoch, 0), 3);
    CHECK(first->decoded_ahead() > 0 && second->decoded_ahead() > 0);
    CHECK(settles_to([&] {
      return first->decodes() == first_calls->load() && second->decodes() == second_calls->load();
    }));
  }
  for (int i = 0; i < 500 && g_live.load() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(g_live.load() == 0);
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_arrow"); }
