// Engine: threads + buffers + the running epoch; see engine.h.
#include "core/engine.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unistd.h>

#include "core/fork_guard.h"

namespace fastload {

namespace {
// Opened once by one thread; the others wait for it.
class Latch {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};
}  // namespace

Engine::Engine(std::vector<ArrayColumn> columns, const EngineOptions& options,
               std::shared_ptr<HostAllocator> allocator)
    : Engine(std::make_shared<ArraySource>(std::move(columns)), options, std::move(allocator)) {}

Engine::Engine(std::shared_ptr<BatchSource> source, const EngineOptions& options,
               std::shared_ptr<HostAllocator> allocator)
    : options_(options), source_(std::move(source)), fork_generation_(fork_generation()) {
  if (!source_) throw std::invalid_argument("an engine needs a source");
  if (options.batch_size <= 0)
    throw std::invalid_argument("batch_size must be positive, got " +
                                std::to_string(options.batch_size));
  if (options.prefetch <= 0)
    throw std::invalid_argument("prefetch must be positive, got " +
                                std::to_string(options.prefetch));
  layout_ = options.layout ? options.layout
                           : std::make_shared<BatchLayout>(source_->schema(), options.with_index, options.with_valid,
                                                           options.batch_size, options.with_source);
  if (layout_->max_rows != options.batch_size || layout_->with_index != options.with_index ||
      layout_->with_valid != options.with_valid || layout_->with_source != options.with_source)
    throw std::invalid_argument("the engine's layout was built for other batch options");
  default_allocator_ = std::move(allocator);
  PoolSet set{default_allocator_, {}};
  for (size_t p = 0; p < layout_->num_parts(); ++p)
    set.pools.push_back(BufferPool::create(layout_->part_bytes(p), batches_in_use(options.prefetch), default_allocator_));
  sets_.push_back(std::move(set));
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

void Engine::stop_current(bool restart) {
  if (!current_) return;
  current_->cancel();
  join_job(restart);
  // Only ready batches go back: a batch a thread left behind still writes stays with that thread.
  current_->release_unconsumed();  // reusable by the next epoch, even if Python keeps the old one
  current_.reset();
}

bool Engine::join_job(bool restart) {
  if (!stop_policy_.stuck) {
    threads_->wait_idle();
    return true;
  }
  const auto deadline = std::chrono::steady_clock::now() + stop_policy_.grace;
  std::string stuck;
  for (;;) {
    if (threads_->wait_idle_for(std::chrono::milliseconds(10))) return true;
    stuck = stop_policy_.stuck();
    if (!stuck.empty() || std::chrono::steady_clock::now() >= deadline) break;
  }
  const int left = threads_->abandon();
  threads_.reset();  // joins nothing: abandon() detached them
  if (left > 0) {
    if (left_behind_ == 0) left_behind_in_ = stuck;
    left_behind_ += left;
    if (stop_policy_.left_behind) stop_policy_.left_behind(left);
  }
  if (restart) threads_ = std::make_unique<ThreadPool>(options_.num_threads);
  return left == 0;
}

void Engine::set_stop_policy(StopPolicy policy) {
  std::lock_guard<std::mutex> lock(mutex_);
  stop_policy_ = std::move(policy);
}

int64_t Engine::left_behind() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return left_behind_;
}

std::string Engine::left_behind_in() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return left_behind_in_;
}

std::shared_ptr<Pipeline> Engine::start(std::vector<EpochPlan> plans, int64_t fail_at_step) {
  std::vector<OutputSpec> outputs;
  for (EpochPlan& p : plans) outputs.push_back({std::move(p), false});
  return start(std::move(outputs), fail_at_step);
}

std::shared_ptr<Pipeline> Engine::start(std::vector<OutputSpec> outputs, int64_t fail_at_step,
                                        std::shared_ptr<HostAllocator> host_memory,
                                        int64_t extra_buffers) {
  check_not_forked();
  std::lock_guard<std::mutex> lock(mutex_);
  if (!threads_) throw std::runtime_error("this Loader is closed");
  stop_current();
  if (!host_memory) host_memory = default_allocator_;
  // The pools of each kind of memory the outputs use: kept from the last epoch, or new. Buffers
  // users still hold keep a dropped pool alive and return to it.
  std::vector<PoolSet> sets;
  std::vector<int64_t> outputs_of, natives_of;
  std::vector<std::vector<std::shared_ptr<BufferPool>>> per_output;
  for (const OutputSpec& spec : outputs) {
    const std::shared_ptr<HostAllocator>& memory = spec.memory ? spec.memory : host_memory;
    size_t k = 0;
    while (k < sets.size() && sets[k].allocator != memory) ++k;
    if (k == sets.size()) {
      auto old = std::find_if(sets_.begin(), sets_.end(), [&](const PoolSet& s) { return s.allocator == memory; });
      if (old != sets_.end()) {
        sets.push_back(*old);
      } else {
        PoolSet set{memory, {}};
        for (size_t p = 0; p < layout_->num_parts(); ++p)
          set.pools.push_back(BufferPool::create(layout_->part_bytes(p), 0, memory));
        sets.push_back(std::move(set));
      }
      outputs_of.push_back(0);
      natives_of.push_back(0);
    }
    ++outputs_of[k];
    natives_of[k] += spec.native_consumer ? 1 : 0;
    per_output.push_back(sets[k].pools);
  }
  for (PoolSet& old : sets_)
    if (std::none_of(sets.begin(), sets.end(), [&](const PoolSet& s) { return s.allocator == old.allocator; }))
      for (auto& pool : old.pools) pool->set_keep(0);  // spares of memory no output uses now go
  // Each output has its batches in use (batches_in_use: the window, plus the one a Python loop
  // variable still holds while next() hands over the following one); native consumers hold a few
  // more (copies in flight); and one recycled spare (for one output: batches_held). With that many, a training loop that drops each
  // batch never makes the pool allocate beyond the reservation below.
  // Page-locked memory is allocated up front, before any batch of the epoch is built: its
  // allocation may synchronise the device, and made on demand it would come at a time that
  // depends on how the threads ran (possibly while a user captures a graph, or mid-epoch). The
  // pools keep it across epochs, so only the first epoch (or one that needs more) allocates.
  // As much as the outputs can hold at once, not the spare: a native consumer's batches leave
  // the window (and free a place for the next one) only when the consumer takes them, and its
  // buffers never reach a loop variable, so it holds at most `prefetch` plus the extra ones
  // (copies in flight of batches already taken); a Python consumer at most `prefetch` plus the
  // one its loop variable holds.
  // Thread 0 allocates, a buffer of each part in turn so that running out of memory starves no
  // part; the other threads wait for it, so no acquire() races the reservation (which could
  // allocate one buffer more than needed). Not on the caller's thread: start() returns at once.
  std::vector<std::pair<std::shared_ptr<BufferPool>, int64_t>> reserve;
  for (size_t k = 0; k < sets.size(); ++k) {
    const int64_t keep = batches_in_use(options_.prefetch) * outputs_of[k] + (natives_of[k] ? extra_buffers : 0) + 1;
    const int64_t held = keep - 1 - natives_of[k];
    for (auto& pool : sets[k].pools) {
      pool->set_keep(keep);
      if (sets[k].allocator->page_locked()) reserve.emplace_back(pool, held);
    }
  }
  sets_ = std::move(sets);
  auto pipeline = std::make_shared<Pipeline>(source_, layout_, std::move(outputs), options_.prefetch,
                                             std::move(per_output), fail_at_step);
  current_ = pipeline;
  if (reserve.empty()) {  // ordinary memory: allocated on demand, never waited for
    threads_->run([pipeline](int thread) { pipeline->work(thread); });
    return pipeline;
  }
  auto reserved = std::make_shared<Latch>();
  threads_->run([pipeline, reserve = std::move(reserve), reserved](int thread) {
    if (thread == 0) {
      int64_t most = 0;
      for (const auto& r : reserve) most = std::max(most, r.second);
      bool ok = true;
      // Stops early when out of memory (the epoch allocates on demand then, and reports a failure
      // where it happens) or when the epoch is cancelled (the next one reserves the rest).
      for (int64_t k = 1; k <= most && ok && !pipeline->cancelled(); ++k)
        for (const auto& [pool, n] : reserve)
          if (k <= n && !(ok = pool->reserve(k))) break;
      reserved->open();  // reserve() never throws: the others always get here
    } else {
      reserved->wait();
    }
    pipeline->work(thread);
  });
  return pipeline;
}

void Engine::stop_epoch() {
  if (fork_generation() != fork_generation_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (threads_) stop_current();
}

void Engine::cancel_current() {
  if (fork_generation() != fork_generation_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (current_) current_->cancel();
}

void Engine::close() {
  if (fork_generation() != fork_generation_) return;  // the destructor leaks in a child
  std::lock_guard<std::mutex> lock(mutex_);
  if (!threads_) return;
  stop_current(/*restart=*/false);
  threads_.reset();
  for (PoolSet& set : sets_)
    for (auto& pool : set.pools) pool->set_keep(0);  // spares go now; buffers users hold return later
}

BufferPoolCounts Engine::host_counts(bool page_locked) const {
  std::lock_guard<std::mutex> lock(mutex_);
  BufferPoolCounts sum;
  for (const PoolSet& set : sets_) {
    if (set.allocator->page_locked() != page_locked) continue;
    for (const auto& pool : set.pools) sum += pool->counts();
  }
  return sum;
}

BufferPoolCounts Engine::host_counts() const {
  BufferPoolCounts sum = host_counts(false);
  sum += host_counts(true);
  return sum;
}

size_t Engine::host_bytes() const { return host_bytes(false) + host_bytes(true); }

size_t Engine::host_bytes(bool page_locked) const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t bytes = 0;
  for (const PoolSet& set : sets_)
    if (set.allocator->page_locked() == page_locked)
      for (const auto& pool : set.pools) bytes += static_cast<size_t>(pool->counts().live()) * pool->buffer_bytes();
  return bytes;
}

bool Engine::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !threads_;
}

}  // namespace fastload
