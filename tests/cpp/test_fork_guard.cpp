// Tests of fork safety (core/fork_guard.h): a forked child neither joins the parent's threads nor
// frees the parent's buffers.
// Built and run under ThreadSanitizer and AddressSanitizer + UBSan by tests/cpp/run_sanitizers.sh.
#include "core/fork_guard.h"
#include "core_fixtures.h"

// ================================================================ fork

TEST_CASE(fork_child_does_not_join_the_parents_threads) {
  const Source src(400);
  EngineOptions o = engine_options(2, 2, 8, /*with_valid=*/false);
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

// ~BufferPool in a forked child used to free its spares: with page-locked memory that is a
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
  EngineOptions o = engine_options(2, 2, 8, /*with_valid=*/false);
  o.with_index = false;
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

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_fork_guard"); }
