// Worker threads that wait for a job and run it; see thread_pool.h.
#include "core/thread_pool.h"

#include <stdexcept>
#include <string>

#include "core/fork_guard.h"

namespace fastload {

ThreadPool::ThreadPool(int num_threads) : state_(std::make_shared<State>()), fork_generation_(fork_generation()) {
  if (num_threads <= 0)
    throw std::invalid_argument("num_threads must be positive, got " +
                                std::to_string(num_threads));
  threads_.reserve(num_threads);
  try {
    for (int i = 0; i < num_threads; ++i) threads_.emplace_back([state = state_, i] { loop(state, i); });
  } catch (...) {
    // A joinable std::thread destroyed by the unwinding would call std::terminate.
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->stop = true;
    }
    state_->work_cv.notify_all();
    for (auto& t : threads_) t.join();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  if (fork_generation() != fork_generation_) {
    // The threads were the parent's and do not exist here: joining would wait forever and
    // detaching touches their state. Leak the handles (moving them calls no pthread function).
    new std::vector<std::thread>(std::move(threads_));
    new std::shared_ptr<State>(std::move(state_));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run(std::function<void(int)> job) {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->job = std::move(job);
    state_->running = size();
    ++state_->job_generation;
  }
  state_->work_cv.notify_all();
}

void ThreadPool::wait_idle() {
  std::unique_lock<std::mutex> lock(state_->mutex);
  state_->idle_cv.wait(lock, [this] { return state_->running == 0; });
}

bool ThreadPool::wait_idle_for(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  return state_->idle_cv.wait_for(lock, limit, [this] { return state_->running == 0; });
}

int ThreadPool::abandon() {
  int running = 0;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
    running = state_->running;
  }
  state_->work_cv.notify_all();
  for (auto& t : threads_) t.detach();
  threads_.clear();
  return running;
}

void ThreadPool::loop(const std::shared_ptr<State>& state, int index) {
  State& s = *state;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(s.mutex);
  for (;;) {
    s.work_cv.wait(lock, [&] { return s.stop || s.job_generation != seen; });
    if (s.stop) return;
    seen = s.job_generation;
    auto job = s.job;
    lock.unlock();
    job(index);  // jobs catch their own exceptions
    job = nullptr;  // drop this thread's reference outside the lock
    lock.lock();
    if (--s.running == 0) {
      s.job = nullptr;  // nothing may keep a finished epoch (and its buffers) alive
      s.idle_cv.notify_all();
    }
  }
}

}  // namespace fastload
