// A fixed set of native threads that run one job at a time (the current epoch's pipeline).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace fastload {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();  // stops and joins; in a forked child the threads do not exist: nothing to join
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(threads_.size()); }
  // Every thread calls job(thread_index) once; returns at once. The job must return when it is
  // done or cancelled; the previous one must have finished (wait_idle).
  void run(std::function<void(int)> job);
  void wait_idle();  // until every thread has returned from the current job

 private:
  void loop(int index);

  std::mutex mutex_;
  std::condition_variable work_cv_, idle_cv_;
  std::function<void(int)> job_;
  uint64_t job_generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
  const uint64_t fork_generation_;
  std::vector<std::thread> threads_;
};

}  // namespace fastload
