// Tests of the CUDA transfer engine (csrc/cuda) against the stand-in driver (tests/fake_cuda),
// meant to run under ThreadSanitizer and under AddressSanitizer + UBSan: see run_sanitizers.sh,
// which builds the stand-in under the same sanitizer and points FASTLOAD_LIBCUDA at it.
//
// Every batch is read back from "device" memory on the consumer's stream and compared with the
// source rows. Each case of correct use also checks that the stand-in saw no misuse; the
// deliberate misuses (cuda::Misuse) must each be caught. Those race on purpose (that is the bug
// they stand for), so they are left out of the ThreadSanitizer build.
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/array_source.h"
#include "core/engine.h"
#include "core/pipeline.h"
#include "cuda/deferred_free.h"
#include "cuda/driver.h"
#include "cuda/handles.h"
#include "cuda/memory.h"
#include "cuda/transfer_engine.h"
#include "core_fixtures.h"

#if defined(__SANITIZE_THREAD__)
#define FASTLOAD_TSAN 1
#else
#define FASTLOAD_TSAN 0
#endif

namespace api = fastload::cuda::api;

namespace {

// ---------------------------------------------------------------- the stand-in's controls

struct Fake {
  int (*misuse_count)() = nullptr;
  int (*misuse_message)(int, char*, int) = nullptr;
  void (*reset_misuses)() = nullptr;
  int (*configure)(const char*, long long) = nullptr;
  long long (*stat)(const char*) = nullptr;
  long long (*calls)(const char*) = nullptr;  // every thread's calls of an entry point, ever
};

// The control functions of the library the driver loader opened (the same path: dlopen gives
// back the same handle). Ends the process if FASTLOAD_LIBCUDA does not name the stand-in.
const Fake& fake() {
  static const Fake f = [] {
    const char* path = std::getenv("FASTLOAD_LIBCUDA");
    if (!path || !*path) {
      std::printf("FASTLOAD_LIBCUDA is not set: point it at the stand-in driver "
                  "(python tests/fake_cuda/build.py OUTDIR prints its path)\n");
      std::exit(2);
    }
    try {
      cuda::driver();  // loads it first, as the engine does
    } catch (const std::exception& e) {
      std::printf("the stand-in driver at %s cannot be used: %s\n", path, e.what());
      std::exit(2);
    }
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    Fake out;
    auto get = [&](const char* name, auto& fn) {
      fn = lib ? reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name)) : nullptr;
      if (!fn) {
        std::printf("%s has no %s: not the stand-in driver?\n", path, name);
        std::exit(2);
      }
    };
    get("fake_cuda_misuse_count", out.misuse_count);
    get("fake_cuda_misuse_message", out.misuse_message);
    get("fake_cuda_reset_misuses", out.reset_misuses);
    get("fake_cuda_configure", out.configure);
    get("fake_cuda_stat", out.stat);
    get("fake_cuda_calls", out.calls);
    return out;
  }();
  return f;
}

std::vector<std::string> misuse_messages() {
  std::vector<std::string> out;
  char buf[1024];
  for (int i = 0; fake().misuse_message(i, buf, sizeof buf) >= 0; ++i) out.emplace_back(buf);
  return out;
}

std::string first_misuses() {
  std::ostringstream os;
  const std::vector<std::string> m = misuse_messages();
  for (size_t i = 0; i < m.size() && i < 3; ++i) os << "\n      " << m[i];
  return os.str();
}

bool any_contains(const std::vector<std::string>& messages, const char* what) {
  for (const std::string& m : messages)
    if (m.find(what) != std::string::npos) return true;
  return false;
}

// Sets a stand-in setting for a scope and puts the old value back.
class Setting {
 public:
  Setting(const char* key, long long value) : key_(key), old_(fake().stat(key)) {
    if (fake().configure(key, value) != 0) throw std::runtime_error(std::string("cannot set ") + key);
  }
  ~Setting() { fake().configure(key_, old_); }

 private:
  const char* key_;
  long long old_;
};

// Every case starts with no misuse on record; a case of correct use ends with none either.
void start_clean() { fake().reset_misuses(); }
#define CHECK_NO_MISUSE() \
  CHECK_MSG(fake().misuse_count() == 0, fake().misuse_count() << " misuses:" << first_misuses())

// Once everything a case made is gone, the stand-in holds nothing of it: no device or pinned
// memory, no event, no stream, no retained context.
void check_all_released(const char* when) {
  cuda::flush_deferred_frees();  // batches that outlived their loader were freed on its thread
  for (const char* key : {"device_allocations", "pinned_allocations", "live_events", "live_streams",
                          "contexts_retained", "pending_ops"})
    CHECK_MSG(fake().stat(key) == 0, when << ": " << key << " = " << fake().stat(key));
}

// ---------------------------------------------------------------- data

// Columns whose bytes are a known function of the row id: "x" int32 3*id+1, "feat" 96 bytes per
// row, "odd" 3 bytes per row (a part whose size is no multiple of anything). Not the core tests'
// Source (core_fixtures.h): these are the columns of a device copy's edge cases.
struct TransferSource {
  int64_t n;
  std::vector<int32_t> x;
  std::vector<uint8_t> feat, odd;
  explicit TransferSource(int64_t rows) : n(rows), x(rows), feat(rows * 96), odd(rows * 3) {
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<int32_t>(3 * i + 1);
    for (size_t k = 0; k < feat.size(); ++k) feat[k] = static_cast<uint8_t>(k * 2654435761u >> 11);
    for (size_t k = 0; k < odd.size(); ++k) odd[k] = static_cast<uint8_t>(k * 7 + 3);
  }
  std::vector<ArrayColumn> specs() const {
    return {array_column("x", x.data(), n, 4, 4), array_column("feat", feat.data(), n, 96, 96),
            array_column("odd", odd.data(), n, 3, 3)};
  }
};

// The bytes part `p` of a batch of `rows` rows must hold.
std::vector<uint8_t> expected_part(const std::vector<ArrayColumn>& columns, const BatchLayout& L, const EpochPlan& plan,
                                   int64_t step, size_t p) {
  const BatchSpan span = plan.batch(step);
  const StepIds expected = step_ids(plan, span);
  const std::vector<int64_t>& ids = expected.ids;
  const bool* valid = expected.valid.get();
  const size_t row = L.part_row_bytes[p];
  std::vector<uint8_t> out(row * static_cast<size_t>(span.count));
  for (int64_t i = 0; i < span.count; ++i) {
    uint8_t* dst = out.data() + row * static_cast<size_t>(i);
    if (static_cast<int>(p) == L.index_part) {
      std::memcpy(dst, &ids[static_cast<size_t>(i)], sizeof(int64_t));
    } else if (static_cast<int>(p) == L.valid_part) {
      *dst = valid[i] ? 1 : 0;
    } else {
      const ArrayColumn& c = columns[p];
      std::memcpy(dst, c.base + ids[static_cast<size_t>(i)] * c.pitch, row);
    }
  }
  return out;
}

// Reads every part of a batch back on the consumer's stream (the stream it was handed out on).
std::vector<std::vector<uint8_t>> read_back(const BatchLayout& L, const cuda::DeviceBatch& b,
                                            api::CUstream stream) {
  const api::Functions& f = cuda::driver();
  std::vector<std::vector<uint8_t>> parts(b.parts.size());
  for (size_t p = 0; p < b.parts.size(); ++p) {
    parts[p].resize(L.part_row_bytes[p] * static_cast<size_t>(b.rows));
    if (!parts[p].empty())
      cuda::check(f.cuMemcpyDtoHAsync(parts[p].data(), b.parts[p]->ptr(), parts[p].size(), stream),
                  "cuMemcpyDtoHAsync");
  }
  cuda::check(f.cuStreamSynchronize(stream), "cuStreamSynchronize");
  return parts;
}

// "" if the batch read back on `stream` is step `step` of `plan` on `device`, else what is wrong.
std::string batch_error(const std::vector<ArrayColumn>& columns, const BatchLayout& L, const EpochPlan& plan,
                        int64_t step, int device, const cuda::DeviceBatch& b, api::CUstream stream) {
  std::ostringstream err;
  if (b.step != step) {
    err << "step " << b.step << " where " << step << " was expected";
    return err.str();
  }
  if (b.rows != plan.batch(step).count) {
    err << "step " << step << ": " << b.rows << " rows, expected " << plan.batch(step).count;
    return err.str();
  }
  if (b.parts.size() != L.num_parts()) {
    err << b.parts.size() << " parts, layout has " << L.num_parts();
    return err.str();
  }
  for (size_t p = 0; p < b.parts.size(); ++p) {
    if (b.parts[p]->device() != device) {
      err << "step " << step << " part " << p << " is on device " << b.parts[p]->device();
      return err.str();
    }
    if (b.parts[p]->size() < L.part_bytes(p)) {
      err << "step " << step << " part " << p << ": device buffer of " << b.parts[p]->size() << " bytes";
      return err.str();
    }
  }
  const std::vector<std::vector<uint8_t>> got = read_back(L, b, stream);
  for (size_t p = 0; p < got.size(); ++p)
    if (got[p] != expected_part(columns, L, plan, step, p)) {
      err << "step " << step << " part " << p << ": device bytes differ from the source rows";
      return err.str();
    }
  return "";
}

// The same for a pipeline's plan (every plan of these tests is an epoch's).
std::string batch_error(const std::vector<ArrayColumn>& columns, const BatchLayout& L, const BatchPlan& plan,
                        int64_t step, int device, const cuda::DeviceBatch& b, api::CUstream stream) {
  return batch_error(columns, L, dynamic_cast<const EpochPlan&>(plan), step, device, b, stream);
}

// What a user's last reference does (see csrc/bindings/device_part.h): the buffers may be
// rewritten once the work queued so far on `stream` has run.
void release(cuda::DeviceBatch& b, api::CUstream stream) {
  for (auto& part : b.parts) part->release_after(stream);
  b = cuda::DeviceBatch();
}

// One loader as the binding wires it: a host engine whose outputs are all native, page-locked
// host buffers, one transfer engine per output.
struct GpuLoader {
  std::unique_ptr<Engine> engine;
  std::vector<std::shared_ptr<cuda::TransferEngine>> transfers;
  std::shared_ptr<HostAllocator> pinned;
  std::shared_ptr<Pipeline> pipeline;

  GpuLoader(const TransferSource& src, const EngineOptions& o, const std::vector<int>& devices, int streams,
            cuda::Misuse misuse = cuda::Misuse::None)
      : prefetch_(o.prefetch) {
    engine = std::make_unique<Engine>(src.specs(), o);
    for (int d : devices)
      transfers.push_back(
          std::make_shared<cuda::TransferEngine>(d, streams, engine->layout_ptr(), o.prefetch, misuse));
    pinned = std::make_shared<cuda::PinnedAllocator>(transfers[0]->context());
  }
  // The transfers first (their threads read the old pipeline), then the epoch.
  void start(std::vector<EpochPlan> plans, int64_t fail_at_step = -1) {
    for (auto& t : transfers) t->stop();
    std::vector<OutputSpec> outputs;
    for (EpochPlan& p : plans) outputs.push_back({std::move(p), true});
    int64_t extra = 0;
    for (auto& t : transfers) extra += t->in_flight_limit();
    pipeline = engine->start(std::move(outputs), fail_at_step, pinned, extra);
    for (size_t d = 0; d < transfers.size(); ++d) transfers[d]->start(pipeline, static_cast<int>(d));
  }
  int64_t keep() const {  // Engine::start's rule for the host pools
    int64_t extra = 0;
    for (auto& t : transfers) extra += t->in_flight_limit();
    return (prefetch_ + 1) * static_cast<int64_t>(transfers.size()) + extra + 1;
  }
  // What its reservation allocates per part: the most the outputs can hold at once (the window
  // and the copies in flight of batches already taken), not the spare nor a loop variable.
  int64_t reserved() const { return keep() - 1 - static_cast<int64_t>(transfers.size()); }
  // As close() does: the epoch is cancelled, then the transfers stop and free their memory.
  void close() {
    engine->close();
    for (auto& t : transfers) t->close();
  }

 private:
  int64_t prefetch_;
};

// Blocks in 20 ms slices until a batch, the end or a cancel.
NextStatus next_blocking(cuda::TransferEngine& t, const Pipeline* epoch, api::CUstream stream,
                         cuda::DeviceBatch* out) {
  for (;;) {
    const NextStatus s = t.next(epoch, stream, milliseconds(20), out);
    if (s != NextStatus::Timeout) return s;
  }
}

// Takes every batch of output `d`, checks it against the plan (in order, values, device) and
// releases it on `stream`. Returns how many it took; the valid ids go to *ids if given.
int64_t consume_all(GpuLoader& L, int d, api::CUstream stream, std::vector<int64_t>* ids = nullptr) {
  cuda::TransferEngine& t = *L.transfers[static_cast<size_t>(d)];
  const EpochPlan& plan = dynamic_cast<const EpochPlan&>(L.pipeline->plan(d));
  const BatchLayout& layout = L.engine->layout();
  int64_t step = 0;
  for (;;) {
    cuda::DeviceBatch b;
    const NextStatus s = next_blocking(t, L.pipeline.get(), stream, &b);
    if (s == NextStatus::End) break;
    if (s != NextStatus::Ok) {
      CHECK_MSG(false, "output " << d << " step " << step << ": " << status_name(s));
      break;
    }
    const std::string err = batch_error(columns_of(L.engine->source()), layout, plan, step, t.device(), b, stream);
    CHECK_MSG(err.empty(), "output " << d << ": " << err);
    if (ids) append_valid_ids(plan, step, ids);
    release(b, stream);
    ++step;
  }
  CHECK_MSG(step == plan.num_batches(), "output " << d << ": " << step << " of " << plan.num_batches());
  cuda::DeviceBatch b;
  CHECK(t.next(L.pipeline.get(), stream, milliseconds(1), &b) == NextStatus::End);  // End stays End
  return step;
}

// Page-locked memory that runs out for good after `n` allocations.
class ExhaustedAfter final : public HostAllocator {
 public:
  ExhaustedAfter(std::shared_ptr<HostAllocator> pinned, int n) : pinned_(std::move(pinned)), left_(n) {}
  void* allocate(size_t n) override {
    if (left_.fetch_sub(1) <= 0) throw std::bad_alloc();
    return pinned_->allocate(n);
  }
  void deallocate(void* p, size_t n) noexcept override { pinned_->deallocate(p, n); }
  bool page_locked() const override { return true; }

 private:
  std::shared_ptr<HostAllocator> pinned_;
  std::atomic<int> left_;
};

}  // namespace

// ================================================================ correct use

// Values and order of every batch, for 1, 2 and 4 copy streams and two prefetch depths, over two
// epochs on the same engines; memory stays bounded: pinned slots and device buffers are
// allocated once, never per batch.
TEST_CASE(transfer_values_order_and_bounded_memory_for_every_stream_count) {
  start_clean();
  const TransferSource src(1000);
  for (int streams : {1, 2, 4}) {
    for (int64_t prefetch : {1, 4}) {
      {
        GpuLoader L(src, engine_options(2, prefetch, 24), {0}, streams);
        const int64_t parts = static_cast<int64_t>(L.engine->layout().num_parts());
        cuda::Stream consumer(L.transfers[0]->context());
        int64_t batches = 0;
        for (int64_t epoch : {0, 1}) {
          L.start({EpochPlan(make_cfg(src.n, 24, 1, 0, true, Order::Random, Even::Mask, false, 7), epoch, 0)});
          std::vector<int64_t> ids;
          batches += consume_all(L, 0, consumer.get(), &ids);
          CHECK_MSG(exactly_once(ids, src.n), "streams " << streams << " prefetch " << prefetch);
          // Pinned host slots: the window and the copies in flight, allocated once.
          const BufferPoolCounts hc = L.engine->host_counts();
          // Reserved up front, none more in either epoch.
          CHECK_MSG(hc.allocations == L.reserved() * parts && hc.frees == 0 && hc.with_user == 0,
                    "streams " << streams << " prefetch " << prefetch << ": allocations " << hc.allocations
                               << " frees " << hc.frees << " reserved " << L.reserved());
          CHECK(fake().stat("pinned_allocations") == hc.live());
          // Device buffers: the window's batches, the one the consumer reads and the one it still
          // holds meanwhile (TransferEngine::keep), reserved before the first copy; none more.
          const cuda::TransferCounts tc = L.transfers[0]->counts();
          CHECK_MSG(tc.device_allocations == (prefetch + 2) * parts,
                    "streams " << streams << " prefetch " << prefetch << ": " << tc.device_allocations
                               << " device allocations");
          CHECK(tc.batches == batches);
        }
        L.close();
        CHECK_NO_MISUSE();
      }
      check_all_released("after the loader is gone");
    }
  }
  CHECK_NO_MISUSE();
}

// split: one pipeline, two native outputs, one engine per stand-in device, each consumed from
// its own thread on a stream of its own device. Every part lives on its output's device (the
// stand-in also reports a copy or a read that crosses devices), and together the outputs cover
// the dataset once.
TEST_CASE(transfer_split_onto_two_devices_from_one_pipeline) {
  start_clean();
  CHECK(cuda::device_count() >= 2);
  const TransferSource src(1501);
  for (int streams : {1, 2}) {
    {
      GpuLoader L(src, engine_options(3, 3, 16), {0, 1}, streams);
      CHECK(L.transfers[0]->device() == 0 && L.transfers[1]->device() == 1);
      for (int64_t epoch : {0, 1}) {
        L.start({EpochPlan(make_cfg(src.n, 16, 2, 0, true, Order::Random, Even::Mask, false, 3), epoch, 0),
                 EpochPlan(make_cfg(src.n, 16, 2, 1, true, Order::Random, Even::Mask, false, 3), epoch, 0)});
        std::vector<std::vector<int64_t>> ids(2);
        std::vector<std::thread> consumers;
        for (int d = 0; d < 2; ++d)
          consumers.emplace_back([&, d] {
            cuda::Stream consumer(L.transfers[static_cast<size_t>(d)]->context());
            consume_all(L, d, consumer.get(), &ids[static_cast<size_t>(d)]);
          });
        for (auto& t : consumers) t.join();
        std::vector<int64_t> all = ids[0];
        all.insert(all.end(), ids[1].begin(), ids[1].end());
        CHECK_MSG(exactly_once(all, src.n), "streams " << streams << " epoch " << epoch);
        CHECK(L.transfers[0]->counts().batches > 0 && L.transfers[1]->counts().batches > 0);
      }
      L.close();
      CHECK_NO_MISUSE();
    }
    check_all_released("after the split loader is gone");
  }
}

// A consumer that reads asynchronously (into page-locked memory, without waiting) and releases
// each batch at once: the engine's next copy into a recycled device buffer must wait for the
// release event, or the stand-in reports the overwrite. Values are checked once the consumer
// stream has drained.
TEST_CASE(transfer_recycles_device_buffers_behind_async_readers) {
  start_clean();
  const TransferSource src(600);
  {
    GpuLoader L(src, engine_options(2, 1, 20), {0}, 2);
    Setting slow("max_delay_us", 500);
    const BatchLayout& layout = L.engine->layout();
    cuda::Stream consumer(L.transfers[0]->context());
    cuda::PinnedAllocator staging_memory(L.transfers[0]->context());
    L.start({EpochPlan(make_cfg(src.n, 20, 1, 0, true), 0, 0)});
    const EpochPlan& plan = dynamic_cast<const EpochPlan&>(L.pipeline->plan(0));
    const int64_t nb = plan.num_batches();
    const size_t stride = layout.total_bytes;
    void* staging = staging_memory.allocate(stride * static_cast<size_t>(nb));
    std::vector<int64_t> rows(static_cast<size_t>(nb), 0);
    const api::Functions& f = cuda::driver();
    for (int64_t s = 0; s < nb; ++s) {
      cuda::DeviceBatch b;
      CHECK(next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b) == NextStatus::Ok);
      CHECK(b.step == s);
      rows[static_cast<size_t>(s)] = b.rows;
      size_t offset = stride * static_cast<size_t>(s);
      for (size_t p = 0; p < b.parts.size(); ++p) {
        const size_t n = layout.part_row_bytes[p] * static_cast<size_t>(b.rows);
        cuda::check(f.cuMemcpyDtoHAsync(static_cast<uint8_t*>(staging) + offset, b.parts[p]->ptr(), n,
                                        consumer.get()),
                    "cuMemcpyDtoHAsync");
        offset += layout.part_bytes(p);
      }
      release(b, consumer.get());  // at once: the reads are still queued
    }
    consumer.synchronize();
    for (int64_t s = 0; s < nb; ++s) {
      size_t offset = stride * static_cast<size_t>(s);
      bool same = true;
      for (size_t p = 0; p < layout.num_parts(); ++p) {
        const std::vector<uint8_t> want = expected_part(src.specs(), layout, plan, s, p);
        same &= std::memcmp(static_cast<uint8_t*>(staging) + offset, want.data(), want.size()) == 0;
        offset += layout.part_bytes(p);
      }
      CHECK_MSG(same, "step " << s << " read back wrong");
    }
    const int64_t parts = static_cast<int64_t>(layout.num_parts());
    CHECK_MSG(L.transfers[0]->counts().device_allocations == 3 * parts,  // keep(): prefetch + 2
              L.transfers[0]->counts().device_allocations << " device allocations for " << nb << " batches");
    staging_memory.deallocate(staging, stride * static_cast<size_t>(nb));
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after the loader is gone");
}

// Every allocation of an epoch comes before its first batch: the pinned slots are reserved by a
// collation thread before any batch is built, the device buffers by the transfer thread before
// its first copy. A consumer that holds two batches at a time (the previous one while it takes
// the next, as a Python loop does) and is slower than the loader (so the window is full whenever
// it takes one) needs every device buffer; without the reservation the pools would grow to that
// mid-epoch, at times that depend on the threads. The next epoch allocates nothing.
TEST_CASE(transfer_epoch_allocates_nothing_after_its_first_batch) {
  start_clean();
  const TransferSource src(600);
  for (int threads : {1, 3}) {
    {
      const int64_t prefetch = 3;
      GpuLoader L(src, engine_options(threads, prefetch, 20), {0}, 2);
      const int64_t parts = static_cast<int64_t>(L.engine->layout().num_parts());
      cuda::Stream consumer(L.transfers[0]->context());
      for (int64_t epoch : {0, 1}) {
        // Allocation and free calls on any thread, and the live counts, at three points.
        const char* kCalls[] = {"cuMemHostAlloc", "cuMemAlloc", "cuMemFreeHost", "cuMemFree"};
        auto snapshot = [&] {
          std::vector<long long> v;
          for (const char* name : kCalls) v.push_back(fake().calls(name));
          v.push_back(fake().stat("pinned_allocations"));
          v.push_back(fake().stat("device_allocations"));
          return v;
        };
        const std::vector<long long> before = snapshot();
        L.start({EpochPlan(make_cfg(src.n, 20, 1, 0, true), epoch, 0)});
        cuda::DeviceBatch previous, b;
        std::vector<long long> at_first;
        int64_t steps = 0;
        for (;; ++steps) {
          const NextStatus s = next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b);
          if (s != NextStatus::Ok) {
            CHECK_MSG(s == NextStatus::End, status_name(s));
            break;
          }
          if (steps == 0) at_first = snapshot();
          std::this_thread::sleep_for(milliseconds(2));  // the loader fills its window meanwhile
          if (!previous.parts.empty()) release(previous, consumer.get());
          previous = std::move(b);
          b = cuda::DeviceBatch();
        }
        release(previous, consumer.get());
        CHECK(steps == L.pipeline->plan(0).num_batches());
        const std::vector<long long> after = snapshot();
        const std::string where = "threads " + std::to_string(threads) + " epoch " + std::to_string(epoch);
        for (size_t i = 0; i < after.size(); ++i)
          CHECK_MSG(!at_first.empty() && after[i] == at_first[i],
                    where << ": " << (i < 4 ? kCalls[i] : i == 4 ? "live pinned" : "live device") << " "
                          << (at_first.empty() ? -1 : at_first[i]) << " at the first batch, " << after[i]
                          << " at the end");
        // Exactly what the reservation allocates, by the first epoch only.
        const int64_t pinned = epoch == 0 ? L.reserved() * parts : 0, device = epoch == 0 ? (prefetch + 2) * parts : 0;
        CHECK_MSG(after[0] - before[0] == pinned && after[4] - before[4] == pinned,
                  where << ": " << after[0] - before[0] << " pinned allocations, " << pinned << " reserved");
        CHECK_MSG(after[1] - before[1] == device && after[5] - before[5] == device,
                  where << ": " << after[1] - before[1] << " device allocations, " << device << " reserved");
      }
      L.close();
      CHECK_NO_MISUSE();
    }
    check_all_released("after the loader is gone");
  }
}

// Shutdown while copies are in flight (slow stand-in streams): a new epoch started mid-epoch, a
// consumer blocked in next() while the copies are held up when the epoch is cancelled and the
// engine stopped, and engines destroyed (in both orders) while the user holds batches, which
// stay readable after the engines are gone and keep their device's context alive.
TEST_CASE(transfer_shutdown_while_copies_are_in_flight) {
  start_clean();
  const TransferSource src(640);
  Setting slow("max_delay_us", 2000);
  // 1. start() mid-epoch: stop, then a whole new epoch on the same engines.
  {
    GpuLoader L(src, engine_options(2, 4, 16), {0}, 2);
    cuda::Stream consumer(L.transfers[0]->context());
    for (int it = 0; it < 4; ++it) {
      L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), it, 0)});
      for (int64_t s = 0; s < it; ++s) {
        cuda::DeviceBatch b;
        CHECK(next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b) == NextStatus::Ok);
        CHECK(batch_error(src.specs(), L.engine->layout(), L.pipeline->plan(0), s, 0, b, consumer.get()).empty());
        release(b, consumer.get());
      }
      // An iterator of the old epoch gets Cancelled once the next one started.
      auto old = L.pipeline;
      L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), 10 + it, 0)});
      cuda::DeviceBatch b;
      CHECK(L.transfers[0]->next(old.get(), consumer.get(), milliseconds(1), &b) == NextStatus::Cancelled);
      consume_all(L, 0, consumer.get());
    }
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after restarts");
  // 2. A consumer blocked in next() while no copy can finish (the stand-in paused): the epoch is
  // cancelled and the engine stopped from other threads; the consumer gets Cancelled, and the
  // batches it holds are right once the copies ran.
  {
    GpuLoader L(src, engine_options(2, 4, 16), {0}, 1);
    cuda::Stream consumer(L.transfers[0]->context());
    std::vector<cuda::DeviceBatch> held;
    NextStatus last = NextStatus::Ok;
    std::atomic<bool> blocked{false};
    size_t held_while_paused = 0;
    {
      Setting paused("paused", 1);
      L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, false), 0, 0)});
      std::thread user([&] {
        for (;;) {
          cuda::DeviceBatch b;
          // No copy completes: the engine stops handing out once its pinned slots are all busy.
          const NextStatus s = L.transfers[0]->next(L.pipeline.get(), consumer.get(), milliseconds(300), &b);
          if (s == NextStatus::Ok) {
            held.push_back(std::move(b));
            continue;
          }
          held_while_paused = held.size();
          blocked = true;
          // The batch the transfer thread already took from the pipeline may still come (its
          // copy is issued once a slot frees); then Cancelled.
          while ((last = L.transfers[0]->next(L.pipeline.get(), consumer.get(), milliseconds(20000), &b)) ==
                 NextStatus::Ok)
            held.push_back(std::move(b));
          break;
        }
      });
      while (!blocked) std::this_thread::sleep_for(milliseconds(5));
      std::this_thread::sleep_for(milliseconds(50));
      L.pipeline->cancel();
      std::thread stopper([&] { L.transfers[0]->stop(); });  // waits for the copies in flight
      std::this_thread::sleep_for(milliseconds(100));
      fake().configure("paused", 0);
      stopper.join();
      user.join();
    }
    CHECK_MSG(last == NextStatus::Cancelled, status_name(last));
    // Pinned slots are bounded: no more copies in flight than in_flight_limit() (streams + 1).
    CHECK_MSG(held_while_paused >= 1 && static_cast<int64_t>(held_while_paused) <= L.transfers[0]->in_flight_limit(),
              held_while_paused << " batches handed out while no copy could finish");
    CHECK(held.size() <= held_while_paused + 1);
    for (size_t s = 0; s < held.size(); ++s) {
      CHECK(batch_error(src.specs(), L.engine->layout(), L.pipeline->plan(0), static_cast<int64_t>(s), 0, held[s],
                        consumer.get()).empty());
      release(held[s], consumer.get());
    }
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after a stop with a blocked consumer");
  // 3. The engines go mid-epoch while the user holds batches (some read, some not yet).
  for (int order = 0; order < 2; ++order) {
    const BatchLayout layout(ArraySource(src.specs()).schema(), true, true, 16);
    std::vector<cuda::DeviceBatch> held;
    std::shared_ptr<Pipeline> pipeline;
    auto consumer = std::make_unique<cuda::Stream>(cuda::PrimaryContext::retain(0));
    {
      GpuLoader L(src, engine_options(2, 4, 16), {0}, 2);
      L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), 5, 0)});
      pipeline = L.pipeline;
      for (int64_t s = 0; s < 3; ++s) {
        cuda::DeviceBatch b;
        CHECK(next_blocking(*L.transfers[0], L.pipeline.get(), consumer->get(), &b) == NextStatus::Ok);
        if (s == 0) CHECK(batch_error(src.specs(), layout, pipeline->plan(0), s, 0, b, consumer->get()).empty());
        held.push_back(std::move(b));
      }
      if (order == 0) {
        L.transfers.clear();  // ~TransferEngine first, the epoch still running
        L.engine.reset();
      } else {
        L.engine.reset();  // the epoch is cancelled first
        L.transfers.clear();
      }
    }
    CHECK(fake().stat("contexts_retained") > 0);  // the held batches keep the context
    for (size_t s = 0; s < held.size(); ++s) {
      CHECK_MSG(batch_error(src.specs(), layout, pipeline->plan(0), static_cast<int64_t>(s), 0, held[s], consumer->get()).empty(),
                "held batch " << s << " after its engine is gone (order " << order << ")");
      release(held[s], consumer->get());
    }
    held.clear();
    consumer.reset();
    pipeline.reset();
    CHECK_NO_MISUSE();
    check_all_released("after the held batches are gone");
  }
}

// A driver error (an injected failed copy) reaches the consumer from next() as a DriverError
// naming the call, after the batches copied before it; so do a collation failure (as the
// CollationError it is) and an allocation failure. A fresh engine works afterwards.
TEST_CASE(transfer_errors_surface_from_next) {
  start_clean();
  const TransferSource src(800);
  // A failed copy.
  {
    GpuLoader L(src, engine_options(2, 2, 16), {0}, 2);
    cuda::Stream consumer(L.transfers[0]->context());
    std::string what;
    api::CUresult code = 0;
    int64_t good = 0;
    {
      // 5 parts a batch: the 4th batch's first copy fails. (A failure after some of a batch's
      // copies were queued is a_failed_copy_keeps_pinned_parts_until_queued_copies_ran.)
      Setting fail("fail_copy_after", 3 * 5);
      L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), 0, 0)});
      for (int k = 0; k < 2; ++k) {  // the error stays: a second call gets it too
        try {
          for (;;) {
            cuda::DeviceBatch b;
            const NextStatus s = next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b);
            if (s != NextStatus::Ok) {
              CHECK_MSG(false, "next() returned " << status_name(s) << " instead of throwing");
              break;
            }
            CHECK(batch_error(src.specs(), L.engine->layout(), L.pipeline->plan(0), good, 0, b, consumer.get()).empty());
            release(b, consumer.get());
            ++good;
          }
        } catch (const cuda::DriverError& e) {
          what = e.what();
          code = e.code();
        }
        CHECK_MSG(what.find("cuMemcpyHtoDAsync") != std::string::npos &&
                      what.find("CUDA_ERROR_UNKNOWN") != std::string::npos,
                  "'" << what << "'");
        CHECK(code == 999);
      }
    }
    CHECK_MSG(good == 3, good << " batches before the failed copy");
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after a failed copy");
  // A collation failure, through the transfer thread.
  {
    GpuLoader L(src, engine_options(2, 2, 16), {0}, 1);
    cuda::Stream consumer(L.transfers[0]->context());
    L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), 0, 0)}, /*fail_at_step=*/4);
    std::string what, original;
    int64_t good = 0;
    try {
      for (;;) {
        cuda::DeviceBatch b;
        if (next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b) != NextStatus::Ok) break;
        release(b, consumer.get());
        ++good;
      }
    } catch (const CollationError& e) {
      what = e.what();
      try {
        std::rethrow_exception(e.original());
      } catch (const std::exception& o) {
        original = o.what();
      }
    }
    CHECK_MSG(what.find("injected failure") != std::string::npos && original.find("batch 4") != std::string::npos,
              "'" << what << "' / '" << original << "'");
    CHECK(good <= 4);
    // The loader recovers: the next epoch is whole.
    L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), 1, 0)});
    consume_all(L, 0, consumer.get());
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after a collation failure");
  // Page-locked memory exhausted: the epoch start reserves what it can (two slots), then a
  // collation thread's allocation fails, and the consumer gets a CollationError whose original
  // exception is still the std::bad_alloc.
  {
    GpuLoader L(src, engine_options(2, 2, 16), {0}, 1);
    cuda::Stream consumer(L.transfers[0]->context());
    std::string what = "no error";
    bool bad_alloc = false;
    {
      L.pinned = std::make_shared<ExhaustedAfter>(L.pinned, 2);
      L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), 0, 0)});
      try {
        for (;;) {
          cuda::DeviceBatch b;
          if (next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b) != NextStatus::Ok) break;
          release(b, consumer.get());
        }
      } catch (const CollationError& e) {
        what = e.what();
        try {
          std::rethrow_exception(e.original());
        } catch (const std::bad_alloc&) {
          bad_alloc = true;
        } catch (...) {
        }
      }
    }
    CHECK_MSG(bad_alloc, "a failed cuMemHostAlloc should reach the consumer as std::bad_alloc: " << what);
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after a pinned allocation failure");
  // Device memory exhausted (the stand-in's device is 1 byte): the transfer thread's first
  // cuMemAlloc fails, a DriverError naming the call and CUDA_ERROR_OUT_OF_MEMORY.
  {
    GpuLoader L(src, engine_options(2, 2, 16), {0}, 1);
    cuda::Stream consumer(L.transfers[0]->context());
    std::string what = "no error";
    api::CUresult code = 0;
    {
      Setting tiny("total_memory", 1);
      L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), 0, 0)});
      try {
        cuda::DeviceBatch b;
        next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b);
      } catch (const cuda::DriverError& e) {
        what = e.what();
        code = e.code();
      }
    }
    CHECK_MSG(what.find("cuMemAlloc failed") != std::string::npos && code == api::CUDA_ERROR_OUT_OF_MEMORY,
              "'" << what << "'");
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after a device allocation failure");
  // The stand-in's countdowns switched themselves off; a fresh loader is whole.
  {
    GpuLoader L(src, engine_options(2, 2, 16), {0}, 2);
    cuda::Stream consumer(L.transfers[0]->context());
    L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), 2, 0)});
    consume_all(L, 0, consumer.get());
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after a fresh loader");
}

// A copy that fails after some of the batch's copies were queued: TransferEngine::issue() must
// keep the batch's pinned parts until those copies ran (it synchronises the stream before
// rethrowing), or close() frees them under the queued copies and collation may rewrite them.
TEST_CASE(a_failed_copy_keeps_pinned_parts_until_queued_copies_ran) {
  start_clean();
  const TransferSource src(800);
  bool threw = false;
  {
    GpuLoader L(src, engine_options(2, 2, 16), {0}, 1);
    cuda::Stream consumer(L.transfers[0]->context());
    {
      // The last batch's third copy fails (5 parts a batch, 50 batches): its first two copies are
      // queued, and no collation runs afterwards (which would also race on those parts).
      Setting fail("fail_copy_after", 49 * 5 + 2);
      L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, false), 0, 0)});
      CHECK(L.pipeline->plan(0).num_batches() == 50);
      try {
        for (;;) {
          cuda::DeviceBatch b;
          if (next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b) != NextStatus::Ok) break;
          release(b, consumer.get());
        }
      } catch (const cuda::DriverError&) {
        threw = true;
      }
    }
    L.close();  // as the binding's close(): the epoch (and its host pools' spares) first
  }
  CHECK(threw);
  const std::vector<std::string> found = misuse_messages();
  fake().reset_misuses();
  CHECK_MSG(found.empty(), found.size() << " misuses after a failed copy, first: " << (found.empty() ? "" : found[0]));
  check_all_released("after the failed copy");
}

namespace {

std::atomic<int> g_in_slow_handler{0};
void slow_handler(int) {
  g_in_slow_handler = 1;
  timespec t{0, 500 * 1000 * 1000};
  nanosleep(&t, nullptr);
}

// Page-locked memory handed out only once the gate opens: holds the collation threads.
class GatedPinned final : public HostAllocator {
 public:
  explicit GatedPinned(std::shared_ptr<HostAllocator> pinned) : pinned_(std::move(pinned)) {}
  void* allocate(size_t n) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return open_; });
    }
    return pinned_->allocate(n);
  }
  void deallocate(void* p, size_t n) noexcept override { pinned_->deallocate(p, n); }
  bool page_locked() const override { return true; }
  void open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::shared_ptr<HostAllocator> pinned_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace

// A consumer of epoch A woken by stop() that gets the lock back only after start() of epoch B
// queued B's first batch must get Cancelled, not B's batch (in Python: a thread blocked in an old
// iterator's next() while another thread calls iter()). The late wake-up is forced by a signal
// handler that holds the waiting thread for 0.5 s.
TEST_CASE(an_old_iterator_never_takes_the_next_epochs_batch) {
  start_clean();
  struct sigaction sa {};
  sa.sa_handler = slow_handler;
  sigemptyset(&sa.sa_mask);
  struct sigaction previous {};
  CHECK(sigaction(SIGUSR1, &sa, &previous) == 0);
  g_in_slow_handler = 0;
  const TransferSource src(320);
  NextStatus got = NextStatus::Timeout;
  int64_t step = -1;
  {
    EngineOptions o = engine_options(1, 2, 16);
    Engine engine(src.specs(), o);
    cuda::TransferEngine te(0, 1, engine.layout_ptr(), o.prefetch);
    auto gate = std::make_shared<GatedPinned>(std::make_shared<cuda::PinnedAllocator>(te.context()));
    cuda::Stream consumer(te.context());
    auto a = engine.start({OutputSpec{EpochPlan(make_cfg(src.n, 16, 1, 0, false), 0, 0), true}}, -1, gate,
                          te.in_flight_limit());
    te.start(a, 0);  // nothing is collated while the gate is shut: epoch A's iterator waits
    cuda::DeviceBatch taken;
    std::thread old_iterator([&] {
      got = te.next(a.get(), consumer.get(), milliseconds(20000), &taken);
      step = taken.step;
    });
    std::this_thread::sleep_for(milliseconds(200));  // it waits in next() by now
    pthread_kill(old_iterator.native_handle(), SIGUSR1);
    const auto t0 = std::chrono::steady_clock::now();
    while (!g_in_slow_handler && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5))
      std::this_thread::sleep_for(milliseconds(1));
    CHECK(g_in_slow_handler.load());
    a->cancel();
    te.stop();  // epoch A is over: its waiter is notified, but held in the handler
    gate->open();
    auto b = engine.start({OutputSpec{EpochPlan(make_cfg(src.n, 16, 1, 0, false), 1, 0), true}}, -1, gate,
                          te.in_flight_limit());
    te.start(b, 0);  // epoch B queues its first batch
    while (te.counts().batches == 0 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
      std::this_thread::sleep_for(milliseconds(1));
    old_iterator.join();
    if (!taken.parts.empty()) release(taken, consumer.get());
    b->cancel();
    te.close();
    engine.close();
  }
  sigaction(SIGUSR1, &previous, nullptr);
  CHECK_MSG(got == NextStatus::Cancelled, "the old iterator got " << status_name(got) << " (step " << step << ")");
  CHECK_NO_MISUSE();
  check_all_released("after the epoch race");
}

// ================================================================ the misuse detectors

#if !FASTLOAD_TSAN
namespace {

// Runs a loader built with `misuse` through `body` and returns the misuse messages.
template <typename Body>
std::vector<std::string> misuses_of(cuda::Misuse misuse, int64_t prefetch, int streams, Body body) {
  fake().reset_misuses();
  {
    const TransferSource src(640);
    GpuLoader L(src, engine_options(2, prefetch, 16), {0}, streams, misuse);
    cuda::Stream consumer(L.transfers[0]->context());
    L.start({EpochPlan(make_cfg(src.n, 16, 1, 0, true), 0, 0)});
    body(L, consumer.get());
    consumer.synchronize();
    L.close();
  }
  std::vector<std::string> found = misuse_messages();
  fake().reset_misuses();
  return found;
}

}  // namespace

// A batch handed out before the consumer stream waited on its copy: the consumer's read races
// the copy (slow copies make sure it is still queued).
TEST_CASE(misuse_skip_consumer_wait_is_caught) {
  Setting slow("max_delay_us", 20000);
  const auto found = misuses_of(cuda::Misuse::SkipConsumerWait, 2, 1, [](GpuLoader& L, api::CUstream stream) {
    for (int k = 0; k < 3; ++k) {
      cuda::DeviceBatch b;
      if (next_blocking(*L.transfers[0], L.pipeline.get(), stream, &b) != NextStatus::Ok) break;
      read_back(L.engine->layout(), b, stream);  // values may be anything: the bug
      release(b, stream);
    }
  });
  CHECK_MSG(!found.empty(), "no misuse reported");
  CHECK_MSG(any_contains(found, "read before the consumer stream waited"), found.size() << " misuses, first: "
                                                                              << (found.empty() ? "" : found[0]));
}

// A device buffer rewritten by the next copy before the release event of its previous batch
// completed: the consumer's reads are queued (async, into pinned memory) when it releases.
TEST_CASE(misuse_skip_release_wait_is_caught) {
  Setting slow("max_delay_us", 5000);
  const auto found = misuses_of(cuda::Misuse::SkipReleaseWait, 1, 1, [](GpuLoader& L, api::CUstream stream) {
    const BatchLayout& layout = L.engine->layout();
    cuda::PinnedAllocator memory(L.transfers[0]->context());
    void* staging = memory.allocate(layout.total_bytes);
    for (int k = 0; k < 8; ++k) {
      cuda::DeviceBatch b;
      if (next_blocking(*L.transfers[0], L.pipeline.get(), stream, &b) != NextStatus::Ok) break;
      size_t offset = 0;
      for (size_t p = 0; p < b.parts.size(); ++p) {
        cuda::check(cuda::driver().cuMemcpyDtoHAsync(static_cast<uint8_t*>(staging) + offset, b.parts[p]->ptr(),
                                                     layout.part_row_bytes[p] * static_cast<size_t>(b.rows), stream),
                    "cuMemcpyDtoHAsync");
        offset += layout.part_bytes(p);
      }
      release(b, stream);
    }
    cuda::check(cuda::driver().cuStreamSynchronize(stream), "cuStreamSynchronize");
    memory.deallocate(staging, layout.total_bytes);
  });
  CHECK_MSG(!found.empty(), "no misuse reported");
  CHECK_MSG(any_contains(found, "overwritten before the release event"), found.size() << " misuses, first: "
                                                                          << (found.empty() ? "" : found[0]));
}

// Pinned slots back to collation as soon as their copies are queued: the collation threads
// rewrite them before the (slow) copies ran.
TEST_CASE(misuse_early_host_release_is_caught) {
  Setting slow("max_delay_us", 20000);
  const auto found = misuses_of(cuda::Misuse::EarlyHostRelease, 4, 1, [](GpuLoader& L, api::CUstream stream) {
    for (int k = 0; k < 12; ++k) {
      cuda::DeviceBatch b;
      if (next_blocking(*L.transfers[0], L.pipeline.get(), stream, &b) != NextStatus::Ok) break;
      release(b, stream);
    }
  });
  CHECK_MSG(!found.empty(), "no misuse reported");
  CHECK_MSG(any_contains(found, "pinned source rewritten"), found.size() << " misuses, first: "
                                                             << (found.empty() ? "" : found[0]));
}
#endif  // !FASTLOAD_TSAN

// ================================================================ streams, memory, captures

// A side stream reads each batch (after waiting for the consumer stream, as the usual idiom
// does) and is recorded with record_stream; the batches die on another thread. The next copy
// into that memory must wait for the side stream's reads (the stand-in reports it otherwise).
TEST_CASE(transfer_record_stream_and_releases_on_another_thread) {
  start_clean();
  const TransferSource src(800);
  {
    GpuLoader L(src, engine_options(2, 2, 20), {0}, 2);
    Setting slow("max_delay_us", 300);
    const auto& ctx = L.transfers[0]->context();
    const BatchLayout& layout = L.engine->layout();
    cuda::Stream consumer(ctx), side(ctx);
    cuda::Event ready(ctx);
    cuda::PinnedAllocator scratch_memory(ctx);
    void* scratch = scratch_memory.allocate(layout.total_bytes);
    const api::Functions& f = cuda::driver();
    std::mutex mutex;
    std::condition_variable cv;
    std::vector<cuda::DeviceBatch> to_drop;
    bool done = false;
    std::thread dropper([&] {
      std::unique_lock<std::mutex> lock(mutex);
      for (;;) {
        cv.wait(lock, [&] { return done || !to_drop.empty(); });
        if (to_drop.empty()) return;
        cuda::DeviceBatch b = std::move(to_drop.back());
        to_drop.pop_back();
        lock.unlock();
        release(b, consumer.get());  // the last reference dies on this thread
        lock.lock();
      }
    });
    L.start({EpochPlan(make_cfg(src.n, 20, 1, 0, true), 0, 0)});
    int64_t n = 0;
    for (;;) {
      cuda::DeviceBatch b;
      if (next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b) != NextStatus::Ok) break;
      ready.record(consumer.get());
      cuda::check(f.cuStreamWaitEvent(side.get(), ready.get(), 0), "cuStreamWaitEvent");
      size_t offset = 0;
      for (size_t p = 0; p < b.parts.size(); ++p) {
        b.parts[p]->hand_out(consumer.get());
        CHECK(cuda::record_stream(0, b.parts[p]->ptr() + 1, side.get()));  // inside the part
        CHECK(cuda::record_stream(0, b.parts[p]->ptr(), side.get()));      // again: recorded once
        const size_t bytes = layout.part_row_bytes[p] * static_cast<size_t>(b.rows);
        if (bytes)
          cuda::check(f.cuMemcpyDtoHAsync(static_cast<uint8_t*>(scratch) + offset, b.parts[p]->ptr(), bytes, side.get()),
                      "cuMemcpyDtoHAsync");
        offset += layout.part_bytes(p);
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        to_drop.push_back(std::move(b));
      }
      cv.notify_one();
      ++n;
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
    }
    cv.notify_one();
    dropper.join();
    CHECK(n == L.pipeline->plan(0).num_batches());
    CHECK(!cuda::record_stream(0, 16, side.get()));  // not batch memory
    side.synchronize();
    consumer.synchronize();
    scratch_memory.deallocate(scratch, layout.total_bytes);
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after record_stream");
}

// The device has room for few batches: a consumer that keeps two makes the pool wait for
// returned buffers instead of failing; a consumer that keeps them all gets OutOfMemory (with no
// cache to release) instead of a hang.
TEST_CASE(transfer_out_of_memory_waits_then_says_why) {
  start_clean();
  const TransferSource src(600);
  {
    GpuLoader L(src, engine_options(2, 2, 20), {0}, 1);
    const BatchLayout& layout = L.engine->layout();
    int64_t batch_bytes = 0;
    for (size_t p = 0; p < layout.num_parts(); ++p) batch_bytes += static_cast<int64_t>(layout.part_bytes(p));
    cuda::Stream consumer(L.transfers[0]->context());
    {
      Setting cap("total_memory", fake().stat("device_bytes") + 3 * batch_bytes);
      L.start({EpochPlan(make_cfg(src.n, 20, 1, 0, true), 0, 0)});
      const BatchPlan& plan = L.pipeline->plan(0);
      std::vector<cuda::DeviceBatch> kept;
      int64_t step = 0;
      for (;;) {
        cuda::DeviceBatch b;
        const NextStatus s = next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b);
        if (s != NextStatus::Ok) {
          CHECK(s == NextStatus::End);
          break;
        }
        const std::string err =
            batch_error(columns_of(L.engine->source()), layout, plan, step, 0, b, consumer.get());
        CHECK_MSG(err.empty(), err);
        kept.push_back(std::move(b));
        if (kept.size() > 2) {
          std::this_thread::sleep_for(milliseconds(2));
          release(kept.front(), consumer.get());
          kept.erase(kept.begin());
        }
        ++step;
      }
      CHECK(step == plan.num_batches());
      for (auto& b : kept) release(b, consumer.get());
      CHECK(L.transfers[0]->counts().device_buffers <= 3 * static_cast<int64_t>(layout.num_parts()));
      // Now keep everything: the third batch cannot be made.
      L.start({EpochPlan(make_cfg(src.n, 20, 1, 0, true), 1, 0)});
      std::vector<cuda::DeviceBatch> all;
      std::string what;
      try {
        for (;;) {
          cuda::DeviceBatch b;
          if (next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b) != NextStatus::Ok) break;
          all.push_back(std::move(b));
        }
      } catch (const cuda::OutOfMemory& e) {
        what = e.what();
      }
      CHECK_MSG(all.size() == 3, all.size());
      CHECK_MSG(what.find("out of device memory on cuda:0") != std::string::npos &&
                    what.find("of them in batches you still hold") != std::string::npos,
                "'" << what << "'");
      for (auto& b : all) release(b, consumer.get());
    }
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after running out of device memory");
}

// A user's stream capture in global mode on this thread while the loader starts, grows its
// pools (a held batch) and copies on its threads: none of their calls may break the capture.
TEST_CASE(transfer_threads_never_break_a_global_capture) {
  start_clean();
  using Begin = api::CUresult (*)(api::CUstream, int);
  using End = api::CUresult (*)(api::CUstream, void**);
  auto proc = [](const char* name) {
    auto getter = reinterpret_cast<api::PFN_cuGetProcAddress_v2>(
        dlsym(dlopen(std::getenv("FASTLOAD_LIBCUDA"), RTLD_NOW | RTLD_NOLOAD), "cuGetProcAddress_v2"));
    void* p = nullptr;
    int status = 0;
    getter(name, &p, api::kApiVersion, 0, &status);
    return p;
  };
  const auto begin = reinterpret_cast<Begin>(proc("cuStreamBeginCapture"));
  const auto end = reinterpret_cast<End>(proc("cuStreamEndCapture"));
  CHECK(begin && end);
  const TransferSource src(800);
  {
    GpuLoader L(src, engine_options(2, 2, 20), {0}, 2);
    const auto& ctx = L.transfers[0]->context();
    ctx->make_current();
    cuda::Stream captured(ctx), consumer(ctx);
    CHECK(begin(captured.get(), api::CU_STREAM_CAPTURE_MODE_GLOBAL) == api::CUDA_SUCCESS);
    L.start({EpochPlan(make_cfg(src.n, 20, 1, 0, true), 0, 0)});
    std::vector<cuda::DeviceBatch> held(6);  // more than the window: the device pool grows
    for (auto& b : held) CHECK(next_blocking(*L.transfers[0], L.pipeline.get(), consumer.get(), &b) == NextStatus::Ok);
    for (auto& b : held) release(b, consumer.get());
    void* graph = nullptr;
    CHECK_MSG(end(captured.get(), &graph) == api::CUDA_SUCCESS && graph, "the capture was broken" << first_misuses());
    api::CUcontext none = nullptr;
    cuda::check(cuda::driver().cuCtxSetCurrent(none), "cuCtxSetCurrent");
    consumer.synchronize();
    L.close();
    CHECK_NO_MISUSE();
  }
  check_all_released("after a capture");
}

// ================================================================ main

int main(int argc, char** argv) {
  fake();  // fails fast without the stand-in
  return harness::run_cases(argc, argv, "test_transfer");
}
