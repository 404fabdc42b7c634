// What the C++ tests of the core share (test_sampler.cpp, test_gather.cpp, test_thread_pool.cpp,
// test_buffer_pool.cpp, test_engine.cpp, test_pipeline.cpp, test_fork_guard.cpp): sampler
// configurations, a forked-child runner, an in-memory source whose values are a function of the
// row id, the check of every batch against its plan and source, consumers, and counting and gated
// allocators. The case runner and CHECK macros are harness.h's.
#pragma once
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

// The core's tests read its names unqualified.
using namespace fastload;
using std::chrono::milliseconds;

inline SamplerConfig make_cfg(int64_t n, int64_t batch, int64_t world, int64_t rank, bool shuffle,
                       Order order = Order::Random, Even even = Even::Pad, bool drop_last = false,
                       uint64_t seed = 0, int64_t block_size = 4096) {
  return SamplerConfig(n, batch, world, rank, seed, shuffle, order, even, drop_last, block_size);
}

// The engine options of most cases: `threads` workers, `prefetch` batches ahead, batches of
// `batch` rows with an index part, and a valid part unless with_valid is false.
inline EngineOptions engine_options(int threads, int64_t prefetch, int64_t batch, bool with_valid = true) {
  EngineOptions o;
  o.num_threads = threads;
  o.prefetch = prefetch;
  o.with_index = true;
  o.with_valid = with_valid;
  o.batch_size = batch;
  return o;
}

// A column of `rows` rows, `pitch` bytes apart, of which a batch takes `row_bytes` each.
inline ArrayColumn array_column(const char* name, const void* base, int64_t rows, int64_t pitch, int64_t row_bytes) {
  ArrayColumn c;
  c.name = name;
  c.base = static_cast<const std::byte*>(base);
  c.rows = rows;
  c.pitch = pitch;
  c.row_bytes = row_bytes;
  return c;
}

inline const char* even_name(Even e) { return e == Even::Pad ? "pad" : e == Even::Drop ? "drop" : "mask"; }

inline std::string describe(const SamplerConfig& c) {
  std::ostringstream os;
  os << "N=" << c.num_samples << " B=" << c.batch_size << " W=" << c.world_size
     << " r=" << c.rank << " shuffle=" << c.shuffle
     << " order=" << (c.order == Order::Block ? "block" : "random") << " bs=" << c.block_size
     << " even=" << even_name(c.even) << " drop_last=" << c.drop_last << " seed=" << c.seed;
  return os.str();
}

// Runs fn in a forked child so a crash (or a sanitizer report) there is a failed check here,
// not the end of the test process. Returns the child's exit status (0 = fn returned true).
inline int run_in_child(const std::function<bool()>& fn) {
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
      s.push_back(array_column(name, base, n, pitch, row_bytes));
    };
    add("id", ids.data(), 4, 4);
    add("wide", wide.data(), 24, 24);
    add("tok", tokens.data(), kWinStride * 2, kWinLen * 2);
    add("byte", bytes.data(), 1, 1);
    if (big_row_bytes) add("big", big.data(), big_row_bytes, big_row_bytes);
    return s;
  }
};

// Parts a device copy or a DLPack consumer may read need this alignment.
constexpr uintptr_t kPartAlign = 256;

// Checks one batch against the plan and the source: step, row count, one buffer per layout part
// (each big enough and 256-byte aligned), the index and valid parts, and every column's rows
// (bytes equal the source row of the expected id; the "id" column is also checked as a value).

// The columns an array source gathers (what the tests compare batches with).
inline const std::vector<ArrayColumn>& columns_of(const std::shared_ptr<BatchSource>& source) {
  return dynamic_cast<const ArraySource&>(*source).columns();
}

// The ids of one step of a plan, and which of them are valid (not padding).
struct StepIds {
  std::vector<int64_t> ids;
  std::unique_ptr<bool[]> valid;
};
inline StepIds step_ids(const EpochPlan& plan, const BatchSpan& span) {
  StepIds out{std::vector<int64_t>(static_cast<size_t>(span.count)),
              std::unique_ptr<bool[]>(new bool[static_cast<size_t>(span.count) + 1])};
  plan.fill_ids(span, out.ids.data(), out.valid.get());
  return out;
}

// Appends the valid ids of step `step` of `plan` to *ids.
inline void append_valid_ids(const EpochPlan& plan, int64_t step, std::vector<int64_t>* ids) {
  const StepIds got = step_ids(plan, plan.batch(step));
  for (size_t i = 0; i < got.ids.size(); ++i)
    if (got.valid[i]) ids->push_back(got.ids[i]);
}

// Returns "" when right, else what is wrong.
inline std::string batch_error(const std::vector<ArrayColumn>& columns, const BatchLayout& L, const EpochPlan& plan,
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
  const StepIds expected = step_ids(plan, span);
  const std::vector<int64_t>& ids = expected.ids;
  const bool* valid = expected.valid.get();
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
inline std::string batch_error(const std::vector<ArrayColumn>& columns, const BatchLayout& L, const BatchPlan& plan,
                        int64_t step, const Batch& b) {
  return batch_error(columns, L, dynamic_cast<const EpochPlan&>(plan), step, b);
}

// What the Python binding does when it hands a batch out: every part becomes the user's.
inline void hand_out(Batch& b) {
  for (auto& part : b.parts) part->hand_to_user();
}

inline std::string show(const BufferPoolCounts& c) {
  std::ostringstream os;
  os << "allocations " << c.allocations << " frees " << c.frees << " free " << c.free
     << " with_loader " << c.with_loader << " with_user " << c.with_user;
  return os.str();
}

inline int64_t num_parts(const Engine& e) { return static_cast<int64_t>(e.layout().num_parts()); }

// Once an epoch is over and its batches dropped, every buffer is a spare: none is counted as
// the loader's or the user's.
inline bool all_returned(const BufferPoolCounts& c) {
  return c.with_loader == 0 && c.with_user == 0 && c.free == c.live();
}

// Blocks (in 20 ms slices, as the Python layer does) until the next batch or the end.
inline NextStatus next_blocking(Pipeline& p, int output, Batch* b) {
  for (;;) {
    const NextStatus s = p.next(output, milliseconds(20), b);
    if (s != NextStatus::Timeout) return s;
  }
}

inline const char* status_name(NextStatus s) {
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
inline int64_t consume_all(const BatchLayout& L, Pipeline& p, int output, std::vector<int64_t>* ids,
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
    if (ids) append_valid_ids(plan, step, ids);
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

inline std::vector<EpochPlan> make_plans(const SamplerConfig& base, const std::vector<int64_t>& ranks,
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
inline bool exactly_once(std::vector<int64_t> ids, int64_t n) {
  if (static_cast<int64_t>(ids.size()) != n) return false;
  std::sort(ids.begin(), ids.end());
  for (int64_t i = 0; i < n; ++i)
    if (ids[static_cast<size_t>(i)] != i) return false;
  return true;
}

// Test allocators hand out 256-byte aligned memory, as the core's own and the pinned one do, so
// that batch_error's alignment check holds for every batch.
inline void* aligned_new(size_t bytes) { return ::operator new(bytes, std::align_val_t(kPartAlign)); }
inline void aligned_delete(void* p) { ::operator delete(p, std::align_val_t(kPartAlign)); }

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

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
