// Worker threads that wait for a job and run it; see thread_pool.h.
#include "core/thread_pool.h"

#include <stdexcept>
#include <string>

#include "core/fork_guard.h"

namespace fastload {

ThreadPool::ThreadPool(int num_threads) : fork_generation_(fork_generation()) {
  if (num_threads <= 0)
    throw std::invalid_argument("num_threads must be positive, got " +
                                std::to_string(num_threads));
  threads_.reserve(num_threads);
  try {
    for (int i = 0; i < num_threads; ++i) threads_.emplace_back([this, i] { loop(i); });
  } catch (...) {
    // A joinable std::thread destroyed by the unwinding would call std::terminate.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  if (fork_generation() != fork_generation_) {
    // The threads were the parent's and do not exist here: joining would wait forever and
    // detaching touches their state. Leak the handles (moving them calls no pthread function).
    new std::vector<std::thread>(std::move(threads_));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run(std::function<void(int)> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = std::move(job);
    running_ = size();
    ++job_generation_;
  }
  work_cv_.notify_all();
}

void ThreadPool::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_cv_.wait(lock, [this] { return running_ == 0; });
}

void ThreadPool::loop(int index) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || job_generation_ != seen; });
    if (stop_) return;
    seen = job_generation_;
    auto job = job_;
    lock.unlock();
    job(index);  // jobs catch their own exceptions
    job = nullptr;  // drop this thread's reference outside the lock
    lock.lock();
    if (--running_ == 0) {
      job_ = nullptr;  // nothing may keep a finished epoch (and its buffers) alive
      idle_cv_.notify_all();
    }
  }
}

}  // namespace fastload
