// Engine: threads + buffers + the running epoch; see engine.h.
#include "core/engine.h"

#include <stdexcept>
#include <string>
#include <unistd.h>

#include "core/fork_guard.h"

namespace fastload {

Engine::Engine(std::vector<ColumnSpec> columns, const EngineOptions& options,
               std::shared_ptr<HostAllocator> allocator)
    : options_(options), fork_generation_(fork_generation()) {
  if (options.batch_size <= 0)
    throw std::invalid_argument("batch_size must be positive, got " +
                                std::to_string(options.batch_size));
  if (options.prefetch <= 0)
    throw std::invalid_argument("prefetch must be positive, got " +
                                std::to_string(options.prefetch));
  layout_ = std::make_shared<BatchLayout>(std::move(columns), options.with_index,
                                          options.with_valid, options.batch_size);
  // Loader-held memory: at most prefetch batches in flight plus one recycled spare.
  pool_ = BufferPool::create(layout_->total_bytes, options.prefetch + 1, std::move(allocator));
  threads_ = std::make_unique<ThreadPool>(options.num_threads);
}

Engine::~Engine() {
  if (fork_generation() != fork_generation_) {
    // Nothing of the parent's threads can be waited for here: leak the lot.
    threads_.release();
    new std::shared_ptr<Pipeline>(std::move(current_));
    return;
  }
  close();
}

void Engine::check_not_forked() const {
  if (fork_generation() != fork_generation_)
    throw std::runtime_error(
        "this fastload Loader was created before a fork(); its threads exist only in the parent "
        "process (this is pid " + std::to_string(getpid()) +
        "). Create a new Loader in the child process.");
}

void Engine::stop_current() {
  if (!current_) return;
  current_->cancel();
  threads_->wait_idle();
  current_->release_unconsumed();  // reusable by the next epoch, even if Python keeps the old one
  current_.reset();
}

std::shared_ptr<Pipeline> Engine::start(std::vector<EpochPlan> plans, int64_t fail_at_step) {
  check_not_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!threads_) throw std::runtime_error("this Loader is closed");
  stop_current();
  // Each output has up to `prefetch` batches in flight; keep one recycled spare besides.
  pool_->set_keep(options_.prefetch * static_cast<int64_t>(plans.size()) + 1);
  auto pipeline = std::make_shared<Pipeline>(layout_, std::move(plans), options_.prefetch, pool_,
                                             fail_at_step);
  current_ = pipeline;
  threads_->run([pipeline](int) { pipeline->work(); });
  return pipeline;
}

void Engine::close() {
  if (fork_generation() != fork_generation_) return;  // the destructor leaks in a child
  std::lock_guard<std::mutex> lock(mutex_);
  if (!threads_) return;
  stop_current();
  threads_.reset();
}

bool Engine::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !threads_;
}

}  // namespace fastload
