// Tests of the C++ core (no Python), meant to run under ThreadSanitizer and under
// AddressSanitizer + UndefinedBehaviorSanitizer: see tests/cpp/run_sanitizers.sh (the harness is
// tests/cpp/harness.h).
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/array_source.h"
#include "core/buffer_pool.h"
#include "core/cpu_cache.h"
#include "core/engine.h"
#include "core/fork_guard.h"
#include "core/gather.h"
#include "core/permutation.h"
#include "core/pipeline.h"
#include "core/sampler.h"
#include "core/thread_pool.h"
#include "harness.h"

using namespace fastload;
using std::chrono::milliseconds;

// ================================================================ helpers

namespace {

SamplerConfig make_cfg(int64_t n, int64_t batch, int64_t world, int64_t rank, bool shuffle,
                       Order order = Order::Random, Even even = Even::Pad, bool drop_last = false,
                       uint64_t seed = 0, int64_t block_size = 4096) {
  SamplerConfig c;
  c.num_samples = n;
  c.batch_size = batch;
  c.world_size = world;
  c.rank = rank;
  c.seed = seed;
  c.shuffle = shuffle;
  c.order = order;
  c.even = even;
  c.drop_last = drop_last;
  c.block_size = block_size;
  return c;
}

const char* even_name(Even e) { return e == Even::Pad ? "pad" : e == Even::Drop ? "drop" : "mask"; }

std::string describe(const SamplerConfig& c) {
  std::ostringstream os;
  os << "N=" << c.num_samples << " B=" << c.batch_size << " W=" << c.world_size
     << " r=" << c.rank << " shuffle=" << c.shuffle
     << " order=" << (c.order == Order::Block ? "block" : "random") << " bs=" << c.block_size
     << " even=" << even_name(c.even) << " drop_last=" << c.drop_last << " seed=" << c.seed;
  return os.str();
}

// Runs fn in a forked child so a crash (or a sanitizer report) there is a failed check here,
// not the end of the test process. Returns the child's exit status (0 = fn returned true).
int run_in_child(const std::function<bool()>& fn) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    bool ok = false;
    try {
      ok = fn();
    } catch (...) {
      ok = false;
    }
    std::fflush(stdout);
    std::_Exit(ok ? 0 : 1);  // no atexit handlers (and no leak check of the parent's state)
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// ---------------------------------------------------------------- in-memory columns

// Columns whose contents are a known function of the row id:
//   "id"     int32, value = id                           (gather_fixed<4>)
//   "wide"   24-byte rows {id, id * K, ~id} as uint64     (gather_any)
//   "tok"    windows over a uint16 token array: row i = tokens[i*3 : i*3+5] (pitch < row_bytes)
//   "byte"   uint8, (id * 13 + 5) & 255                   (gather_fixed<1>)
//   "big"    optional: big_row_bytes per row (slow gathers, to keep workers busy)
struct Source {
  static constexpr int64_t kWinLen = 5, kWinStride = 3;
  int64_t n;
  std::vector<int32_t> ids;
  std::vector<uint64_t> wide;
  std::vector<uint16_t> tokens;
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> big;
  int64_t big_row_bytes = 0;

  explicit Source(int64_t rows, int64_t big_row = 0) : n(rows), big_row_bytes(big_row) {
    ids.resize(n);
    wide.resize(3 * n);
    bytes.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      ids[i] = static_cast<int32_t>(i);
      wide[3 * i] = static_cast<uint64_t>(i);
      wide[3 * i + 1] = static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ULL;
      wide[3 * i + 2] = ~static_cast<uint64_t>(i);
      bytes[i] = static_cast<uint8_t>((i * 13 + 5) & 255);
    }
    tokens.resize(static_cast<size_t>((n - 1) * kWinStride + kWinLen));
    for (size_t t = 0; t < tokens.size(); ++t) tokens[t] = static_cast<uint16_t>(t * 40503u + 7u);
    if (big_row_bytes) {
      big.resize(static_cast<size_t>(n * big_row_bytes));
      for (size_t k = 0; k < big.size(); ++k) big[k] = static_cast<uint8_t>(k * 2654435761u >> 13);
    }
  }

  std::vector<ArrayColumn> specs() const {
    std::vector<ArrayColumn> s;
    auto add = [&](const char* name, const void* base, int64_t pitch, int64_t row_bytes) {
      ArrayColumn c;
      c.name = name;
      c.base = static_cast<const std::byte*>(base);
      c.rows = n;
      c.pitch = pitch;
      c.row_bytes = row_bytes;
      s.push_back(c);
    };
    add("id", ids.data(), 4, 4);
    add("wide", wide.data(), 24, 24);
    add("tok", tokens.data(), kWinStride * 2, kWinLen * 2);
    add("byte", bytes.data(), 1, 1);
    if (big_row_bytes) add("big", big.data(), big_row_bytes, big_row_bytes);
    return s;
  }
};

// Parts a device copy or a DLPack consumer may read need this alignment (issue 6).
constexpr uintptr_t kPartAlign = 256;

// Checks one batch against the plan and the source: step, row count, one buffer per layout part
// (each big enough and 256-byte aligned), the index and valid parts, and every column's rows
// (bytes equal the source row of the expected id; the "id" column is also checked as a value).

// The columns an array source gathers (what the tests compare batches with).
const std::vector<ArrayColumn>& columns_of(const std::shared_ptr<BatchSource>& source) {
  return dynamic_cast<const ArraySource&>(*source).columns();
}

// Returns "" when right, else what is wrong.
std::string batch_error(const std::vector<ArrayColumn>& columns, const BatchLayout& L, const EpochPlan& plan,
                        int64_t step, const Batch& b) {
  std::ostringstream err;
  if (b.parts.size() != L.num_parts()) {
    err << b.parts.size() << " parts where the layout has " << L.num_parts();
    return err.str();
  }
  for (size_t p = 0; p < b.parts.size(); ++p) {
    if (!b.parts[p]) return "a part without a buffer";
    if (b.parts[p]->size() < L.part_bytes(p)) {
      err << "part " << p << ": buffer of " << b.parts[p]->size() << " bytes, layout needs "
          << L.part_bytes(p);
      return err.str();
    }
    if (reinterpret_cast<uintptr_t>(b.parts[p]->data()) % kPartAlign != 0) {
      err << "part " << p << " at " << static_cast<const void*>(b.parts[p]->data())
          << " is not " << kPartAlign << "-byte aligned";
      return err.str();
    }
    for (size_t q = 0; q < p; ++q)
      if (b.parts[q] == b.parts[p] || b.parts[q]->data() == b.parts[p]->data()) {
        err << "parts " << q << " and " << p << " share a buffer";
        return err.str();
      }
  }
  if (b.step != step) {
    err << "step " << b.step << " where " << step << " was expected";
    return err.str();
  }
  const BatchSpan span = plan.batch(step);
  if (b.rows != span.count) {
    err << "step " << step << ": " << b.rows << " rows, expected " << span.count;
    return err.str();
  }
  std::vector<int64_t> ids(static_cast<size_t>(span.count));
  std::unique_ptr<bool[]> valid(new bool[static_cast<size_t>(span.count) + 1]);
  plan.fill_ids(span, ids.data(), valid.get());
  for (int64_t i = 0; i < span.count; ++i) {
    const int64_t id = ids[static_cast<size_t>(i)];
    if (L.with_index) {
      int64_t got;
      std::memcpy(&got, b.parts[L.index_part]->data() + sizeof(int64_t) * static_cast<size_t>(i), 8);
      if (got != id) {
        err << "step " << step << " row " << i << ": index " << got << ", expected " << id;
        return err.str();
      }
    }
    if (L.with_valid) {
      unsigned char got;
      std::memcpy(&got, b.parts[L.valid_part]->data() + static_cast<size_t>(i), 1);
      if (got != (valid[i] ? 1 : 0)) {
        err << "step " << step << " row " << i << ": valid " << int(got) << ", expected "
            << valid[i];
        return err.str();
      }
    }
    for (size_t c = 0; c < columns.size(); ++c) {
      const ArrayColumn& col = columns[c];
      const std::byte* row = b.parts[c]->data() + static_cast<size_t>(i * col.row_bytes);
      if (std::memcmp(row, col.base + id * col.pitch, static_cast<size_t>(col.row_bytes)) != 0) {
        err << "step " << step << " row " << i << " (id " << id << "): column " << col.name
            << " differs from the source row";
        return err.str();
      }
      if (col.name == "id") {
        int32_t v;
        std::memcpy(&v, row, 4);
        if (v != id) {
          err << "step " << step << " row " << i << ": id column holds " << v << ", expected "
              << id;
          return err.str();
        }
      }
    }
  }
  return "";
}

// The same for a pipeline's plan (every plan of these tests is an epoch's).
std::string batch_error(const std::vector<ArrayColumn>& columns, const BatchLayout& L, const BatchPlan& plan,
                        int64_t step, const Batch& b) {
  return batch_error(columns, L, dynamic_cast<const EpochPlan&>(plan), step, b);
}

// What the Python binding does when it hands a batch out: every part becomes the user's.
void hand_out(Batch& b) {
  for (auto& part : b.parts) part->hand_to_user();
}

std::string show(const BufferPoolCounts& c) {
  std::ostringstream os;
  os << "allocations " << c.allocations << " frees " << c.frees << " free " << c.free
     << " with_loader " << c.with_loader << " with_user " << c.with_user;
  return os.str();
}

int64_t num_parts(const Engine& e) { return static_cast<int64_t>(e.layout().num_parts()); }

// Once an epoch is over and its batches dropped, every buffer is a spare: none is counted as
// the loader's or the user's.
bool all_returned(const BufferPoolCounts& c) {
  return c.with_loader == 0 && c.with_user == 0 && c.free == c.live();
}

// Blocks (in 20 ms slices, as the Python layer does) until the next batch or the end.
NextStatus next_blocking(Pipeline& p, int output, Batch* b) {
  for (;;) {
    const NextStatus s = p.next(output, milliseconds(20), b);
    if (s != NextStatus::Timeout) return s;
  }
}

const char* status_name(NextStatus s) {
  switch (s) {
    case NextStatus::Ok: return "Ok";
    case NextStatus::End: return "End";
    case NextStatus::Timeout: return "Timeout";
    case NextStatus::Cancelled: return "Cancelled";
  }
  return "?";
}

// Consumes every batch of one output in order, checking each; returns the valid ids seen
// (all ids if the layout has no valid part: then padding counts too) in *ids if given. As the
// Python binding does, every batch is handed to the user (hand_to_user) when it is taken; with
// `native`, the consumer is a native one instead and retires each batch once it dropped it.
int64_t consume_all(const BatchLayout& L, Pipeline& p, int output, std::vector<int64_t>* ids,
                    std::vector<Batch>* keep = nullptr, bool native = false) {
  const EpochPlan& plan = dynamic_cast<const EpochPlan&>(p.plan(output));
  int64_t step = 0;
  for (;;) {
    Batch b;
    const NextStatus s = next_blocking(p, output, &b);
    if (s == NextStatus::End) break;
    if (s != NextStatus::Ok) {
      CHECK_MSG(s == NextStatus::Ok, "output " << output << " step " << step << ": " << status_name(s));
      break;
    }
    if (!native) hand_out(b);
    const std::string e = batch_error(columns_of(p.source()), L, plan, step, b);
    CHECK_MSG(e.empty(), "output " << output << ": " << e);
    if (ids) {
      const BatchSpan span = plan.batch(step);
      std::vector<int64_t> got(static_cast<size_t>(span.count));
      std::unique_ptr<bool[]> valid(new bool[static_cast<size_t>(span.count) + 1]);
      plan.fill_ids(span, got.data(), valid.get());
      for (int64_t i = 0; i < span.count; ++i)
        if (valid[i]) ids->push_back(got[static_cast<size_t>(i)]);
    }
    if (keep) keep->push_back(b);
    if (native) {
      b = Batch();
      p.retire(output);
    }
    ++step;
  }
  CHECK_MSG(step == plan.num_batches(),
            "output " << output << " gave " << step << " of " << plan.num_batches() << " batches");
  Batch b;
  CHECK(p.next(output, milliseconds(1), &b) == NextStatus::End);  // End stays End
  CHECK(p.taken(output) == plan.num_batches());
  return step;
}

std::vector<EpochPlan> make_plans(const SamplerConfig& base, const std::vector<int64_t>& ranks,
                                  int64_t epoch, int64_t start = 0) {
  std::vector<EpochPlan> plans;
  for (int64_t r : ranks) {
    SamplerConfig c = base;
    c.rank = r;
    plans.emplace_back(c, epoch, start);
  }
  return plans;
}

// Every id of [0, n) exactly once.
bool exactly_once(std::vector<int64_t> ids, int64_t n) {
  if (static_cast<int64_t>(ids.size()) != n) return false;
  std::sort(ids.begin(), ids.end());
  for (int64_t i = 0; i < n; ++i)
    if (ids[static_cast<size_t>(i)] != i) return false;
  return true;
}

// Test allocators hand out 256-byte aligned memory, as the core's own and the pinned one do, so
// that batch_error's alignment check holds for every batch.
void* aligned_new(size_t bytes) { return ::operator new(bytes, std::align_val_t(kPartAlign)); }
void aligned_delete(void* p) { ::operator delete(p, std::align_val_t(kPartAlign)); }

// A HostAllocator that counts, and optionally fails after `limit` allocations: with a
// std::runtime_error, or (bad_alloc) with the std::bad_alloc an exhausted allocator throws.
class CountingAllocator final : public HostAllocator {
 public:
  explicit CountingAllocator(int64_t limit = -1, bool bad_alloc = false)
      : limit_(limit), bad_alloc_(bad_alloc) {}
  void* allocate(size_t bytes) override {
    if (limit_ >= 0 && allocated_.load() >= limit_) {
      if (bad_alloc_) throw std::bad_alloc();
      throw std::runtime_error("test allocator exhausted");
    }
    ++allocated_;
    return aligned_new(bytes);
  }
  void deallocate(void* p, size_t) noexcept override {
    ++freed_;
    aligned_delete(p);
  }
  int64_t allocated() const { return allocated_.load(); }
  int64_t freed() const { return freed_.load(); }

 private:
  const int64_t limit_;
  const bool bad_alloc_;
  std::atomic<int64_t> allocated_{0}, freed_{0};
};

// A HostAllocator whose allocate() blocks until the gate opens (for everyone, or for chosen
// threads): holds workers mid-build.
class GatedAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    std::unique_lock<std::mutex> lock(mutex_);
    ++waiting_;
    cv_.notify_all();
    const std::thread::id me = std::this_thread::get_id();
    cv_.wait(lock, [&] { return open_ || std::find(allowed_.begin(), allowed_.end(), me) != allowed_.end(); });
    --waiting_;
    return aligned_new(bytes);
  }
  void deallocate(void* p, size_t) noexcept override { aligned_delete(p); }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }
  // Lets one thread's allocations through from now on; the others still wait.
  void allow(std::thread::id thread) {
    std::lock_guard<std::mutex> lock(mutex_);
    allowed_.push_back(thread);
    cv_.notify_all();
  }
  // Until `n` threads wait in allocate(); false after 20 s.
  bool wait_for_waiters(int n) {
    std::unique_lock<std::mutex> lock(mutex_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return waiting_ >= n; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
  int waiting_ = 0;
  std::vector<std::thread::id> allowed_;
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

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

// ================================================================ gather

namespace {
// Gathers ids[0..count) from `src` (rows of row_bytes every pitch bytes) and compares each row
// with its source; also checks nothing is written past the batch.
bool gathers_exactly(const std::vector<uint8_t>& src, int64_t rows, int64_t pitch, int64_t row_bytes,
                     const int64_t* ids, int64_t count) {
  ArrayColumn c;
  c.name = "c";
  c.base = reinterpret_cast<const std::byte*>(src.data());
  c.rows = rows;
  c.pitch = pitch;
  c.row_bytes = row_bytes;
  std::vector<uint8_t> dst(static_cast<size_t>(count * row_bytes) + 1, 0xEE);
  gather_rows(c, ids, count, reinterpret_cast<std::byte*>(dst.data()));
  bool ok = dst.back() == 0xEE;
  for (int64_t i = 0; i < count; ++i)
    ok &= std::memcmp(dst.data() + i * row_bytes, src.data() + ids[i] * pitch, static_cast<size_t>(row_bytes)) == 0;
  return ok;
}
}  // namespace

TEST_CASE(gather_rows_every_size_and_overlapping_windows) {
  // Every size the copy specialises (128 B to 2 KiB: AVX2 moves where the CPU has them, and the
  // baseline copy) and sizes between them.
  std::mt19937_64 rng(7);
  for (bool wide : {true, false}) {
    set_wide_row_copies(wide);
    for (int64_t row_bytes : {1, 2, 3, 4, 8, 16, 24, 32, 64, 100, 128, 256, 300, 512, 1000, 1024, 2048, 2050}) {
      for (int64_t pitch : {row_bytes, row_bytes + 5, std::max<int64_t>(1, row_bytes / 2)}) {
        const int64_t rows = 97;
        std::vector<uint8_t> src(static_cast<size_t>((rows - 1) * pitch + row_bytes));
        for (auto& x : src) x = static_cast<uint8_t>(rng());
        std::vector<int64_t> ids(300);
        for (auto& id : ids) id = static_cast<int64_t>(rng() % rows);
        ids[0] = rows - 1;  // the last row ends at the end of the source
        for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{300}})
          CHECK_MSG(gathers_exactly(src, rows, pitch, row_bytes, ids.data(), count),
                    "wide=" << wide << " row_bytes=" << row_bytes << " pitch=" << pitch << " count=" << count);
      }
    }
  }
  set_wide_row_copies(true);
}

TEST_CASE(gather_rows_large_rows_with_and_without_streaming_stores) {
  // Both copies of long rows, with odd sizes and pitches (unaligned heads and tails), and the
  // threshold that picks between them.
  std::mt19937_64 rng(11);
  for (int64_t threshold : {int64_t{0}, int64_t{1} << 40}) {
    set_streaming_min_part_bytes(threshold);
    for (int64_t row_bytes : {int64_t{16384}, int64_t{16391}, int64_t{40001}}) {
      const int64_t rows = 9, pitch = row_bytes + 3;
      std::vector<uint8_t> src(static_cast<size_t>(rows * pitch));
      for (auto& x : src) x = static_cast<uint8_t>(rng());
      const std::vector<int64_t> ids = {8, 0, 3, 3, 7, 1};
      CHECK_MSG(gathers_exactly(src, rows, pitch, row_bytes, ids.data(), static_cast<int64_t>(ids.size())),
                "threshold=" << threshold << " row_bytes=" << row_bytes);
    }
  }
  set_streaming_min_part_bytes(-1);
  CHECK(streaming_min_part_bytes() == last_level_cache_bytes() / 2);
}

TEST_CASE(cache_sizes_parse_as_sysfs_writes_them) {
  CHECK(parse_cache_size("32768K\n") == int64_t{32} << 20);
  CHECK(parse_cache_size("1M") == int64_t{1} << 20);
  CHECK(parse_cache_size("2G") == int64_t{2} << 30);
  CHECK(parse_cache_size("512") == 512);
  CHECK(parse_cache_size("") == 0);
  CHECK(parse_cache_size("K") == 0);
  CHECK(parse_cache_size(nullptr) == 0);
  CHECK(last_level_cache_bytes() > 0);
}

// ================================================================ ThreadPool

TEST_CASE(thread_pool_run_wait_idle_repeatedly) {
  CHECK_THROWS(ThreadPool(0), std::invalid_argument, "num_threads");
  for (int n : {1, 2, 8}) {
    ThreadPool pool(n);
    CHECK(pool.size() == n);
    std::vector<std::atomic<int>> calls(static_cast<size_t>(n));
    for (auto& c : calls) c = 0;
    const int jobs = n == 8 ? 100 : 300;
    for (int j = 0; j < jobs; ++j) {
      std::atomic<int> in_this_job{0};
      pool.run([&](int index) {
        ++calls[static_cast<size_t>(index)];
        ++in_this_job;
      });
      pool.wait_idle();
      CHECK_MSG(in_this_job.load() == n, "job " << j << ": " << in_this_job.load() << " calls");
      pool.wait_idle();  // idle stays idle
    }
    for (int i = 0; i < n; ++i)
      CHECK_MSG(calls[static_cast<size_t>(i)].load() == jobs, "thread " << i);
  }
  // Destroyed while idle, never having run a job.
  { ThreadPool idle(4); }
  // Destroyed while idle after jobs.
  {
    ThreadPool pool(3);
    std::atomic<int> x{0};
    pool.run([&](int) { ++x; });
    pool.wait_idle();
    CHECK(x.load() == 3);
  }
  // Destroyed while a job runs: the destructor waits for it.
  {
    std::atomic<int> finished{0};
    {
      ThreadPool pool(2);
      std::atomic<int> started{0};
      pool.run([&](int) {
        ++started;
        std::this_thread::sleep_for(milliseconds(30));
        ++finished;
      });
      while (started.load() < 2) std::this_thread::yield();
    }
    CHECK(finished.load() == 2);
  }
  // The job's captured state dies once every thread is done with it.
  {
    ThreadPool pool(4);
    auto token = std::make_shared<int>(1);
    std::weak_ptr<int> weak = token;
    pool.run([token](int) {});
    token.reset();
    pool.wait_idle();
    CHECK(weak.expired());
  }
}

// ================================================================ BufferPool

TEST_CASE(buffer_pool_recycles_grows_and_outlives) {
  auto alloc = std::make_shared<CountingAllocator>();
  auto counts_are = [](const BufferPoolCounts& c, int64_t allocations, int64_t frees, int64_t free,
                       int64_t with_loader, int64_t with_user) {
    return c.allocations == allocations && c.frees == frees && c.free == free &&
           c.with_loader == with_loader && c.with_user == with_user;
  };
  {
    auto pool = BufferPool::create(1000, 2, alloc);
    CHECK(pool->buffer_bytes() == 1000);
    CHECK(&pool->allocator() == alloc.get());
    auto a = pool->acquire(), b = pool->acquire(), c = pool->acquire();  // never waits: grows
    CHECK_MSG(counts_are(pool->counts(), 3, 0, 0, 3, 0), show(pool->counts()));
    CHECK(pool->counts().live() == 3 && pool->counts().loader_held() == 3);
    CHECK(a->size() == 1000 && a->data() != b->data() && b->data() != c->data());
    a->hand_to_user();
    b->hand_to_user();
    b->hand_to_user();  // idempotent: counted once
    CHECK_MSG(counts_are(pool->counts(), 3, 0, 0, 1, 2), show(pool->counts()));
    std::memset(a->data(), 1, 1000);
    a.reset();
    b.reset();
    c.reset();  // more than keep=2 come back: mid-epoch the pool keeps them all (no churn)
    CHECK_MSG(counts_are(pool->counts(), 3, 0, 3, 0, 0), show(pool->counts()));
    CHECK(alloc->freed() == 0);
    pool->set_keep(2);  // the epoch boundary trims the spares to keep
    CHECK_MSG(counts_are(pool->counts(), 3, 1, 2, 0, 0), show(pool->counts()));
    CHECK(alloc->freed() == 1);
    auto d = pool->acquire();  // recycled
    CHECK_MSG(counts_are(pool->counts(), 3, 1, 1, 1, 0), show(pool->counts()));
    d->hand_to_user();
    // Buffers with the user do not count against keep; the loader's (spares and acquired) do.
    auto e1 = pool->acquire(), e2 = pool->acquire();  // one recycled, one new
    CHECK_MSG(counts_are(pool->counts(), 4, 1, 0, 2, 1), show(pool->counts()));
    e1.reset();
    pool->set_keep(1);  // free 1 + with_loader 1 > 1: the spare goes; the acquired one cannot
    CHECK_MSG(counts_are(pool->counts(), 4, 2, 0, 1, 1), show(pool->counts()));
    e2.reset();
    // A buffer outlives its pool's last other owner.
    std::weak_ptr<BufferPool> weak = pool;
    pool.reset();
    CHECK(!weak.expired());
    std::memset(d->data(), 2, d->size());
    d.reset();
    CHECK(weak.expired());
  }
  CHECK(alloc->allocated() == alloc->freed());
  {
    auto pool = BufferPool::create(0, 1, alloc);  // 0 bytes: still a usable buffer
    auto x = pool->acquire();
    CHECK(x->size() >= 1);
    x->hand_to_user();
  }
  CHECK(alloc->allocated() == alloc->freed());
  // A failing allocator: acquire throws, counts nothing, and the pool stays usable.
  {
    auto failing = std::make_shared<CountingAllocator>(1);
    auto pool = BufferPool::create(64, 4, failing);
    auto x = pool->acquire();
    CHECK_THROWS(pool->acquire(), std::runtime_error, "exhausted");
    CHECK_MSG(counts_are(pool->counts(), 1, 0, 0, 1, 0), show(pool->counts()));
    x->hand_to_user();
    x.reset();
    auto y = pool->acquire();  // the recycled one
    CHECK(y != nullptr && pool->counts().allocations == 1);
    y->hand_to_user();
  }
  // acquire(filler) hands a thread a buffer it filled itself when one is among the last few
  // returned (its lines may still be in that core's cache), else the last one returned; the
  // spares it passes over keep their order.
  {
    auto pool = BufferPool::create(64, 8, alloc);
    auto a = pool->acquire(0), b = pool->acquire(1), c = pool->acquire(0), d = pool->acquire(1);
    std::byte* const pa = a->data();
    std::byte* const pb = b->data();
    std::byte* const pc = c->data();
    std::byte* const pd = d->data();
    a.reset();  // returned in the order a, b, c, d: d is the last
    b.reset();
    c.reset();
    d.reset();
    auto x = pool->acquire(0);  // thread 0's newest: c (not d, thread 1's)
    CHECK(x->data() == pc);
    auto y = pool->acquire(1);  // thread 1's newest: d
    CHECK(y->data() == pd);
    auto z = pool->acquire(2);  // thread 2 filled none: the last returned, b
    CHECK(z->data() == pb);
    auto w = pool->acquire();  // no filler named: the last returned, a
    CHECK(w->data() == pa);
    CHECK(pool->counts().allocations == 4 && pool->counts().free == 0);
    x.reset();
    w.reset();  // a comes back filled by nobody named: thread 0 now gets x's buffer (c) first
    auto v = pool->acquire(0);
    CHECK(v->data() == pc);
  }
  CHECK(alloc->allocated() == alloc->freed());
  // Concurrent acquire / write / release: each thread holds one buffer at a time, so the pool
  // never needs more buffers than threads, and frees none.
  {
    const int threads_n = 4;
    auto pool = BufferPool::create(256, 3, alloc);
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int t = 0; t < threads_n; ++t)
      threads.emplace_back([&, t] {
        for (int k = 0; k < 1500; ++k) {
          auto buf = pool->acquire();
          if ((t + k) % 2) buf->hand_to_user();
          std::memset(buf->data(), t * 16 + (k & 15), buf->size());
          for (size_t i = 0; i < buf->size(); ++i)
            if (static_cast<int>(buf->data()[i]) != t * 16 + (k & 15)) ++bad;
        }
      });
    for (auto& th : threads) th.join();
    CHECK(bad.load() == 0);
    const BufferPoolCounts c = pool->counts();
    CHECK_MSG(c.allocations <= threads_n && c.frees == 0, show(c));
    CHECK_MSG(c.free == c.allocations && c.with_loader == 0 && c.with_user == 0, show(c));
  }
  CHECK(alloc->allocated() == alloc->freed());
}

// ================================================================ Engine / Pipeline

TEST_CASE(engine_batches_in_order_for_every_thread_count_and_prefetch) {
  const Source src(777);
  for (int threads : {1, 2, 4, 8}) {
    for (int64_t prefetch : {1, 2, 4}) {
      for (bool with_index : {true, false}) {
        if (!with_index && threads != 4) continue;
        EngineOptions o;
        o.num_threads = threads;
        o.prefetch = prefetch;
        o.with_index = with_index;
        o.with_valid = true;
        o.batch_size = 32;
        Engine e(src.specs(), o);
        CHECK(e.num_threads() == threads && !e.closed());
        for (int64_t epoch : {0, 1}) {
          const SamplerConfig c = make_cfg(src.n, 32, 1, 0, true, Order::Random, Even::Mask,
                                           false, 5);
          auto p = e.start(make_plans(c, {0}, epoch));
          CHECK(p->num_outputs() == 1);
          std::vector<int64_t> ids;
          consume_all(e.layout(), *p, 0, &ids);
          CHECK_MSG(exactly_once(ids, src.n), "threads=" << threads << " prefetch=" << prefetch);
        }
        // A consumer that drops each batch before the next: per part, the window plus the
        // batch being dropped, allocated once and never freed (keep is prefetch + 2).
        const BufferPoolCounts hc = e.host_counts();
        CHECK_MSG(hc.allocations <= (prefetch + 1) * num_parts(e) && hc.frees == 0 && all_returned(hc),
                  "prefetch " << prefetch << ": " << show(hc));
        // A resumed epoch on the same engine continues where the plan says.
        const SamplerConfig c = make_cfg(src.n, 32, 1, 0, true, Order::Block, Even::Pad, true, 5, 50);
        const EpochPlan whole(c, 2, 0);
        auto p = e.start(make_plans(c, {0}, 2, whole.position_after(7)));
        CHECK(p->plan(0).num_batches() == whole.num_batches() - 7);
        consume_all(e.layout(), *p, 0, nullptr);
        e.close();
        CHECK(e.closed());
        e.close();  // idempotent
        CHECK_THROWS(e.start(make_plans(c, {0}, 0)), std::runtime_error, "closed");
      }
    }
  }
}

TEST_CASE(engine_multiple_outputs_consumed_from_separate_threads) {
  const Source src(1001);
  // 2 nodes x 3 devices = world 6; this process is node 1: ranks 3, 4, 5. Then one node with all
  // 3 ranks, whose outputs together cover the dataset exactly once.
  struct Setup {
    int64_t world;
    std::vector<int64_t> ranks;
  };
  for (const Setup& setup : {Setup{6, {3, 4, 5}}, Setup{3, {0, 1, 2}}, Setup{2, {0, 1}}}) {
    for (int threads : {2, 4}) {
      EngineOptions o;
      o.num_threads = threads;
      o.prefetch = 2;
      o.with_index = true;
      o.with_valid = true;
      o.batch_size = 16;
      Engine e(src.specs(), o);
      const SamplerConfig c = make_cfg(src.n, 16, setup.world, 0, true, Order::Random,
                                       Even::Mask, false, 11);
      auto p = e.start(make_plans(c, setup.ranks, 3));
      const int outs = static_cast<int>(setup.ranks.size());
      std::vector<std::vector<int64_t>> ids(static_cast<size_t>(outs));
      std::vector<std::thread> consumers;
      for (int d = 0; d < outs; ++d)
        consumers.emplace_back([&, d] { consume_all(e.layout(), *p, d, &ids[static_cast<size_t>(d)]); });
      for (auto& t : consumers) t.join();
      std::vector<int64_t> all;
      for (auto& v : ids) all.insert(all.end(), v.begin(), v.end());
      std::set<int64_t> uniq(all.begin(), all.end());
      CHECK_MSG(uniq.size() == all.size(), "outputs overlap (world " << setup.world << ")");
      if (static_cast<int64_t>(setup.ranks.size()) == setup.world)
        CHECK_MSG(exactly_once(all, src.n), "world " << setup.world << " does not cover");
      // Per part: each output's window plus the batch its consumer is dropping.
      const BufferPoolCounts hc = e.host_counts();
      CHECK_MSG(hc.allocations <= (o.prefetch + 1) * outs * num_parts(e) && hc.frees == 0 &&
                    all_returned(hc),
                show(hc));
    }
  }
}

TEST_CASE(engine_multiple_outputs_round_robin_from_one_thread) {
  const Source src(1500);
  for (int64_t prefetch : {1, 2, 4}) {
    EngineOptions o;
    o.num_threads = 2;
    o.prefetch = prefetch;
    o.with_index = true;
    o.batch_size = 8;
    Engine e(src.specs(), o);
    const int outs = 3;
    const SamplerConfig c = make_cfg(src.n, 8, outs, 0, true, Order::Block, Even::Pad, false, 3, 64);
    auto p = e.start(make_plans(c, {0, 1, 2}, 0));
    const int64_t nb = p->plan(0).num_batches();
    std::vector<int64_t> all;
    bool ok = true;
    for (int64_t s = 0; s < nb; ++s) {
      for (int d = 0; d < outs; ++d) {
        Batch b;
        if (next_blocking(*p, d, &b) != NextStatus::Ok) {
          ok = false;
          continue;
        }
        const std::string err = batch_error(src.specs(), e.layout(), p->plan(d), s, b);
        if (!err.empty() && ok) CHECK_MSG(err.empty(), "output " << d << ": " << err);
        ok &= err.empty();
        hand_out(b);
        const int64_t* ids = reinterpret_cast<const int64_t*>(b.parts[e.layout().index_part]->data());
        all.insert(all.end(), ids, ids + b.rows);
      }
    }
    CHECK(ok);
    for (int d = 0; d < outs; ++d) {
      Batch b;
      CHECK(p->next(d, milliseconds(1), &b) == NextStatus::End);
    }
    // pad: 1500 samples over 3 ranks, each id at least once, exactly L = 1500 positions.
    std::sort(all.begin(), all.end());
    all.erase(std::unique(all.begin(), all.end()), all.end());
    CHECK(static_cast<int64_t>(all.size()) == src.n);
    // Each output has at most `prefetch` batches in flight and this consumer holds one at a
    // time, so each part's pool needs prefetch * outputs + 1 buffers for the whole epoch
    // instead of allocating (and freeing) a buffer per batch. (Pinned memory makes each
    // allocation expensive.)
    const BufferPoolCounts hc = e.host_counts();
    CHECK_MSG(hc.allocations <= (prefetch * outs + 1) * num_parts(e) && hc.frees == 0,
              "prefetch " << prefetch << ", " << outs << " outputs, " << nb * outs
                          << " batches: " << show(hc));
    CHECK_MSG(all_returned(hc), show(hc));
  }
}

TEST_CASE(engine_cancel_and_restart_mid_epoch) {
  const Source src(3000);
  EngineOptions o;
  o.num_threads = 4;
  o.prefetch = 3;
  o.with_index = true;
  o.batch_size = 24;
  Engine e(src.specs(), o);
  const int64_t parts = num_parts(e);
  const SamplerConfig c = make_cfg(src.n, 24, 1, 0, true);
  // cancel(): the consumer's next() returns Cancelled (no exception, no batch); the engine
  // starts the next epoch normally.
  {
    auto p = e.start(make_plans(c, {0}, 0));
    Batch kept;
    for (int64_t s = 0; s < 3; ++s) {
      Batch b;
      CHECK(next_blocking(*p, 0, &b) == NextStatus::Ok);
      hand_out(b);
      CHECK(batch_error(src.specs(), e.layout(), p->plan(0), s, b).empty());
      kept = b;
    }
    p->cancel();
    CHECK(p->cancelled());
    for (int k = 0; k < 2; ++k) {
      Batch b;
      CHECK(p->next(0, milliseconds(100), &b) == NextStatus::Cancelled);
      CHECK(b.parts.empty());
    }
    auto p2 = e.start(make_plans(c, {0}, 1));
    consume_all(e.layout(), *p2, 0, nullptr);
    CHECK(batch_error(src.specs(), e.layout(), p->plan(0), 2, kept).empty());  // a handed-out batch stays
    // The kept batch, the window and the batch being dropped; the kept one is the user's.
    const BufferPoolCounts hc = e.host_counts();
    CHECK_MSG(hc.allocations <= (o.prefetch + 2) * parts && hc.frees == 0, show(hc));
    CHECK_MSG(hc.with_user == parts && hc.with_loader == 0, show(hc));
  }
  CHECK(all_returned(e.host_counts()));
  // start() mid-epoch cancels the running epoch; many quick restarts.
  std::mt19937 rng(1);
  std::shared_ptr<Pipeline> prev;
  for (int it = 0; it < 40; ++it) {
    auto p = e.start(make_plans(c, {0}, it % 5));
    if (prev) {
      Batch b;
      CHECK(prev->next(0, milliseconds(10), &b) == NextStatus::Cancelled);
    }
    const int take = static_cast<int>(rng() % 4);
    for (int s = 0; s < take; ++s) {
      Batch b;
      CHECK(next_blocking(*p, 0, &b) == NextStatus::Ok);
      hand_out(b);
      CHECK(batch_error(src.specs(), e.layout(), p->plan(0), s, b).empty());
    }
    prev = p;
  }
  prev.reset();
  // Batches built but never handed out by those cancelled epochs left the pipeline: a whole
  // epoch now recycles its buffers instead of allocating one per batch, and nothing was ever
  // freed (the pool never held more than keep = prefetch + 2 per part).
  {
    auto p = e.start(make_plans(c, {0}, 7));
    consume_all(e.layout(), *p, 0, nullptr);
    const BufferPoolCounts hc = e.host_counts();
    CHECK_MSG(hc.allocations <= (o.prefetch + 2) * parts && hc.frees == 0,
              show(hc) << " for " << p->plan(0).num_batches() << " batches");
  }
  // A consumer thread blocked in next() when another thread starts a new epoch.
  for (int it = 0; it < 10; ++it) {
    auto p = e.start(make_plans(c, {0}, 0));
    std::atomic<bool> done{false};
    std::thread consumer([&] {
      try {
        for (int64_t s = 0;; ++s) {
          Batch b;
          const NextStatus st = next_blocking(*p, 0, &b);
          if (st == NextStatus::End || st == NextStatus::Cancelled) break;
          hand_out(b);
          const std::string err = batch_error(src.specs(), e.layout(), p->plan(0), s, b);
          CHECK_MSG(err.empty(), err);
        }
      } catch (const std::exception& ex) {
        CHECK_MSG(false, "next() threw " << ex.what());
      }
      done = true;
    });
    std::this_thread::sleep_for(milliseconds(it % 3));
    auto q = e.start(make_plans(c, {0}, 1));
    consumer.join();
    CHECK(done.load());
    consume_all(e.layout(), *q, 0, nullptr);
  }
  const BufferPoolCounts hc = e.host_counts();
  CHECK_MSG(hc.allocations <= (o.prefetch + 2) * parts && hc.frees == 0 && all_returned(hc), show(hc));
}

TEST_CASE(engine_destroyed_mid_epoch_while_workers_are_busy) {
  // 16 KiB rows, 48 rows a batch: each gather takes a while, so workers are mid-build.
  const Source src(600, 16384);
  const SamplerConfig c = make_cfg(src.n, 48, 1, 0, true);
  for (int it = 0; it < 12; ++it) {
    EngineOptions o;
    o.num_threads = 1 + it % 4;
    o.prefetch = 1 + it % 3;
    o.with_index = true;
    o.batch_size = 48;
    auto e = std::make_unique<Engine>(src.specs(), o);
    auto p = e->start(make_plans(c, {0}, it));
    Batch first;
    if (it % 2) {
      CHECK(next_blocking(*p, 0, &first) == NextStatus::Ok);
      hand_out(first);
      CHECK(batch_error(src.specs(), e->layout(), p->plan(0), 0, first).empty());
    }
    // A consumer blocked in next() while the engine goes away: a batch or Cancelled, no hang.
    std::thread consumer;
    if (it % 3 == 0)
      consumer = std::thread([p] {
        try {
          for (;;) {
            Batch b;
            const NextStatus s = next_blocking(*p, 0, &b);
            if (s == NextStatus::End || s == NextStatus::Cancelled) break;
            hand_out(b);
          }
        } catch (const std::exception& ex) {
          CHECK_MSG(false, "next() threw " << ex.what());
        }
      });
    const BatchLayout layout = e->layout();
    e.reset();  // cancels and joins while workers gather
    if (consumer.joinable()) consumer.join();
    // The batch and the pipeline outlive the engine (each part keeps its pool alive).
    if (!first.parts.empty()) CHECK(batch_error(src.specs(), layout, p->plan(0), 0, first).empty());
    Batch b;
    if (it % 3 != 0) CHECK(p->next(0, milliseconds(10), &b) == NextStatus::Cancelled);
  }
}

TEST_CASE(engine_cancel_wakes_a_blocked_consumer_and_close_joins_busy_workers) {
  const Source src(300);
  EngineOptions o;
  o.num_threads = 2;
  o.prefetch = 2;
  o.with_index = true;
  o.batch_size = 10;
  const SamplerConfig c = make_cfg(src.n, 10, 1, 0, true);
  for (int how = 0; how < 3; ++how) {  // 0: Pipeline::cancel, 1: Engine::start, 2: ~Engine
    auto gate = std::make_shared<GatedAllocator>();
    auto e = std::make_unique<Engine>(src.specs(), o, gate);
    auto p = e->start(make_plans(c, {0}, 0));
    // Both workers are now stuck inside a build (in the allocator).
    CHECK(gate->wait_for_waiters(2));
    std::atomic<bool> woke{false};
    double waited = -1;
    std::string what;
    std::thread consumer([&] {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        Batch b;
        what = status_name(p->next(0, milliseconds(10000), &b));
      } catch (const std::exception& ex) {
        what = std::string("exception: ") + ex.what();
      }
      waited = seconds_since(t0);
      woke = true;
    });
    std::this_thread::sleep_for(milliseconds(100));  // the consumer is in next() by now
    std::thread stopper;
    std::atomic<bool> stopped{false};
    if (how == 0) {
      p->cancel();
    } else if (how == 1) {
      // start() must first wait for the busy workers: run it on its own thread.
      stopper = std::thread([&] {
        auto q = e->start(make_plans(c, {0}, 1));
        consume_all(e->layout(), *q, 0, nullptr);
        stopped = true;
      });
    } else {
      stopper = std::thread([&] {
        e.reset();
        stopped = true;
      });
    }
    // The blocked consumer wakes at once with Cancelled, though no worker has finished.
    const auto t0 = std::chrono::steady_clock::now();
    while (!woke && seconds_since(t0) < 5) std::this_thread::sleep_for(milliseconds(5));
    CHECK_MSG(woke.load(), "how=" << how << ": consumer still blocked in next() 5 s after cancel");
    std::this_thread::sleep_for(milliseconds(50));
    if (how != 0) CHECK_MSG(!stopped.load(), "how=" << how << ": returned before the workers did");
    gate->open();
    consumer.join();
    if (stopper.joinable()) stopper.join();
    CHECK_MSG(what == "Cancelled", "how=" << how << ": " << what);
    CHECK_MSG(waited >= 0 && waited < 5, "how=" << how << ": waited " << waited << " s");
    Batch b;
    CHECK(p->next(0, milliseconds(10), &b) == NextStatus::Cancelled);
    if (e) {
      auto q = e->start(make_plans(c, {0}, 2));
      consume_all(e->layout(), *q, 0, nullptr);
    }
  }
}

TEST_CASE(engine_held_batches_never_block_and_never_change) {
  const Source src(2000);
  EngineOptions o;
  o.num_threads = 4;
  o.prefetch = 2;
  o.with_index = true;
  o.with_valid = true;
  o.batch_size = 16;
  auto alloc = std::make_shared<CountingAllocator>();
  auto e = std::make_unique<Engine>(src.specs(), o, alloc);
  const int64_t parts = num_parts(*e);
  const int64_t keep = o.prefetch + 2;  // Engine::start's rule for one Python output
  const SamplerConfig c = make_cfg(src.n, 16, 1, 0, true, Order::Random, Even::Mask);
  const EpochPlan plan0(c, 0, 0);
  std::vector<Batch> held;
  {
    auto p = e->start(make_plans(c, {0}, 0));
    consume_all(e->layout(), *p, 0, nullptr, &held);  // keeps every batch: the pools must grow
  }
  const int64_t nb = plan0.num_batches();
  CHECK(static_cast<int64_t>(held.size()) == nb);
  {
    const BufferPoolCounts hc = e->host_counts();
    CHECK_MSG(hc.allocations >= nb * parts && hc.frees == 0, show(hc));
    CHECK_MSG(hc.with_user == nb * parts && hc.with_loader == 0, show(hc));
  }
  std::set<const std::byte*> distinct;
  for (auto& h : held)
    for (auto& part : h.parts) distinct.insert(part->data());
  CHECK(static_cast<int64_t>(distinct.size()) == nb * parts);
  auto check_held = [&](const char* when) {
    bool ok = true;
    for (int64_t s = 0; s < nb; ++s) {
      const Batch& b = held[static_cast<size_t>(s)];
      if (b.parts.empty()) continue;
      const std::string err = batch_error(src.specs(), e->layout(), plan0, s, b);
      if (!err.empty() && ok) CHECK_MSG(err.empty(), when << ": " << err);
      ok &= err.empty();
    }
  };
  check_held("after the epoch");
  // Two more epochs (recycling whatever is free) while the first epoch's batches are held.
  for (int64_t epoch : {1, 2}) {
    auto p = e->start(make_plans(c, {0}, epoch));
    consume_all(e->layout(), *p, 0, nullptr);
  }
  check_held("after two more epochs");
  // Release half. Mid-epoch the pools keep every returned buffer (no free, so no reallocation
  // when the next batches come); with_user counts exactly the batches still held.
  const int64_t frees_before = e->host_counts().frees;
  int64_t still = 0;
  for (size_t s = 0; s < held.size(); ++s) {
    if (s % 2 == 0)
      held[s] = Batch();
    else
      ++still;
  }
  {
    const BufferPoolCounts hc = e->host_counts();
    CHECK_MSG(hc.frees == frees_before && hc.with_user == still * parts && hc.with_loader == 0, show(hc));
  }
  // The next epoch's start() trims the spares to keep per part.
  {
    auto p = e->start(make_plans(c, {0}, 3));
    consume_all(e->layout(), *p, 0, nullptr);
    const BufferPoolCounts hc = e->host_counts();
    CHECK_MSG(hc.loader_held() <= keep * parts && hc.with_user == still * parts && hc.with_loader == 0,
              show(hc) << ", held " << still);
    CHECK_MSG(hc.live() == hc.allocations - hc.frees, show(hc));
    CHECK_MSG(alloc->allocated() == hc.allocations && alloc->freed() == hc.frees, show(hc));
  }
  check_held("after releasing half and another epoch");
  // The engine goes; held batches stay valid; releasing them later frees everything (ASan).
  const BatchLayout layout = e->layout();
  e.reset();
  CHECK(alloc->allocated() - alloc->freed() == still * parts);  // close() freed the spares
  bool ok = true;
  for (int64_t s = 1; s < nb; s += 2) ok &= batch_error(src.specs(), layout, plan0, s, held[static_cast<size_t>(s)]).empty();
  CHECK(ok);
  held.clear();
  CHECK(alloc->allocated() == alloc->freed());
}

// The message of the exception an exception_ptr holds ("" if none, "?" if not a std::exception).
std::string what_of(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
  }
  return "?";
}

TEST_CASE(engine_fail_at_step_and_allocator_failure_surface_as_errors) {
  const Source src(500);
  for (int64_t fail_step : {0, 3, 9}) {
    for (int outs : {1, 2}) {
      EngineOptions o;
      o.num_threads = 3;
      o.prefetch = 2;
      o.with_index = true;
      o.batch_size = 10;
      Engine e(src.specs(), o);
      const SamplerConfig c = make_cfg(src.n, 10, outs, 0, true);
      std::vector<int64_t> ranks;
      for (int d = 0; d < outs; ++d) ranks.push_back(d);
      auto p = e.start(make_plans(c, ranks, 0), fail_step);
      int64_t ok_batches = 0;
      std::string message, original;
      bool threw = false, ended = false;
      try {
        for (int64_t s = 0;; ++s) {
          Batch b;
          const NextStatus st = next_blocking(*p, 0, &b);
          if (st != NextStatus::Ok) {
            ended = true;
            CHECK_MSG(false, "next() returned " << status_name(st) << " instead of throwing");
            break;
          }
          hand_out(b);
          CHECK(batch_error(src.specs(), e.layout(), p->plan(0), s, b).empty());
          ++ok_batches;
        }
      } catch (const CollationError& ex) {
        threw = true;
        message = ex.what();
        original = what_of(ex.original());
      }
      CHECK_MSG(threw && !ended, "fail_at_step " << fail_step << " did not throw");
      CHECK_MSG(ok_batches <= fail_step, ok_batches << " batches before the failure");
      CHECK_MSG(message.find("injected failure") != std::string::npos, message);
      CHECK_MSG(message.find("batch " + std::to_string(fail_step)) != std::string::npos, message);
      CHECK_MSG(original.find("injected failure") != std::string::npos, original);  // kept as is
      Batch b;
      CHECK_THROWS(p->next(0, milliseconds(10), &b), CollationError, "injected failure");
      // The engine recovers: the next epoch is whole.
      auto q = e.start(make_plans(c, ranks, 1));
      for (int d = 0; d < outs; ++d) consume_all(e.layout(), *q, d, nullptr);
      const BufferPoolCounts hc = e.host_counts();
      CHECK_MSG(hc.loader_held() <= ((o.prefetch + 1) * outs + 1) * num_parts(e) && all_returned(hc),
                show(hc));
    }
  }
  // A failing allocation (e.g. pinned memory exhausted) is a worker failure too. The layout has
  // 4 parts (no index, no valid): 24 allocations are 6 batches.
  {
    auto alloc = std::make_shared<CountingAllocator>(24);
    EngineOptions o;
    o.num_threads = 2;
    o.prefetch = 2;
    o.batch_size = 10;
    {
      Engine e(src.specs(), o, alloc);
      CHECK(num_parts(e) == 4);
      auto p = e.start(make_plans(make_cfg(src.n, 10, 1, 0, false), {0}, 0));
      std::vector<Batch> keep;  // holding batches forces new allocations
      std::string message, original;
      try {
        for (;;) {
          Batch b;
          const NextStatus st = next_blocking(*p, 0, &b);
          if (st != NextStatus::Ok) break;
          hand_out(b);
          keep.push_back(b);
        }
      } catch (const CollationError& ex) {
        message = ex.what();
        original = what_of(ex.original());
      }
      CHECK_MSG(message.find("test allocator exhausted") != std::string::npos,
                "got '" << message << "'");
      CHECK_MSG(original == "test allocator exhausted", original);
      CHECK(keep.size() <= 6);
      // The failed batch's parts that were allocated went back to their pools.
      const BufferPoolCounts hc = e.host_counts();
      CHECK_MSG(hc.with_user == static_cast<int64_t>(keep.size()) * 4 && hc.allocations <= 24, show(hc));
    }
    CHECK(alloc->allocated() == alloc->freed());
  }
}

TEST_CASE(engine_constructor_and_start_argument_errors) {
  const Source src(50);
  EngineOptions o;
  o.batch_size = 0;
  CHECK_THROWS(Engine(src.specs(), o), std::invalid_argument, "batch_size");
  o.batch_size = 4;
  o.prefetch = 0;
  CHECK_THROWS(Engine(src.specs(), o), std::invalid_argument, "prefetch");
  o.prefetch = 2;
  o.num_threads = 0;
  CHECK_THROWS(Engine(src.specs(), o), std::invalid_argument, "num_threads");
  o.num_threads = 2;
  Engine e(src.specs(), o);
  CHECK_THROWS(e.start(make_plans(make_cfg(50, 5, 1, 0, false), {0}, 0)), std::invalid_argument,
               "batch size");
  // A plan with fewer rows per batch than the layout is fine.
  auto p = e.start(make_plans(make_cfg(50, 3, 1, 0, false), {0}, 0));
  consume_all(e.layout(), *p, 0, nullptr);
  // No columns, index only.
  EngineOptions io;
  io.with_index = true;
  io.batch_size = 7;
  Engine index_only(std::vector<ArrayColumn>{}, io);
  auto q = index_only.start(make_plans(make_cfg(50, 7, 1, 0, true), {0}, 0));
  std::vector<int64_t> ids;
  consume_all(index_only.layout(), *q, 0, &ids);
  CHECK(exactly_once(ids, 50));
  e.check_not_forked();
}

TEST_CASE(engine_stress_restarts_with_concurrent_consumers) {
  // Random interleavings of: consumers on 3 outputs (each on its own thread), a new epoch started
  // mid-epoch, cancel(), and consumers that stop early. Every batch handed out must be right.
  const Source src(700);
  EngineOptions o;
  o.num_threads = 3;
  o.prefetch = 2;
  o.with_index = true;
  o.with_valid = true;
  o.batch_size = 6;
  auto e = std::make_unique<Engine>(src.specs(), o);
  const BatchLayout layout = e->layout();  // consumers may outlive the engine
  std::mt19937 rng(2024);
  std::atomic<int64_t> batches{0}, cancels{0};
  const int iterations = 200;
  for (int it = 0; it < iterations; ++it) {
    const int64_t world = 3 + it % 2;  // 3 or 4 ranks; this process has ranks 0..2
    const SamplerConfig c = make_cfg(src.n, 6, world, 0, it % 3 != 0, Order::Random,
                                     it % 2 ? Even::Mask : Even::Pad, it % 5 == 0, it);
    auto p = e->start(make_plans(c, {0, 1, 2}, it % 4));
    std::vector<std::thread> consumers;
    for (int d = 0; d < 3; ++d) {
      const int64_t limit = rng() % 3 == 0 ? static_cast<int64_t>(rng() % 20) : int64_t{1} << 40;
      consumers.emplace_back([&, d, limit, p] {
        try {
          for (int64_t s = 0; s < limit; ++s) {
            Batch b;
            const NextStatus st = next_blocking(*p, d, &b);
            if (st == NextStatus::End) {
              CHECK(s == p->plan(d).num_batches());
              break;
            }
            if (st == NextStatus::Cancelled) {
              ++cancels;
              break;
            }
            hand_out(b);
            const std::string err = batch_error(src.specs(), layout, p->plan(d), s, b);
            CHECK_MSG(err.empty(), "iteration " << it << " output " << d << ": " << err);
            ++batches;
          }
        } catch (const std::exception& ex) {
          CHECK_MSG(false, "next() threw " << ex.what());
        }
      });
    }
    switch (rng() % 3) {
      case 0:  // let them finish (or stop early) on their own
        break;
      case 1:  // the next epoch starts while they read
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        p->cancel();
        break;
      default:
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
        if (it + 1 == iterations) e.reset();  // the engine goes while they read
        break;
    }
    if (!e) {
      for (auto& t : consumers) t.join();
      break;
    }
    // Starting the next epoch cancels this one: consumers still reading get Cancelled.
    if (rng() % 2) {
      auto next = e->start(make_plans(c, {0, 1, 2}, 9));
      for (auto& t : consumers) t.join();
      next->cancel();
    } else {
      for (auto& t : consumers) t.join();
    }
  }
  std::printf("    (%lld batches checked, %lld consumers cancelled)\n",
              static_cast<long long>(batches.load()), static_cast<long long>(cancels.load()));
  CHECK(batches.load() > 0);
}

// ================================================================ issue 6: what the core changed for a native consumer
//
// Each case below fails on the core before 0f4a3ab (see the comment on each for how).

namespace {

// A pipeline driven by the test's own worker threads, for the cases that need to control which
// worker builds what (Engine hides its threads).
struct OwnPipeline {
  std::shared_ptr<const BatchLayout> layout;
  std::vector<std::shared_ptr<BufferPool>> pools;
  std::shared_ptr<Pipeline> pipeline;
  std::vector<std::thread> workers;

  OwnPipeline(std::shared_ptr<BatchSource> source, std::shared_ptr<const BatchLayout> L, std::vector<OutputSpec> outputs,
              int64_t prefetch, std::shared_ptr<HostAllocator> alloc, int64_t keep = 1000)
      : layout(std::move(L)) {
    for (size_t p = 0; p < layout->num_parts(); ++p)
      pools.push_back(BufferPool::create(layout->part_bytes(p), keep, alloc));
    pipeline = std::make_shared<Pipeline>(source, layout, std::move(outputs), prefetch, pools);
  }
  std::thread::id add_worker() {
    auto p = pipeline;
    workers.emplace_back([p] { p->work(); });
    return workers.back().get_id();
  }
  ~OwnPipeline() {
    pipeline->cancel();
    for (auto& t : workers) t.join();
  }
  BufferPoolCounts counts() const {
    BufferPoolCounts sum;
    for (const auto& pool : pools) sum += pool->counts();
    return sum;
  }
  int64_t parts() const { return static_cast<int64_t>(layout->num_parts()); }
};

}  // namespace

// (a) The old wake rule woke any consumer only once prefetch/2 batches in a row were ready. A
// native consumer (a transfer thread) must be woken by every batch. Made deterministic: worker
// A builds step 0 while worker B is stuck in step 1's build, so only step 0 is ever ready. A
// native consumer blocked in next() returns with step 0 at once; a Python consumer (wake batch
// prefetch/2 = 4) sleeps until its timeout, which is what the old code did to both.
TEST_CASE(native_consumer_is_woken_by_each_ready_batch) {
  const Source src(2000);
  auto source = std::make_shared<ArraySource>(src.specs());
  auto layout = std::make_shared<const BatchLayout>(source->schema(), true, false, 16);
  const EpochPlan plan(make_cfg(src.n, 16, 1, 0, true), 0, 0);
  const int64_t prefetch = 8;
  for (bool native : {true, false}) {
    auto gate = std::make_shared<GatedAllocator>();
    OwnPipeline own(source, layout, {{plan, native}}, prefetch, gate);
    Pipeline& p = *own.pipeline;
    const std::thread::id a = own.add_worker();
    CHECK(gate->wait_for_waiters(1));  // A claimed step 0 and waits in its first allocation
    own.add_worker();
    CHECK(gate->wait_for_waiters(2));  // B claimed step 1 and waits too
    const auto timeout = native ? milliseconds(10000) : milliseconds(1500);
    std::atomic<bool> returned{false};
    NextStatus status = NextStatus::Timeout;
    Batch got;
    double waited = -1;
    std::thread consumer([&] {
      const auto t0 = std::chrono::steady_clock::now();
      status = p.next(0, timeout, &got);
      waited = seconds_since(t0);
      returned = true;
    });
    std::this_thread::sleep_for(milliseconds(300));  // the consumer waits in next() by now
    CHECK_MSG(!returned.load(), "next() returned before any batch was built");
    gate->allow(a);  // A builds step 0, then steps 2..7; step 1 stays blocked in B
    consumer.join();
    const double after_ready = waited - 0.3;
    std::printf("    (%s consumer: next() returned %.1f ms after step 0 could be built)\n",
                native ? "native" : "Python", after_ready * 1e3);
    CHECK_MSG(status == NextStatus::Ok, status_name(status));
    CHECK(batch_error(src.specs(), *layout, plan, 0, got).empty());
    if (native) {
      // Well before its 20 s timeout: woken by step 0 alone (generous: TSan, a loaded machine).
      CHECK_MSG(after_ready < 3.0, "native consumer waited " << waited << " s for a ready batch");
    } else {
      // The documented batching of wake-ups for Python consumers still holds: it slept on.
      CHECK_MSG(waited >= 1.2, "Python consumer woke after " << waited << " s, before its timeout");
    }
    gate->open();
    got = Batch();
    if (native) p.retire(0);
    for (int64_t s = 1; s < plan.num_batches(); ++s) {
      Batch b;
      if (next_blocking(p, 0, &b) != NextStatus::Ok) {
        CHECK_MSG(false, "no batch " << s);
        break;
      }
      CHECK(batch_error(src.specs(), *layout, plan, s, b).empty());
      b = Batch();
      if (native) p.retire(0);
    }
    Batch end;
    CHECK(p.next(0, milliseconds(1), &end) == NextStatus::End);
  }
}

// (b) The old window freed a place when a batch was taken. A native consumer's taken batch is
// still the loader's (its copy is in flight) until retire(): claimed + collated + taken but not
// retired batches of an output never exceed prefetch. Counted by the pools: the consumer drops
// a batch before it retires it, so each part's pool never needs more than prefetch buffers.
TEST_CASE(native_window_frees_a_place_only_on_retire) {
  const Source src(3000);
  auto source = std::make_shared<ArraySource>(src.specs());
  auto layout = std::make_shared<const BatchLayout>(source->schema(), true, true, 8);
  const EpochPlan plan(make_cfg(src.n, 8, 1, 0, true, Order::Random, Even::Mask), 1, 0);
  const int64_t prefetch = 3;
  for (bool native : {true, false}) {
    auto alloc = std::make_shared<CountingAllocator>();
    OwnPipeline own(source, layout, {{plan, native}}, prefetch, alloc);
    Pipeline& p = *own.pipeline;
    for (int t = 0; t < 3; ++t) own.add_worker();
    std::deque<Batch> held;  // taken, not yet retired
    for (int64_t s = 0; s < prefetch; ++s) {
      Batch b;
      CHECK(next_blocking(p, 0, &b) == NextStatus::Ok);
      CHECK(batch_error(src.specs(), *layout, plan, s, b).empty());
      held.push_back(std::move(b));
    }
    Batch extra;
    const NextStatus s = p.next(0, milliseconds(300), &extra);
    if (native) {
      // The window is full of taken batches: nothing more was claimed, nothing can arrive.
      CHECK_MSG(s == NextStatus::Timeout, status_name(s));
      const BufferPoolCounts c = own.counts();
      CHECK_MSG(c.allocations == prefetch * own.parts(), show(c));
      // Taken by a native consumer and not handed out: still the loader's.
      CHECK_MSG(c.with_loader == prefetch * own.parts() && c.with_user == 0, show(c));
    } else {
      // A Python consumer's take is its retire: the window moved on.
      CHECK_MSG(s == NextStatus::Ok && extra.step == prefetch, status_name(s));
      continue;
    }
    // From now on: drop the oldest, retire it, take the next, holding `prefetch` at a time.
    int64_t step = prefetch;
    for (;;) {
      held.pop_front();
      p.retire(0);
      Batch b;
      const NextStatus st = next_blocking(p, 0, &b);
      if (st == NextStatus::End) break;
      if (st != NextStatus::Ok) {
        CHECK_MSG(false, status_name(st));
        break;
      }
      CHECK(batch_error(src.specs(), *layout, plan, step, b).empty());
      held.push_back(std::move(b));
      ++step;
    }
    CHECK(step == plan.num_batches());
    while (!held.empty()) {
      held.pop_front();
      p.retire(0);
    }
    p.retire(0);  // one retire too many is harmless
    const BufferPoolCounts c = own.counts();
    CHECK_MSG(c.allocations == prefetch * own.parts() && c.frees == 0 && all_returned(c),
              show(c) << " over " << plan.num_batches() << " batches");
    CHECK(alloc->allocated() == c.allocations);
  }
}

// (c) Buffers carry their state, and a pool never frees mid-epoch. The old pool freed every
// buffer returned beyond `keep` and allocated again at once: holding 8 batches and dropping them
// together cost 42 allocations and 37 frees per 64 batches. Now: allocations at most keep + 8
// per part for the whole epoch, no free until the next start(), and exact with_user counts.
TEST_CASE(held_batches_dropped_together_never_churn_the_pool) {
  const Source src(512);
  EngineOptions o;
  o.num_threads = 2;
  o.prefetch = 4;
  o.with_index = true;
  o.batch_size = 8;  // 64 batches
  auto alloc = std::make_shared<CountingAllocator>();
  Engine e(src.specs(), o, alloc);
  const int64_t parts = num_parts(e);
  const int64_t keep = (o.prefetch + 1) * 1 + 0 + 1;  // Engine::start's rule, one output
  const SamplerConfig c = make_cfg(src.n, 8, 1, 0, true);
  for (int64_t epoch : {0, 1}) {
    auto p = e.start(make_plans(c, {0}, epoch));
    const BufferPoolCounts at_start = e.host_counts();
    CHECK_MSG(at_start.loader_held() <= keep * parts && at_start.with_user == 0, show(at_start));
    CHECK(p->plan(0).num_batches() == 64);
    std::vector<Batch> held;
    int64_t step = 0;
    for (;;) {
      Batch b;
      const NextStatus st = next_blocking(*p, 0, &b);
      if (st == NextStatus::End) break;
      CHECK_MSG(st == NextStatus::Ok, status_name(st));
      if (st != NextStatus::Ok) break;
      hand_out(b);
      CHECK(batch_error(src.specs(), e.layout(), p->plan(0), step, b).empty());
      held.push_back(std::move(b));
      ++step;
      const BufferPoolCounts hc = e.host_counts();
      CHECK_MSG(hc.with_user == static_cast<int64_t>(held.size()) * parts, show(hc));
      CHECK_MSG(hc.frees == at_start.frees, "freed mid-epoch: " << show(hc));
      if (held.size() == 8) {
        // Once the workers have filled the window, the loader holds exactly the window's
        // batches and the user exactly the eight: every buffer is counted where it is.
        const int64_t window = std::min<int64_t>(o.prefetch, 64 - step) * parts;
        BufferPoolCounts settled = e.host_counts();
        const auto t0 = std::chrono::steady_clock::now();
        while (settled.with_loader != window && seconds_since(t0) < 10) {
          std::this_thread::sleep_for(milliseconds(1));
          settled = e.host_counts();
        }
        CHECK_MSG(settled.with_loader == window && settled.with_user == 8 * parts &&
                      alloc->allocated() - alloc->freed() == settled.live(),
                  "step " << step << ": " << show(settled));
        std::this_thread::sleep_for(milliseconds(2));
        CHECK_MSG(e.host_counts().with_loader == window, "more than the window built: " << show(e.host_counts()));
        held.clear();  // all eight at once
        const BufferPoolCounts after = e.host_counts();
        CHECK_MSG(after.with_user == 0 && after.frees == at_start.frees, show(after));
      }
    }
    CHECK(step == 64);
    held.clear();
    const BufferPoolCounts hc = e.host_counts();
    std::printf("    (epoch %lld: %lld allocations, %lld frees so far, %lld parts per batch)\n",
                static_cast<long long>(epoch), static_cast<long long>(hc.allocations),
                static_cast<long long>(hc.frees), static_cast<long long>(parts));
    // Per part: the window and the 8 held batches; the epoch never freed, so that is also
    // every allocation it made beyond the spares it started with.
    CHECK_MSG(hc.live() <= (keep + 8) * parts, "epoch " << epoch << ": " << show(hc));
    CHECK_MSG(hc.allocations - at_start.allocations <= (keep + 8) * parts - at_start.live(),
              "epoch " << epoch << ": " << show(hc));
    CHECK_MSG(hc.frees == at_start.frees && all_returned(hc), show(hc));
    CHECK(alloc->allocated() == hc.allocations && alloc->freed() == hc.frees);
  }
  // The spares beyond keep went at the second start() only, in one go.
  CHECK_MSG(e.host_counts().allocations <= 2 * (keep + 8) * parts, show(e.host_counts()));
}

// (d) Worker failures used to be kept as strings: a std::bad_alloc became a plain runtime
// error, and a cancel threw just like a failure. Now the original exception travels inside a
// CollationError, and a cancel is a status.
TEST_CASE(bad_alloc_in_a_worker_stays_bad_alloc_and_cancel_is_a_status) {
  const Source src(400);
  EngineOptions o;
  o.num_threads = 2;
  o.prefetch = 2;
  o.with_index = true;
  o.with_valid = true;
  o.batch_size = 10;
  const SamplerConfig c = make_cfg(src.n, 10, 1, 0, true);
  for (bool native : {false, true}) {
    // 6 parts a batch: the 20th allocation fails, inside the 4th batch's build.
    auto alloc = std::make_shared<CountingAllocator>(19, /*bad_alloc=*/true);
    Engine e(src.specs(), o, alloc);
    CHECK(num_parts(e) == 6);
    auto p = e.start({OutputSpec{EpochPlan(c, 0, 0), native}});
    std::vector<Batch> held;  // forces allocations
    bool caught_bad_alloc = false, other = false;
    std::string message;
    for (int k = 0; k < 2; ++k) {  // the error stays: the second call sees it too
      try {
        for (;;) {
          Batch b;
          const NextStatus st = next_blocking(*p, 0, &b);
          CHECK_MSG(st == NextStatus::Ok, "a failed epoch gave " << status_name(st));
          if (st != NextStatus::Ok) break;
          if (!native) hand_out(b);
          held.push_back(std::move(b));
          if (native) p->retire(0);  // handed on (kept here): its window place is free
        }
      } catch (const CollationError& ex) {
        message = ex.what();
        CHECK(ex.original() != nullptr);
        try {
          std::rethrow_exception(ex.original());
        } catch (const std::bad_alloc&) {
          caught_bad_alloc = true;
        } catch (...) {
          other = true;
        }
      }
      CHECK_MSG(caught_bad_alloc && !other, "native " << native << ": " << message);
      CHECK_MSG(message.find("fastload collation thread failed on batch") != std::string::npos &&
                    message.find("epoch 0") != std::string::npos,
                message);
    }
    CHECK_MSG(held.size() <= 3, held.size() << " batches before the failure");
    held.clear();
  }
  // A cancel is NextStatus::Cancelled, for a consumer already waiting and for later calls, on
  // both kinds of consumer; never an exception.
  for (bool native : {false, true}) {
    auto gate = std::make_shared<GatedAllocator>();
    Engine e(src.specs(), o, gate);
    auto p = e.start({OutputSpec{EpochPlan(c, 0, 0), native}});
    CHECK(gate->wait_for_waiters(2));  // nothing can be ready: both workers are stuck
    NextStatus waiting = NextStatus::Ok;
    std::string threw;
    std::thread consumer([&] {
      try {
        Batch b;
        waiting = p->next(0, milliseconds(20000), &b);
      } catch (const std::exception& ex) {
        threw = ex.what();
      }
    });
    std::this_thread::sleep_for(milliseconds(100));
    p->cancel();
    consumer.join();
    CHECK_MSG(threw.empty() && waiting == NextStatus::Cancelled, status_name(waiting) << " " << threw);
    Batch b;
    CHECK(p->next(0, milliseconds(1), &b) == NextStatus::Cancelled);
    gate->open();
    e.close();
    CHECK(p->next(0, milliseconds(1), &b) == NextStatus::Cancelled && b.parts.empty());
  }
}

// (e) Two consumers on one output: the old pipeline kept `consumer_waiting` as a bool and a
// waiter kept a stale slot reference, so one consumer's wake-up could be lost and it slept to
// its timeout while batches were ready (256 batches in 0.15 s against 0.006 s). Each next()
// here has a 3 s timeout: a single Timeout is a lost wake-up.
TEST_CASE(two_consumers_on_one_output_take_every_batch_once) {
  // 16 KiB rows: building a batch takes longer than taking one, so both consumers wait in
  // next() at once, the situation where the old wake-up was lost.
  const Source src(1024, 16384);
  EngineOptions o;
  o.num_threads = 2;
  o.prefetch = 4;
  o.with_index = true;
  o.batch_size = 4;  // 256 batches
  Engine e(src.specs(), o);
  const SamplerConfig c = make_cfg(src.n, 4, 1, 0, true);
  for (bool native : {false, true}) {
    bool both_took = false;
    for (int round = 0; round < 3; ++round) {
      auto p = e.start({OutputSpec{EpochPlan(c, round, 0), native}});
      const EpochPlan& plan = dynamic_cast<const EpochPlan&>(p->plan(0));
      CHECK(plan.num_batches() == 256);
      std::vector<std::vector<int64_t>> steps(2);
      std::atomic<int> timeouts{0};
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> consumers;
      for (int t = 0; t < 2; ++t)
        consumers.emplace_back([&, t] {
          try {
            for (;;) {
              Batch b;
              const NextStatus st = p->next(0, milliseconds(3000), &b);
              if (st == NextStatus::Timeout) {
                ++timeouts;
                continue;
              }
              if (st != NextStatus::Ok) {
                CHECK_MSG(st == NextStatus::End, status_name(st));
                break;
              }
              if (!native) hand_out(b);
              const std::string err = batch_error(src.specs(), e.layout(), plan, b.step, b);
              CHECK_MSG(err.empty(), err);
              steps[static_cast<size_t>(t)].push_back(b.step);
              if (native) {
                b = Batch();
                p->retire(0);
              }
            }
          } catch (const std::exception& ex) {
            CHECK_MSG(false, "next() threw " << ex.what());
          }
        });
      for (auto& t : consumers) t.join();
      const double elapsed = seconds_since(t0);
      CHECK_MSG(timeouts.load() == 0, timeouts.load() << " next() calls slept 3 s with batches ready");
      // Generous (TSan, 2 cores): the old stall was 25x the healthy time.
      CHECK_MSG(elapsed < 3.0, "256 batches took " << elapsed << " s");
      std::vector<int64_t> all;
      for (auto& v : steps) {
        CHECK(std::is_sorted(v.begin(), v.end()));  // each consumer sees the order
        all.insert(all.end(), v.begin(), v.end());
      }
      CHECK_MSG(exactly_once(all, 256), "steps lost or duplicated: " << all.size() << " taken");
      CHECK(p->taken(0) == 256);
      both_took |= !steps[0].empty() && !steps[1].empty();
      if (round == 0)
        std::printf("    (%s: 256 batches in %.1f ms, split %zu / %zu)\n", native ? "native" : "Python",
                    elapsed * 1e3, steps[0].size(), steps[1].size());
    }
    CHECK_MSG(both_took, "one consumer took every batch in every round: nothing was shared");
  }
}

// (g) Parts are exported to CUDA and DLPack, which want 256-byte alignment; the old single
// buffer placed columns at 64-byte offsets. Every batch of every case is checked by batch_error;
// here odd row sizes and batch sizes with the core's own allocator, and the pool directly.
TEST_CASE(every_part_is_256_byte_aligned) {
  auto aligned = make_aligned_allocator();
  for (size_t bytes : {size_t{1}, size_t{7}, size_t{255}, size_t{257}, size_t{4097}, size_t{1} << 20}) {
    auto pool = BufferPool::create(bytes, 2, aligned);
    std::vector<std::shared_ptr<HostBuffer>> bufs;
    for (int k = 0; k < 5; ++k) bufs.push_back(pool->acquire());
    for (auto& b : bufs) {
      CHECK_MSG(reinterpret_cast<uintptr_t>(b->data()) % kPartAlign == 0, bytes << " bytes");
      std::memset(b->data(), 0x5A, b->size());  // the whole size is usable (ASan)
    }
  }
  const Source src(301);
  for (int64_t batch : {1, 7, 13}) {
    EngineOptions o;
    o.num_threads = 2;
    o.prefetch = 2;
    o.with_index = true;
    o.with_valid = true;
    o.batch_size = batch;
    Engine e(src.specs(), o);
    auto p = e.start(make_plans(make_cfg(src.n, batch, 1, 0, true, Order::Random, Even::Mask), {0}, 0));
    consume_all(e.layout(), *p, 0, nullptr);  // batch_error checks each part's alignment
  }
}

// ================================================================ fork

TEST_CASE(fork_child_does_not_join_the_parents_threads) {
  const Source src(400);
  EngineOptions o;
  o.num_threads = 2;
  o.prefetch = 2;
  o.with_index = true;
  o.batch_size = 8;
  auto* e = new Engine(src.specs(), o);
  auto p = e->start(make_plans(make_cfg(src.n, 8, 1, 0, true), {0}, 0));
  Batch b;
  CHECK(next_blocking(*p, 0, &b) == NextStatus::Ok);
  hand_out(b);
  const uint64_t gen = fork_generation();
  const int rc = run_in_child([&] {
    if (fork_generation() == gen) return false;
    bool threw = false;
    try {
      e->check_not_forked();
    } catch (const std::runtime_error& ex) {
      threw = std::strstr(ex.what(), "fork") != nullptr;
    }
    b = Batch();  // returns to pools whose mutex a parent thread may hold: must not lock
    p.reset();
    delete e;  // must not join the parent's threads (they do not exist here)
    return threw;
  });
  CHECK_MSG(rc == 0, "child exit " << rc);
  CHECK(fork_generation() == gen);
  e->check_not_forked();
  // The parent goes on as if nothing happened: the rest of the epoch, then a clean shutdown.
  for (int64_t s = 1;; ++s) {
    Batch next;
    if (next_blocking(*p, 0, &next) == NextStatus::End) {
      CHECK(s == p->plan(0).num_batches());
      break;
    }
    CHECK(batch_error(src.specs(), e->layout(), p->plan(0), s, next).empty());
  }
  delete e;
}

// (f) ~BufferPool in a forked child used to free its spares: with page-locked memory that is a
// driver call in a child. Now it leaks there (like give_back). Reported through the exit code:
// the number of deallocate() calls the child made.
TEST_CASE(fork_child_destroying_pools_calls_no_deallocate) {
  auto alloc = std::make_shared<CountingAllocator>();
  auto pool = BufferPool::create(4096, 8, alloc);
  {
    auto a = pool->acquire(), b = pool->acquire(), c = pool->acquire();
  }  // three spares
  auto held = pool->acquire();
  held->hand_to_user();
  // An engine with spares in its pools too (a finished epoch).
  const Source src(64);
  EngineOptions o;
  o.num_threads = 2;
  o.prefetch = 2;
  o.batch_size = 8;
  auto* e = new Engine(src.specs(), o, alloc);
  {
    auto p = e->start(make_plans(make_cfg(src.n, 8, 1, 0, true), {0}, 0));
    consume_all(e->layout(), *p, 0, nullptr);
  }
  CHECK(e->host_counts().free > 0);
  const int64_t allocated = alloc->allocated(), freed = alloc->freed();
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    const int64_t before = alloc->freed();
    held.reset();  // give_back in the child: no lock, no free
    pool.reset();  // ~BufferPool with 4 spares
    delete e;      // the engine's pools go too
    const int64_t calls = alloc->freed() - before;
    std::_Exit(static_cast<int>(std::min<int64_t>(calls, 100)));
  }
  CHECK(pid > 0);
  int status = 0;
  while (pid > 0 && waitpid(pid, &status, 0) < 0) {
  }
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0,
            "the child made " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1)
                              << " deallocate() calls (exit status " << status << ")");
  // The parent's pools are untouched and free normally.
  CHECK(alloc->allocated() == allocated && alloc->freed() == freed);
  held.reset();
  pool.reset();
  delete e;
  CHECK(alloc->allocated() == alloc->freed());
}

// ================================================================ main

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_core"); }
