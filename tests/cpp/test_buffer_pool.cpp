// Tests of the recycled host buffers (core/buffer_pool.h).
// Built and run under ThreadSanitizer and AddressSanitizer + UBSan by tests/cpp/run_sanitizers.sh.
#include "core/buffer_pool.h"
#include "core_fixtures.h"

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

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_buffer_pool"); }
