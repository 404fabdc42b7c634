// Pinned host slots and the device buffer pool; see memory.h.
#include "cuda/memory.h"

#include <new>

#include "core/fork_guard.h"

namespace fastload::cuda {

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
  ScopedContext scope(*ctx_);
  RelaxedCapture relaxed;
  log_failure(driver().cuMemFreeHost(p), "cuMemFreeHost");
}

int DeviceBuffer::device() const { return release_.context()->device(); }

void DeviceBuffer::release_after(api::CUstream stream) noexcept {
  if (fork_generation() != fork_generation_) return;  // no driver calls in a forked child
  ScopedContext scope(*release_.context());
  const api::CUresult r = driver().cuEventRecord(release_.get(), stream);
  if (r == api::CUDA_SUCCESS) {
    release_pending_ = true;
    return;
  }
  log_failure(r, "cuEventRecord (batch release)");
  // Everything queued anywhere on the device before now includes the consumer's reads (the last
  // reference is gone, so no new ones can come): once it has run, the memory is free. Rare, and
  // a stall rather than a race.
  RelaxedCapture relaxed;
  const api::CUresult s = driver().cuCtxSynchronize();
  if (s == api::CUDA_SUCCESS) {
    release_pending_ = false;
    return;
  }
  log_failure(s, "cuCtxSynchronize (after a failed batch release)");
  retired_ = true;
}

std::shared_ptr<DevicePool> DevicePool::create(std::shared_ptr<PrimaryContext> ctx, size_t bytes, int64_t keep) {
  return std::shared_ptr<DevicePool>(new DevicePool(std::move(ctx), bytes ? bytes : 1, keep));
}

DevicePool::~DevicePool() {
  if (fork_generation() != fork_generation_) return;  // no driver calls in a forked child
  for (DeviceBuffer* b : free_) free_buffer(b);
}

std::shared_ptr<DeviceBuffer> DevicePool::acquire() {
  DeviceBuffer* b = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      b = free_.back();
      free_.pop_back();
    }
  }
  if (!b) {
    ScopedContext scope(*ctx_);
    RelaxedCapture relaxed;
    api::CUdeviceptr ptr = 0;
    check(driver().cuMemAlloc(&ptr, bytes_), "cuMemAlloc");
    try {
      b = new DeviceBuffer(ctx_, ptr, bytes_);
      std::lock_guard<std::mutex> lock(mutex_);
      free_.reserve(static_cast<size_t>(live_ + 1));  // give_back (noexcept) never reallocates
      ++live_;
      ++allocations_;
    } catch (...) {
      delete b;
      log_failure(driver().cuMemFree(ptr), "cuMemFree");
      throw;
    }
  }
  auto self = shared_from_this();  // a batch may outlive the loader: the pool lives as long
  return std::shared_ptr<DeviceBuffer>(b, [self](DeviceBuffer* x) { self->give_back(x); });
}

void DevicePool::give_back(DeviceBuffer* b) noexcept {
  // In a forked child the parent's threads may have held this mutex: leak instead of locking.
  if (fork_generation() != fork_generation_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  if (b->retired_) {  // reads of it may still be queued: neither reused nor freed (leaked)
    ++retired_;
    return;
  }
  free_.push_back(b);
}

void DevicePool::free_buffer(DeviceBuffer* b) noexcept {
  {
    ScopedContext scope(*ctx_);
    RelaxedCapture relaxed;
    // The last consumer's queued reads may still run: freeing under them would be a
    // use-after-free on the device (cuMemFree's implicit synchronisation is not a contract).
    if (b->release_pending_) log_failure(driver().cuEventSynchronize(b->release_.get()), "cuEventSynchronize");
    log_failure(driver().cuMemFree(b->ptr_), "cuMemFree");
  }
  delete b;
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
