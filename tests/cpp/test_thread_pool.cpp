// Tests of the collation threads' pool (core/thread_pool.h).
// Built and run under ThreadSanitizer and AddressSanitizer + UBSan by tests/cpp/run_sanitizers.sh.
#include "core/thread_pool.h"
#include "core_fixtures.h"

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

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_thread_pool"); }
