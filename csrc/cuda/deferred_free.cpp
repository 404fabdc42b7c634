// The deferred-free thread; see deferred_free.h.
#include "cuda/deferred_free.h"

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

#include "core/fork_guard.h"
#include "cuda/handles.h"

namespace fastload::cuda {

namespace {

class Reaper {
 public:
  void push(std::function<void()>& task) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!started_) {
      std::thread(&Reaper::loop, this).detach();  // the process's, until it ends (see header)
      started_ = true;
    }
    tasks_.push_back(std::move(task));
    ++queued_;
    lock.unlock();
    wake_.notify_one();
  }

  void flush() {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t target = queued_;
    done_cv_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  void loop() {
    try {
      relax_capture_for_this_thread();
    } catch (const std::exception& e) {
      // Frees then run in the default mode: they may fail during a user's graph capture.
      std::fprintf(stderr, "fastload: %s\n", e.what());
    }
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return !tasks_.empty(); });
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      task();
      task = nullptr;  // whatever it captured goes before the next one runs
      lock.lock();
      ++done_;
      done_cv_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, done_cv_;
  std::deque<std::function<void()>> tasks_;
  uint64_t queued_ = 0, done_ = 0;
  bool started_ = false;
};

Reaper& reaper() {
  static Reaper* r = new Reaper;  // leaked: its thread may still run at exit
  return *r;
}

const uint64_t g_generation = fork_generation();

}  // namespace

void defer_free(std::function<void()> task) noexcept {
  if (fork_generation() != g_generation) return;  // a forked child: leak, make no driver call
  try {
    reaper().push(task);  // moves the task only once it is queued
  } catch (...) {
    // Out of memory for the queue: free here and now rather than leak device memory.
    try {
      task();
    } catch (...) {
    }
  }
}

void flush_deferred_frees() {
  if (fork_generation() != g_generation) return;
  reaper().flush();
}

}  // namespace fastload::cuda
