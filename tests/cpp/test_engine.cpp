// Tests of the engine (core/engine.h): its threads, buffers and epochs' pipelines, in order for
// every thread count and prefetch, with several outputs, cancels, restarts and errors.
// Built and run under ThreadSanitizer and AddressSanitizer + UBSan by tests/cpp/run_sanitizers.sh.
#include "core/engine.h"
#include "core/pipeline.h"
#include "core_fixtures.h"

// ================================================================ Engine / Pipeline

TEST_CASE(engine_batches_in_order_for_every_thread_count_and_prefetch) {
  const Source src(777);
  for (int threads : {1, 2, 4, 8}) {
    for (int64_t prefetch : {1, 2, 4}) {
      for (bool with_index : {true, false}) {
        if (!with_index && threads != 4) continue;
        EngineOptions o = engine_options(threads, prefetch, 32);
        o.with_index = with_index;
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
      EngineOptions o = engine_options(threads, 2, 16);
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
    EngineOptions o = engine_options(2, prefetch, 8, /*with_valid=*/false);
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
  EngineOptions o = engine_options(4, 3, 24, /*with_valid=*/false);
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
    EngineOptions o = engine_options(1 + it % 4, 1 + it % 3, 48, /*with_valid=*/false);
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
  EngineOptions o = engine_options(2, 2, 10, /*with_valid=*/false);
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

// A stop policy: threads stuck in a build (here in the allocator, as a Python dataset's
// __getitem__ may be) are left behind after the grace, never joined, and the engine goes on with
// fresh threads; the ones left behind finish safely when they are released (ASan/TSan check it).
TEST_CASE(engine_leaves_stuck_threads_behind_under_a_stop_policy) {
  const Source src(300);
  EngineOptions o = engine_options(2, 2, 10, /*with_valid=*/false);
  const SamplerConfig c = make_cfg(src.n, 10, 1, 0, true);
  for (int how = 0; how < 2; ++how) {  // 0: a new epoch, 1: close()
    auto gate = std::make_shared<GatedAllocator>();
    auto e = std::make_unique<Engine>(src.specs(), o, gate);
    std::atomic<int> told{0};
    StopPolicy policy;
    policy.grace = milliseconds(50);
    policy.stuck = [] { return std::string(); };
    policy.left_behind = [&](int n) { told += n; };
    e->set_stop_policy(policy);
    auto p = e->start(make_plans(c, {0}, 0));
    CHECK(gate->wait_for_waiters(2));  // both threads are stuck in a build
    const auto t0 = std::chrono::steady_clock::now();
    std::shared_ptr<Pipeline> q;
    if (how == 0) q = e->start(make_plans(c, {0}, 1));
    else e->close();
    CHECK_MSG(seconds_since(t0) < 5, "how=" << how << ": waited " << seconds_since(t0) << " s for stuck threads");
    CHECK_MSG(e->left_behind() == 2 && told == 2, "how=" << how << ": left " << e->left_behind() << ", told " << told);
    gate->open();  // the stuck threads return, finish their cancelled build and end
    if (q) CHECK(consume_all(e->layout(), *q, 0, nullptr) == 30);  // fresh threads ran the whole epoch
    const auto t1 = std::chrono::steady_clock::now();
    while (p.use_count() > 1 && seconds_since(t1) < 20) std::this_thread::sleep_for(milliseconds(5));
    CHECK_MSG(p.use_count() == 1, "the threads left behind still hold their epoch");
    e.reset();
  }
}

TEST_CASE(engine_held_batches_never_block_and_never_change) {
  const Source src(2000);
  EngineOptions o = engine_options(4, 2, 16);
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
      EngineOptions o = engine_options(3, 2, 10, /*with_valid=*/false);
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
    EngineOptions o = engine_options(2, 2, 10, /*with_valid=*/false);
    o.with_index = false;
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

// The layout the Python side built (to choose a default prefetch) is the one the engine sizes its
// buffers from; one built for other options is refused. The memory bound's two counts.
TEST_CASE(engine_uses_the_layout_it_is_given) {
  const Source src(50);
  EngineOptions o;
  o.batch_size = 8;
  o.with_index = true;
  auto schema = ArraySource(src.specs()).schema();
  o.layout = std::make_shared<const BatchLayout>(schema, true, false, 8);
  Engine e(src.specs(), o);
  CHECK(e.layout_ptr() == o.layout);
  auto p = e.start(make_plans(make_cfg(50, 8, 1, 0, true), {0}, 0));
  consume_all(e.layout(), *p, 0, nullptr);
  o.layout = std::make_shared<const BatchLayout>(schema, false, false, 8);  // without the index part
  CHECK_THROWS(Engine(src.specs(), o), std::invalid_argument, "layout");
  o.layout = std::make_shared<const BatchLayout>(schema, true, false, 9);  // other max rows
  CHECK_THROWS(Engine(src.specs(), o), std::invalid_argument, "layout");
  static_assert(batches_in_use(4) == 5 && batches_held(4) == 6, "the window, the batch in use, the hand-over");
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
  EngineOptions o = engine_options(3, 2, 6);
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

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_engine"); }
