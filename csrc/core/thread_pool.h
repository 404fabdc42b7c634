// A fixed set of native threads that run one job at a time (the current epoch's pipeline).
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace fastload {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  // Stops and joins; in a forked child the threads do not exist, and after abandon() they are
  // no longer this pool's: nothing to join then.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Every thread calls job(thread_index) once; returns at once. The job must return when it is
  // done or cancelled; the previous one must have finished (wait_idle).
  void run(std::function<void(int)> job);
  void wait_idle();  // until every thread has returned from the current job
  // wait_idle for at most `limit`; whether every thread has returned.
  bool wait_idle_for(std::chrono::milliseconds limit);
  // Gives up on the threads: each ends when it returns from the current job (at once if it has),
  // and none is ever joined. For threads stuck in code that cannot be interrupted (a Python
  // dataset's __getitem__). Returns how many were still in the job. The pool runs no more jobs.
  int abandon();

 private:
  // What the threads share with the pool; they keep it alive, so an abandoned thread that
  // returns after the pool is gone touches no freed memory.
  struct State {
    std::mutex mutex;
    std::condition_variable work_cv, idle_cv;
    std::function<void(int)> job;
    uint64_t job_generation = 0;
    int running = 0;
    bool stop = false;
  };
  static void loop(const std::shared_ptr<State>& state, int index);

  std::shared_ptr<State> state_;
  const uint64_t fork_generation_;
  std::vector<std::thread> threads_;
};

}  // namespace fastload
