// Pinned host slots and the device buffer pool; see memory.h.
#include "cuda/memory.h"

#include <algorithm>
#include <map>
#include <new>
#include <utility>

#include "core/fork_guard.h"
#include "cuda/deferred_free.h"

namespace fastload::cuda {

namespace {
// Every live device buffer by (device, address), for record_stream(); its mutex also guards each
// buffer's hand-out state. Leaked on purpose: deleters may run at exit.
struct Registry {
  std::mutex mutex;
  std::map<std::pair<int, api::CUdeviceptr>, DeviceBuffer*> buffers;
};
Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}
}  // namespace

void* PinnedAllocator::allocate(size_t bytes) {
  ScopedContext scope(*ctx_);
  RelaxedCapture relaxed;  // collation threads run user code: their own mode is theirs
  void* p = nullptr;
  const api::CUresult r = driver().cuMemHostAlloc(&p, bytes ? bytes : 1, api::CU_MEMHOSTALLOC_PORTABLE);
  if (r == api::CUDA_ERROR_OUT_OF_MEMORY) throw std::bad_alloc();
  check(r, "cuMemHostAlloc");
  return p;
}

void PinnedAllocator::deallocate(void* p, size_t) noexcept {
  // A slot comes back only after its copy completed: it can go at once, but cuMemFreeHost may
  // synchronise the device, so not on this thread (an epoch start, a deleter).
  defer_free([ctx = ctx_, p] {
    ScopedContext scope(*ctx);
    log_failure(driver().cuMemFreeHost(p), "cuMemFreeHost");
  });
}

DeviceBuffer::DeviceBuffer(std::shared_ptr<PrimaryContext> ctx, api::CUdeviceptr ptr, size_t bytes)
    : ptr_(ptr), bytes_(bytes), fork_generation_(fork_generation()) {
  releases_.emplace_back(std::move(ctx));
  uses_.reserve(4);
}

void* RegisteredAllocator::allocate(size_t bytes) {
  void* p = inner_->allocate(bytes);
  if (skip_) return p;
  ScopedContext scope(*ctx_);
  RelaxedCapture relaxed;  // collation threads run user code: their own mode is theirs
  const api::CUresult r = driver().cuMemHostRegister(p, bytes ? bytes : 1, api::CU_MEMHOSTREGISTER_PORTABLE);
  if (r == api::CUDA_SUCCESS) return p;
  inner_->deallocate(p, bytes);
  if (r == api::CUDA_ERROR_OUT_OF_MEMORY) throw std::bad_alloc();
  check(r, "cuMemHostRegister");
  return nullptr;  // not reached
}

void RegisteredAllocator::deallocate(void* p, size_t bytes) noexcept {
  if (skip_) {
    inner_->deallocate(p, bytes);
    return;
  }
  // As for pinned slots: it comes back only after its copy completed.
  defer_free([ctx = ctx_, inner = inner_, p, bytes] {
    {
      ScopedContext scope(*ctx);
      log_failure(driver().cuMemHostUnregister(p), "cuMemHostUnregister");
    }
    inner->deallocate(p, bytes);  // unmapped only once unregistered
  });
}

int DeviceBuffer::device() const { return context()->device(); }

void DeviceBuffer::hand_out(api::CUstream stream) {
  std::lock_guard<std::mutex> lock(registry().mutex);
  uses_.assign(1, stream);
  handed_out_ = true;
}

bool record_stream(int device, api::CUdeviceptr ptr, api::CUstream stream) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.buffers.upper_bound({device, ptr});
  if (it == r.buffers.begin()) return false;
  DeviceBuffer* b = (--it)->second;
  if (it->first.first != device || ptr >= b->ptr_ + b->bytes_ || !b->handed_out_) return false;
  if (std::find(b->uses_.begin(), b->uses_.end(), stream) != b->uses_.end()) return true;
  if (b->releases_.size() <= b->uses_.size()) {  // an event per stream, made once per buffer
    ScopedContext scope(*b->context());
    b->releases_.emplace_back(b->context());
  }
  b->uses_.push_back(stream);
  return true;
}

void DeviceBuffer::release_after(api::CUstream stream) noexcept {
  if (fork_generation() != fork_generation_) return;  // no driver calls in a forked child
  size_t uses;
  {
    // From here on record_stream() cannot add to uses_ (it needs the buffer handed out), so
    // they are read below without the lock; the next hand_out() comes after the pool's mutex.
    std::lock_guard<std::mutex> lock(registry().mutex);
    handed_out_ = false;
    uses = std::max<size_t>(1, uses_.size());
  }
  ScopedContext scope(*context());
  pending_ = 0;
  for (size_t i = 0; i < uses; ++i) {
    // A recorded CU_STREAM_PER_THREAD named the recording thread's stream, which this thread
    // cannot name: the legacy stream waits for it (and every other blocking stream).
    api::CUstream on = i == 0 ? stream : uses_[i];
    if (i > 0 && on == api::CU_STREAM_PER_THREAD) on = api::CU_STREAM_LEGACY;
    const api::CUresult r = driver().cuEventRecord(releases_[i].get(), on);
    if (r != api::CUDA_SUCCESS) {
      log_failure(r, "cuEventRecord (batch release)");
      // Everything queued anywhere on the device before now includes the consumer's reads (the
      // last reference is gone, so no new ones can come): once it has run, the memory is free.
      // Rare, and a stall rather than a race.
      RelaxedCapture relaxed;
      const api::CUresult s = driver().cuCtxSynchronize();
      pending_ = 0;
      if (s != api::CUDA_SUCCESS) {
        log_failure(s, "cuCtxSynchronize (after a failed batch release)");
        retired_ = true;
      }
      break;
    }
    pending_ = i + 1;
  }
  uses_.clear();  // keeps its capacity: no allocation per batch
}

std::shared_ptr<DevicePool> DevicePool::create(std::shared_ptr<PrimaryContext> ctx, size_t bytes, int64_t keep) {
  return std::shared_ptr<DevicePool>(new DevicePool(std::move(ctx), bytes ? bytes : 1, keep));
}

DevicePool::~DevicePool() {
  if (fork_generation() != fork_generation_) return;  // no driver calls in a forked child
  for (DeviceBuffer* b : free_) free_buffer(b);
}

DeviceBuffer* DevicePool::allocate() {
  ScopedContext scope(*ctx_);
  RelaxedCapture relaxed;
  api::CUdeviceptr ptr = 0;
  const api::CUresult r = driver().cuMemAlloc(&ptr, bytes_);
  if (r == api::CUDA_ERROR_OUT_OF_MEMORY) return nullptr;
  check(r, "cuMemAlloc");
  DeviceBuffer* b = nullptr;
  try {
    b = new DeviceBuffer(ctx_, ptr, bytes_);
    {
      std::lock_guard<std::mutex> lock(registry().mutex);
      registry().buffers[{ctx_->device(), ptr}] = b;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    free_.reserve(static_cast<size_t>(live_ + 1));  // give_back (noexcept) never reallocates
    ++live_;
    ++allocations_;
  } catch (...) {
    if (b) {
      std::lock_guard<std::mutex> lock(registry().mutex);
      registry().buffers.erase({ctx_->device(), ptr});
    }
    delete b;
    log_failure(driver().cuMemFree(ptr), "cuMemFree");
    throw;
  }
  return b;
}

std::shared_ptr<DeviceBuffer> DevicePool::wrap(DeviceBuffer* b) {
  auto self = shared_from_this();  // a batch may outlive the loader: the pool lives as long
  return std::shared_ptr<DeviceBuffer>(b, [self](DeviceBuffer* x) { self->give_back(x); });
}

std::shared_ptr<DeviceBuffer> DevicePool::acquire() { return acquire_waiting(std::chrono::milliseconds(0)); }

std::shared_ptr<DeviceBuffer> DevicePool::acquire_waiting(std::chrono::milliseconds timeout) {
  DeviceBuffer* b = nullptr;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    returned_.wait_for(lock, timeout, [&] { return !free_.empty(); });
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    }
  }
  if (!b) b = allocate();
  return b ? wrap(b) : nullptr;
}

bool DevicePool::reserve(int64_t n) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (live_ >= n) return true;
    }
    DeviceBuffer* b = allocate();  // counted live; null when out of memory (other errors throw)
    if (!b) return false;
    give_back(b);  // a spare, with no release to wait for
  }
}

int64_t DevicePool::spare() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return static_cast<int64_t>(free_.size());
}

void DevicePool::give_back(DeviceBuffer* b) noexcept {
  // In a forked child the parent's threads may have held this mutex: leak instead of locking.
  if (fork_generation() != fork_generation_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (b->retired_) {  // reads of it may still be queued: neither reused nor freed (leaked)
      ++retired_;
      return;
    }
    free_.push_back(b);
  }
  returned_.notify_one();  // a transfer thread out of memory may be waiting for it
}

void DevicePool::free_buffer(DeviceBuffer* b) noexcept {
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    registry().buffers.erase({ctx_->device(), b->ptr_});
  }
  // On the deferred-free thread: this may be an epoch start, or a deleter with the GIL held.
  defer_free([ctx = ctx_, b] {
    {
      ScopedContext scope(*ctx);
      // The last consumer's queued reads may still run: freeing under them would be a
      // use-after-free on the device (cuMemFree's implicit synchronisation is not a contract).
      for (size_t i = 0; i < b->pending_; ++i)
        log_failure(driver().cuEventSynchronize(b->releases_[i].get()), "cuEventSynchronize");
      log_failure(driver().cuMemFree(b->ptr_), "cuMemFree");
    }
    delete b;  // its events, and its hold on the context, go after the free
  });
}

void DevicePool::set_keep(int64_t keep) {
  std::vector<DeviceBuffer*> excess;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    keep_ = keep;
    // Called between epochs, when the loader itself holds none in use: only spares count.
    while (static_cast<int64_t>(free_.size()) > keep_) {
      excess.push_back(free_.back());
      free_.pop_back();
      --live_;
    }
  }
  for (DeviceBuffer* b : excess) free_buffer(b);
}

int64_t DevicePool::live() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

int64_t DevicePool::allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocations_;
}

int64_t DevicePool::retired() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return retired_;
}

}  // namespace fastload::cuda
