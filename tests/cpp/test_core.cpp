// Tests of the C++ core (no Python), meant to run under ThreadSanitizer and under
// AddressSanitizer + UndefinedBehaviorSanitizer: see tests/cpp/run_sanitizers.sh.
//
// A tiny self-contained harness: CHECK records a failure and goes on; each test case is a function
// registered with TEST_CASE; main runs them all (or those whose name contains argv[1]), prints one
// "[ PASS ] name" / "[ FAIL ] name" line per case and exits non-zero if any failed. A watchdog
// thread ends the process if one case runs longer than FASTLOAD_TEST_CASE_TIMEOUT seconds (60),
// so a hang is a failure, not a stuck CI job.
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

#include "core/buffer_pool.h"
#include "core/engine.h"
#include "core/fork_guard.h"
#include "core/gather.h"
#include "core/permutation.h"
#include "core/pipeline.h"
#include "core/sampler.h"
#include "core/thread_pool.h"

using namespace fastload;
using std::chrono::milliseconds;

// ================================================================ harness

namespace harness {

std::mutex g_print_mutex;
std::atomic<int64_t> g_case_failures{0};
std::atomic<int64_t> g_checks{0};

void fail(const char* file, int line, const std::string& what) {
  const int64_t n = ++g_case_failures;
  std::lock_guard<std::mutex> lock(g_print_mutex);
  if (n <= 25)
    std::printf("    CHECK FAILED at %s:%d: %s\n", file, line, what.c_str());
  else if (n == 26)
    std::printf("    (further failures of this case not shown)\n");
  std::fflush(stdout);
}

struct Case {
  const char* name;
  void (*fn)();
};
std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}
struct Registrar {
  Registrar(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};

// Ends the process when a case overruns its deadline (a deadlock or a lost wake-up).
class Watchdog {
 public:
  explicit Watchdog(int seconds) : seconds_(seconds), thread_([this] { loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void arm(const char* name) {
    std::lock_guard<std::mutex> lock(mutex_);
    name_ = name;
    deadline_ = std::chrono::steady_clock::now() + std::chrono::seconds(seconds_);
    armed_ = true;
  }
  void disarm() {
    std::lock_guard<std::mutex> lock(mutex_);
    armed_ = false;
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stop_) {
      cv_.wait_for(lock, milliseconds(200));
      if (armed_ && std::chrono::steady_clock::now() > deadline_) {
        std::fprintf(stdout, "[ FAIL ] %s (WATCHDOG: still running after %d s: hang?)\n",
                     name_.c_str(), seconds_);
        std::fflush(stdout);
        std::_Exit(3);
      }
    }
  }
  const int seconds_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::string name_;
  std::chrono::steady_clock::time_point deadline_;
  bool armed_ = false, stop_ = false;
  std::thread thread_;
};

}  // namespace harness

#define TEST_CASE(name)                                            \
  static void name();                                              \
  static ::harness::Registrar name##_registrar(#name, &name);      \
  static void name()

#define CHECK(cond)                                          \
  do {                                                       \
    ++::harness::g_checks;                                   \
    if (!(cond)) ::harness::fail(__FILE__, __LINE__, #cond); \
  } while (0)

#define CHECK_MSG(cond, msg)                                  \
  do {                                                        \
    ++::harness::g_checks;                                    \
    if (!(cond)) {                                            \
      std::ostringstream os_;                                 \
      os_ << #cond << "  [" << msg << "]";                    \
      ::harness::fail(__FILE__, __LINE__, os_.str());         \
    }                                                         \
  } while (0)

// expr must throw ExType whose what() contains substr.
#define CHECK_THROWS(expr, ExType, substr)                                                     \
  do {                                                                                        \
    ++::harness::g_checks;                                                                    \
    std::string got_ = "no exception";                                                        \
    bool ok_ = false;                                                                         \
    try {                                                                                     \
      expr;                                                                                   \
    } catch (const ExType& e_) {                                                              \
      got_ = std::string(#ExType ": ") + e_.what();                                           \
      ok_ = std::string(e_.what()).find(substr) != std::string::npos;                         \
    } catch (const std::exception& e_) {                                                      \
      got_ = std::string("another exception: ") + e_.what();                                  \
    }                                                                                         \
    if (!ok_)                                                                                 \
      ::harness::fail(__FILE__, __LINE__,                                                     \
                      std::string(#expr " should throw " #ExType " containing '") + (substr) + \
                          "', got " + got_);                                                  \
  } while (0)

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

  std::vector<ColumnSpec> specs() const {
    std::vector<ColumnSpec> s;
    auto add = [&](const char* name, const void* base, int64_t pitch, int64_t row_bytes) {
      ColumnSpec c;
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

// Checks one batch against the plan and the source: step, row count, the index and valid parts,
// and every column's rows (bytes equal the source row of the expected id; the "id" column is
// also checked as a value). Returns "" when right, else what is wrong.
std::string batch_error(const BatchLayout& L, const EpochPlan& plan, int64_t step,
                        const Batch& b) {
  std::ostringstream err;
  if (!b.buffer) return "no buffer";
  if (b.step != step) {
    err << "step " << b.step << " where " << step << " was expected";
    return err.str();
  }
  const BatchSpan span = plan.batch(step);
  if (b.rows != span.count) {
    err << "step " << step << ": " << b.rows << " rows, expected " << span.count;
    return err.str();
  }
  if (b.buffer->size() < L.total_bytes) return "buffer smaller than the layout";
  std::vector<int64_t> ids(static_cast<size_t>(span.count));
  std::unique_ptr<bool[]> valid(new bool[static_cast<size_t>(span.count) + 1]);
  plan.fill_ids(span, ids.data(), valid.get());
  const std::byte* base = b.buffer->data();
  for (int64_t i = 0; i < span.count; ++i) {
    const int64_t id = ids[static_cast<size_t>(i)];
    if (L.with_index) {
      int64_t got;
      std::memcpy(&got, base + L.index_offset + sizeof(int64_t) * static_cast<size_t>(i), 8);
      if (got != id) {
        err << "step " << step << " row " << i << ": index " << got << ", expected " << id;
        return err.str();
      }
    }
    if (L.with_valid) {
      unsigned char got;
      std::memcpy(&got, base + L.valid_offset + static_cast<size_t>(i), 1);
      if (got != (valid[i] ? 1 : 0)) {
        err << "step " << step << " row " << i << ": valid " << int(got) << ", expected "
            << valid[i];
        return err.str();
      }
    }
    for (size_t c = 0; c < L.columns.size(); ++c) {
      const ColumnSpec& col = L.columns[c];
      const std::byte* row = base + L.column_offsets[c] + static_cast<size_t>(i * col.row_bytes);
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

// Blocks (in 20 ms slices, as the Python layer does) until the next batch or the end.
NextStatus next_blocking(Pipeline& p, int output, Batch* b) {
  for (;;) {
    const NextStatus s = p.next(output, milliseconds(20), b);
    if (s != NextStatus::Timeout) return s;
  }
}

// Consumes every batch of one output in order, checking each; returns the valid ids seen
// (all ids if the layout has no valid part: then padding counts too) in *ids if given.
int64_t consume_all(const BatchLayout& L, Pipeline& p, int output, std::vector<int64_t>* ids,
                    std::vector<std::shared_ptr<HostBuffer>>* keep = nullptr) {
  const EpochPlan& plan = p.plan(output);
  int64_t step = 0;
  for (;;) {
    Batch b;
    const NextStatus s = next_blocking(p, output, &b);
    if (s == NextStatus::End) break;
    const std::string e = batch_error(L, plan, step, b);
    CHECK_MSG(e.empty(), "output " << output << ": " << e);
    if (ids) {
      const BatchSpan span = plan.batch(step);
      std::vector<int64_t> got(static_cast<size_t>(span.count));
      std::unique_ptr<bool[]> valid(new bool[static_cast<size_t>(span.count) + 1]);
      plan.fill_ids(span, got.data(), valid.get());
      for (int64_t i = 0; i < span.count; ++i)
        if (valid[i]) ids->push_back(got[static_cast<size_t>(i)]);
    }
    if (keep) keep->push_back(b.buffer);
    ++step;
  }
  CHECK_MSG(step == plan.num_batches(),
            "output " << output << " gave " << step << " of " << plan.num_batches() << " batches");
  Batch b;
  CHECK(p.next(output, milliseconds(1), &b) == NextStatus::End);  // End stays End
  CHECK(p.handed_out(output) == plan.num_batches());
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

// A HostAllocator that counts, and optionally fails after `limit` allocations.
class CountingAllocator final : public HostAllocator {
 public:
  explicit CountingAllocator(int64_t limit = -1) : limit_(limit) {}
  void* allocate(size_t bytes) override {
    if (limit_ >= 0 && allocated_.load() >= limit_)
      throw std::runtime_error("test allocator exhausted");
    ++allocated_;
    return ::operator new(bytes);
  }
  void deallocate(void* p, size_t) noexcept override {
    ++freed_;
    ::operator delete(p);
  }
  int64_t allocated() const { return allocated_.load(); }
  int64_t freed() const { return freed_.load(); }

 private:
  const int64_t limit_;
  std::atomic<int64_t> allocated_{0}, freed_{0};
};

// A HostAllocator whose allocate() blocks until the gate opens: holds workers mid-build.
class GatedAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    std::unique_lock<std::mutex> lock(mutex_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    --waiting_;
    return ::operator new(bytes);
  }
  void deallocate(void* p, size_t) noexcept override { ::operator delete(p); }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
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

TEST_CASE(gather_rows_every_size_and_overlapping_windows) {
  std::mt19937_64 rng(7);
  for (int64_t row_bytes : {1, 2, 3, 4, 8, 16, 24, 32, 64, 100, 128, 256, 300}) {
    for (int64_t pitch : {row_bytes, row_bytes + 5, std::max<int64_t>(1, row_bytes / 2)}) {
      const int64_t rows = 97;
      std::vector<uint8_t> src(static_cast<size_t>((rows - 1) * pitch + row_bytes));
      for (auto& x : src) x = static_cast<uint8_t>(rng());
      ColumnSpec c;
      c.name = "c";
      c.base = reinterpret_cast<const std::byte*>(src.data());
      c.rows = rows;
      c.pitch = pitch;
      c.row_bytes = row_bytes;
      std::vector<int64_t> ids(300);
      for (auto& id : ids) id = static_cast<int64_t>(rng() % rows);
      ids[0] = rows - 1;  // the last row ends at the end of the source
      for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{300}}) {
        std::vector<uint8_t> dst(static_cast<size_t>(count * row_bytes) + 1, 0xEE);
        gather_rows(c, ids.data(), count, reinterpret_cast<std::byte*>(dst.data()));
        bool ok = true;
        for (int64_t i = 0; i < count; ++i)
          ok &= std::memcmp(dst.data() + i * row_bytes, src.data() + ids[i] * pitch,
                            static_cast<size_t>(row_bytes)) == 0;
        ok &= dst.back() == 0xEE;  // nothing written past the batch
        CHECK_MSG(ok, "row_bytes=" << row_bytes << " pitch=" << pitch << " count=" << count);
      }
    }
  }
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
  {
    auto pool = BufferPool::create(1000, 2, alloc);
    CHECK(pool->buffer_bytes() == 1000);
    auto a = pool->acquire(), b = pool->acquire(), c = pool->acquire();  // never waits: grows
    CHECK(pool->allocations() == 3 && pool->live_buffers() == 3);
    CHECK(a->size() == 1000 && a->data() != b->data() && b->data() != c->data());
    for (int k = 0; k < 3; ++k) pool->left_pipeline();  // all three handed to the user
    std::memset(a->data(), 1, 1000);
    a.reset();
    b.reset();
    c.reset();  // keep=2: the third is freed
    CHECK(pool->live_buffers() == 2);
    auto d = pool->acquire();  // recycled
    CHECK(pool->allocations() == 3);
    pool->left_pipeline();
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
    pool->left_pipeline();
  }
  CHECK(alloc->allocated() == alloc->freed());
  // A failing allocator: acquire throws, and the pool stays usable.
  {
    auto failing = std::make_shared<CountingAllocator>(1);
    auto pool = BufferPool::create(64, 4, failing);
    auto x = pool->acquire();
    CHECK_THROWS(pool->acquire(), std::runtime_error, "exhausted");
    pool->left_pipeline();
    x.reset();
    auto y = pool->acquire();  // the recycled one
    CHECK(y != nullptr && pool->allocations() == 1);
    pool->left_pipeline();
  }
  // Concurrent acquire / write / release.
  {
    auto pool = BufferPool::create(256, 3, alloc);
    std::vector<std::thread> threads;
    std::atomic<int> bad{0};
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int k = 0; k < 1500; ++k) {
          auto buf = pool->acquire();
          pool->left_pipeline();
          std::memset(buf->data(), t * 16 + (k & 15), buf->size());
          for (size_t i = 0; i < buf->size(); ++i)
            if (static_cast<int>(buf->data()[i]) != t * 16 + (k & 15)) ++bad;
        }
      });
    for (auto& th : threads) th.join();
    CHECK(bad.load() == 0);
    CHECK_MSG(pool->live_buffers() <= 3, pool->live_buffers());
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
        CHECK_MSG(e.buffer_pool().live_buffers() <= prefetch + 1,
                  "live " << e.buffer_pool().live_buffers() << " prefetch " << prefetch);
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
      CHECK_MSG(e.buffer_pool().live_buffers() <= o.prefetch * outs + 1,
                "live " << e.buffer_pool().live_buffers());
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
        const std::string err = batch_error(e.layout(), p->plan(d), s, b);
        if (!err.empty() && ok) CHECK_MSG(err.empty(), "output " << d << ": " << err);
        ok &= err.empty();
        const int64_t* ids = reinterpret_cast<const int64_t*>(b.buffer->data() + e.layout().index_offset);
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
    // Each output has at most `prefetch` batches in flight and this consumer holds none between
    // calls, so the pool should need about prefetch * outputs + 1 buffers for the whole epoch
    // instead of allocating (and freeing) a buffer per batch. (Pinned memory makes each
    // allocation expensive.)
    CHECK_MSG(e.buffer_pool().allocations() <= prefetch * outs + 2,
              "prefetch " << prefetch << ", " << outs << " outputs, " << nb * outs
                          << " batches: " << e.buffer_pool().allocations()
                          << " buffer allocations");
    CHECK_MSG(e.buffer_pool().live_buffers() <= prefetch * outs + 1,
              "live " << e.buffer_pool().live_buffers());
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
  const SamplerConfig c = make_cfg(src.n, 24, 1, 0, true);
  // cancel(): the consumer's next() throws; the engine starts the next epoch normally.
  {
    auto p = e.start(make_plans(c, {0}, 0));
    Batch kept;
    for (int64_t s = 0; s < 3; ++s) {
      Batch b;
      CHECK(next_blocking(*p, 0, &b) == NextStatus::Ok);
      CHECK(batch_error(e.layout(), p->plan(0), s, b).empty());
      kept = b;
    }
    p->cancel();
    Batch b;
    CHECK_THROWS(p->next(0, milliseconds(100), &b), std::runtime_error, "cancelled");
    CHECK_THROWS(p->next(0, milliseconds(100), &b), std::runtime_error, "cancelled");
    auto p2 = e.start(make_plans(c, {0}, 1));
    consume_all(e.layout(), *p2, 0, nullptr);
    CHECK(batch_error(e.layout(), p->plan(0), 2, kept).empty());  // a handed-out batch stays
    CHECK_MSG(e.buffer_pool().live_buffers() <= o.prefetch + 1 + 1,
              "live " << e.buffer_pool().live_buffers());
  }
  // start() mid-epoch cancels the running epoch; many quick restarts.
  std::mt19937 rng(1);
  std::shared_ptr<Pipeline> prev;
  for (int it = 0; it < 40; ++it) {
    auto p = e.start(make_plans(c, {0}, it % 5));
    if (prev) {
      Batch b;
      CHECK_THROWS(prev->next(0, milliseconds(10), &b), std::runtime_error, "cancelled");
    }
    const int take = static_cast<int>(rng() % 4);
    for (int s = 0; s < take; ++s) {
      Batch b;
      CHECK(next_blocking(*p, 0, &b) == NextStatus::Ok);
      CHECK(batch_error(e.layout(), p->plan(0), s, b).empty());
    }
    prev = p;
  }
  prev.reset();
  // Batches built but never handed out by those cancelled epochs left the pipeline: a whole
  // epoch now recycles its buffers instead of allocating one per batch.
  {
    auto p = e.start(make_plans(c, {0}, 7));
    const int64_t before = e.buffer_pool().allocations();
    consume_all(e.layout(), *p, 0, nullptr);
    CHECK_MSG(e.buffer_pool().allocations() - before <= o.prefetch + 2,
              e.buffer_pool().allocations() - before << " allocations for "
                                                      << p->plan(0).num_batches() << " batches");
  }
  // A consumer thread blocked in next() when another thread starts a new epoch.
  for (int it = 0; it < 10; ++it) {
    auto p = e.start(make_plans(c, {0}, 0));
    std::atomic<bool> done{false};
    std::thread consumer([&] {
      try {
        for (int64_t s = 0;; ++s) {
          Batch b;
          if (next_blocking(*p, 0, &b) == NextStatus::End) break;
          const std::string err = batch_error(e.layout(), p->plan(0), s, b);
          CHECK_MSG(err.empty(), err);
        }
      } catch (const std::runtime_error& ex) {
        CHECK_MSG(std::strstr(ex.what(), "cancelled") != nullptr, ex.what());
      }
      done = true;
    });
    std::this_thread::sleep_for(milliseconds(it % 3));
    auto q = e.start(make_plans(c, {0}, 1));
    consumer.join();
    CHECK(done.load());
    consume_all(e.layout(), *q, 0, nullptr);
  }
  CHECK_MSG(e.buffer_pool().live_buffers() <= o.prefetch + 1,
            "live " << e.buffer_pool().live_buffers());
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
      CHECK(batch_error(e->layout(), p->plan(0), 0, first).empty());
    }
    // A consumer blocked in next() while the engine goes away: a batch or "cancelled", no hang.
    std::thread consumer;
    if (it % 3 == 0)
      consumer = std::thread([p] {
        try {
          for (;;) {
            Batch b;
            if (next_blocking(*p, 0, &b) == NextStatus::End) break;
          }
        } catch (const std::runtime_error& ex) {
          CHECK_MSG(std::strstr(ex.what(), "cancelled") != nullptr, ex.what());
        }
      });
    const BatchLayout layout = e->layout();
    e.reset();  // cancels and joins while workers gather
    if (consumer.joinable()) consumer.join();
    // The batch and the pipeline outlive the engine (the buffer keeps its pool alive).
    if (first.buffer) CHECK(batch_error(layout, p->plan(0), 0, first).empty());
    Batch b;
    if (it % 3 != 0) CHECK_THROWS(p->next(0, milliseconds(10), &b), std::runtime_error, "cancelled");
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
        const NextStatus s = p->next(0, milliseconds(10000), &b);
        what = s == NextStatus::Ok ? "a batch" : s == NextStatus::End ? "End" : "Timeout";
      } catch (const std::runtime_error& ex) {
        what = ex.what();
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
    // The blocked consumer wakes at once with "cancelled", though no worker has finished.
    const auto t0 = std::chrono::steady_clock::now();
    while (!woke && seconds_since(t0) < 5) std::this_thread::sleep_for(milliseconds(5));
    CHECK_MSG(woke.load(), "how=" << how << ": consumer still blocked in next() 5 s after cancel");
    std::this_thread::sleep_for(milliseconds(50));
    if (how != 0) CHECK_MSG(!stopped.load(), "how=" << how << ": returned before the workers did");
    gate->open();
    consumer.join();
    if (stopper.joinable()) stopper.join();
    CHECK_MSG(what.find("cancelled") != std::string::npos, "how=" << how << ": " << what);
    CHECK_MSG(waited >= 0 && waited < 5, "how=" << how << ": waited " << waited << " s");
    Batch b;
    CHECK_THROWS(p->next(0, milliseconds(10), &b), std::runtime_error, "cancelled");
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
  auto e = std::make_unique<Engine>(src.specs(), o);
  const SamplerConfig c = make_cfg(src.n, 16, 1, 0, true, Order::Random, Even::Mask);
  const EpochPlan plan0(c, 0, 0);
  std::vector<std::shared_ptr<HostBuffer>> held;
  {
    auto p = e->start(make_plans(c, {0}, 0));
    consume_all(e->layout(), *p, 0, nullptr, &held);  // keeps every batch: the pool must grow
  }
  const int64_t nb = plan0.num_batches();
  CHECK(static_cast<int64_t>(held.size()) == nb);
  CHECK_MSG(e->buffer_pool().allocations() >= nb, e->buffer_pool().allocations());
  std::set<const std::byte*> distinct;
  for (auto& h : held) distinct.insert(h->data());
  CHECK(static_cast<int64_t>(distinct.size()) == nb);
  auto check_held = [&](const char* when) {
    bool ok = true;
    for (int64_t s = 0; s < nb; ++s) {
      if (!held[static_cast<size_t>(s)]) continue;
      Batch b;
      b.buffer = held[static_cast<size_t>(s)];
      b.rows = plan0.batch(s).count;
      b.step = s;
      const std::string err = batch_error(e->layout(), plan0, s, b);
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
  // Release half: the pool keeps at most prefetch + 1 of them.
  for (size_t s = 0; s < held.size(); s += 2) held[s].reset();
  const int64_t still = static_cast<int64_t>((held.size()) / 2);
  CHECK_MSG(e->buffer_pool().live_buffers() <= o.prefetch + 1 + still,
            "live " << e->buffer_pool().live_buffers() << ", held " << still);
  {
    auto p = e->start(make_plans(c, {0}, 3));
    consume_all(e->layout(), *p, 0, nullptr);
  }
  check_held("after releasing half and another epoch");
  // The engine goes; held batches stay valid; releasing them later frees everything (ASan).
  const BatchLayout layout = e->layout();
  e.reset();
  bool ok = true;
  for (int64_t s = 1; s < nb; s += 2) {
    Batch b;
    b.buffer = held[static_cast<size_t>(s)];
    b.rows = plan0.batch(s).count;
    b.step = s;
    ok &= batch_error(layout, plan0, s, b).empty();
  }
  CHECK(ok);
  held.clear();
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
      std::string message;
      bool threw = false, ended = false;
      try {
        for (int64_t s = 0;; ++s) {
          Batch b;
          if (next_blocking(*p, 0, &b) == NextStatus::End) {
            ended = true;
            break;
          }
          CHECK(batch_error(e.layout(), p->plan(0), s, b).empty());
          ++ok_batches;
        }
      } catch (const std::runtime_error& ex) {
        threw = true;
        message = ex.what();
      }
      CHECK_MSG(threw && !ended, "fail_at_step " << fail_step << " did not throw");
      CHECK_MSG(ok_batches <= fail_step, ok_batches << " batches before the failure");
      CHECK_MSG(message.find("injected failure") != std::string::npos, message);
      CHECK_MSG(message.find("batch " + std::to_string(fail_step)) != std::string::npos, message);
      Batch b;
      CHECK_THROWS(p->next(0, milliseconds(10), &b), std::runtime_error, "injected failure");
      // The engine recovers: the next epoch is whole.
      auto q = e.start(make_plans(c, ranks, 1));
      for (int d = 0; d < outs; ++d) consume_all(e.layout(), *q, d, nullptr);
      CHECK_MSG(e.buffer_pool().live_buffers() <= o.prefetch * outs + 1,
                "live " << e.buffer_pool().live_buffers());
    }
  }
  // A failing allocation (e.g. pinned memory exhausted) is a worker failure too.
  {
    auto alloc = std::make_shared<CountingAllocator>(6);
    EngineOptions o;
    o.num_threads = 2;
    o.prefetch = 2;
    o.batch_size = 10;
    {
      Engine e(src.specs(), o, alloc);
      auto p = e.start(make_plans(make_cfg(src.n, 10, 1, 0, false), {0}, 0));
      std::vector<Batch> keep;  // holding batches forces new allocations
      std::string message;
      try {
        for (;;) {
          Batch b;
          if (next_blocking(*p, 0, &b) == NextStatus::End) break;
          keep.push_back(b);
        }
      } catch (const std::runtime_error& ex) {
        message = ex.what();
      }
      CHECK_MSG(message.find("test allocator exhausted") != std::string::npos,
                "got '" << message << "'");
      CHECK(keep.size() <= 6);
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
  Engine index_only({}, io);
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
            if (next_blocking(*p, d, &b) == NextStatus::End) {
              CHECK(s == p->plan(d).num_batches());
              break;
            }
            const std::string err = batch_error(layout, p->plan(d), s, b);
            CHECK_MSG(err.empty(), "iteration " << it << " output " << d << ": " << err);
            ++batches;
          }
        } catch (const std::runtime_error& ex) {
          CHECK_MSG(std::strstr(ex.what(), "cancelled") != nullptr, ex.what());
          ++cancels;
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
    // Starting the next epoch cancels this one: consumers still reading get "cancelled".
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
  const uint64_t gen = fork_generation();
  const int rc = run_in_child([&] {
    if (fork_generation() == gen) return false;
    bool threw = false;
    try {
      e->check_not_forked();
    } catch (const std::runtime_error& ex) {
      threw = std::strstr(ex.what(), "fork") != nullptr;
    }
    b.buffer.reset();  // returns to a pool whose mutex a parent thread may hold: must not lock
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
    CHECK(batch_error(e->layout(), p->plan(0), s, next).empty());
  }
  delete e;
}

// ================================================================ main

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const char* filter = argc > 1 ? argv[1] : nullptr;
  int timeout_s = 60;
  if (const char* t = std::getenv("FASTLOAD_TEST_CASE_TIMEOUT")) timeout_s = std::max(1, std::atoi(t));
  harness::Watchdog watchdog(timeout_s);
  int passed = 0, failed = 0;
  for (const harness::Case& c : harness::registry()) {
    if (filter && !std::strstr(c.name, filter)) continue;
    std::printf("[ RUN  ] %s\n", c.name);
    harness::g_case_failures = 0;
    watchdog.arm(c.name);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      c.fn();
    } catch (const std::exception& ex) {
      harness::fail(__FILE__, __LINE__, std::string("unexpected exception: ") + ex.what());
    } catch (...) {
      harness::fail(__FILE__, __LINE__, "unexpected non-standard exception");
    }
    watchdog.disarm();
    const long long ms = std::chrono::duration_cast<milliseconds>(
                             std::chrono::steady_clock::now() - t0).count();
    const bool ok = harness::g_case_failures.load() == 0;
    (ok ? passed : failed)++;
    std::printf("[ %s ] %s (%lld ms)\n", ok ? "PASS" : "FAIL", c.name, ms);
  }
  std::printf("test_core: %d passed, %d failed (%lld checks)\n", passed, failed,
              static_cast<long long>(harness::g_checks.load()));
  return failed ? 1 : 0;
}
