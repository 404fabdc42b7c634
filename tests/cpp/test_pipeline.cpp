// Tests of one epoch's pipeline (core/pipeline.h) as a native consumer (a transfer thread) uses
// it: woken by each ready batch, a place in the window freed only on retire, pools that never
// churn, failures that keep their type, consumers that share an output, aligned parts.
// Built and run under ThreadSanitizer and AddressSanitizer + UBSan by tests/cpp/run_sanitizers.sh.
#include "core/pipeline.h"
#include "core_fixtures.h"

// ================================================================ a native consumer
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

// The old wake rule woke any consumer only once prefetch/2 batches in a row were ready. A
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

// The old window freed a place when a batch was taken. A native consumer's taken batch is
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

// Buffers carry their state, and a pool never frees mid-epoch. The old pool freed every
// buffer returned beyond `keep` and allocated again at once: holding 8 batches and dropping them
// together cost 42 allocations and 37 frees per 64 batches. Now: allocations at most keep + 8
// per part for the whole epoch, no free until the next start(), and exact with_user counts.
TEST_CASE(held_batches_dropped_together_never_churn_the_pool) {
  const Source src(512);
  EngineOptions o = engine_options(2, 4, 8, /*with_valid=*/false);  // 64 batches
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

// Worker failures used to be kept as strings: a std::bad_alloc became a plain runtime
// error, and a cancel threw just like a failure. Now the original exception travels inside a
// CollationError, and a cancel is a status.
TEST_CASE(bad_alloc_in_a_worker_stays_bad_alloc_and_cancel_is_a_status) {
  const Source src(400);
  EngineOptions o = engine_options(2, 2, 10);
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

// Two consumers on one output: the old pipeline kept `consumer_waiting` as a bool and a
// waiter kept a stale slot reference, so one consumer's wake-up could be lost and it slept to
// its timeout while batches were ready (256 batches in 0.15 s against 0.006 s). Each next()
// here has a 3 s timeout: a single Timeout is a lost wake-up.
TEST_CASE(two_consumers_on_one_output_take_every_batch_once) {
  // 16 KiB rows: building a batch takes longer than taking one, so both consumers wait in
  // next() at once, the situation where the old wake-up was lost.
  const Source src(1024, 16384);
  EngineOptions o = engine_options(2, 4, 4, /*with_valid=*/false);  // 256 batches
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

// Parts are exported to CUDA and DLPack, which want 256-byte alignment; the old single
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
    EngineOptions o = engine_options(2, 2, batch);
    Engine e(src.specs(), o);
    auto p = e.start(make_plans(make_cfg(src.n, batch, 1, 0, true, Order::Random, Even::Mask), {0}, 0));
    consume_all(e.layout(), *p, 0, nullptr);  // batch_error checks each part's alignment
  }
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_pipeline"); }
