// Buffer recycling; see buffer_pool.h.
#include "core/buffer_pool.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#include "core/fork_guard.h"

namespace fastload {

namespace {
// acquire(filler) looks this far back among the spares for one its thread filled: the most
// recently returned ones, which are the likeliest to be cached at all.
constexpr size_t kAffinityScan = 8;

class AlignedAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    // Page alignment: whole pages for the kernel, and more than the 256 bytes a device copy or
    // a DLPack consumer may want.
    constexpr size_t kAlign = 4096;
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void deallocate(void* p, size_t) noexcept override { std::free(p); }
};
}  // namespace

std::shared_ptr<HostAllocator> make_aligned_allocator() {
  return std::make_shared<AlignedAllocator>();
}

void HostBuffer::hand_to_user() {
  std::lock_guard<std::mutex> lock(pool_->mutex_);
  if (with_user_) return;
  with_user_ = true;
  --pool_->counts_.with_loader;
  ++pool_->counts_.with_user;
}

std::shared_ptr<BufferPool> BufferPool::create(size_t buffer_bytes, int64_t keep,
                                               std::shared_ptr<HostAllocator> allocator) {
  return std::shared_ptr<BufferPool>(new BufferPool(buffer_bytes, keep, std::move(allocator)));
}

BufferPool::BufferPool(size_t buffer_bytes, int64_t keep, std::shared_ptr<HostAllocator> allocator)
    : buffer_bytes_(buffer_bytes ? buffer_bytes : 1), fork_generation_(fork_generation()),
      allocator_(std::move(allocator)), keep_(keep) {}

BufferPool::~BufferPool() {
  // In a forked child, freeing page-locked memory would be a driver call the child cannot make.
  if (fork_generation() != fork_generation_) return;
  for (const Spare& s : free_) allocator_->deallocate(s.data, buffer_bytes_);
}

std::shared_ptr<HostBuffer> BufferPool::acquire(int filler) {
  std::byte* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!free_.empty()) {
      size_t pick = free_.size() - 1;
      if (filler >= 0)
        for (size_t k = 0; k < std::min(kAffinityScan, free_.size()); ++k)
          if (free_[free_.size() - 1 - k].filler == filler) {
            pick = free_.size() - 1 - k;
            break;
          }
      data = free_[pick].data;
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(pick));  // the rest keep their order
      --counts_.free;
      ++counts_.with_loader;
    }
  }
  if (!data) data = allocate_new(false);
  // The deleter holds the pool alive: a batch may outlive the loader that made it.
  auto self = shared_from_this();
  return std::shared_ptr<HostBuffer>(new HostBuffer(this, data, buffer_bytes_, filler),
                                     [self](HostBuffer* b) {
                                       self->give_back(b);
                                       delete b;
                                     });
}

void BufferPool::trim_locked(std::vector<std::byte*>* excess) {
  while (!free_.empty() && counts_.free + counts_.with_loader > keep_) {
    excess->push_back(free_.back().data);
    free_.pop_back();
    --counts_.free;
    ++counts_.frees;
  }
}

bool BufferPool::reserve(int64_t n) noexcept {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (counts_.live() >= n) return true;
    }
    // Outside the lock (a page-locked allocation takes milliseconds): buffers users hold may
    // come back meanwhile. The caller makes sure no acquire() runs concurrently, so live() is
    // only ever raised here: the pool never ends up above `n`.
    try {
      allocate_new(true);
    } catch (...) {  // out of memory, or a driver error: acquire() meets (and reports) it again
      return false;
    }
  }
}

std::byte* BufferPool::allocate_new(bool spare) {
  // Outside the lock (a page-locked allocation takes milliseconds); may throw: nothing counted yet.
  auto* data = static_cast<std::byte*>(allocator_->allocate(buffer_bytes_));
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    // Room for every live buffer in free_, so give_back (noexcept) never reallocates.
    free_.reserve(static_cast<size_t>(counts_.live() + 1));
  } catch (...) {
    allocator_->deallocate(data, buffer_bytes_);
    throw;
  }
  ++counts_.allocations;
  if (spare) {
    free_.push_back({data, -1});
    ++counts_.free;
  } else {
    ++counts_.with_loader;
  }
  return data;
}

void BufferPool::set_keep(int64_t keep) {
  std::vector<std::byte*> excess;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    keep_ = keep;
    trim_locked(&excess);
  }
  for (std::byte* p : excess) allocator_->deallocate(p, buffer_bytes_);
}

void BufferPool::give_back(HostBuffer* b) noexcept {
  // In a forked child the parent's threads may have held this mutex: leak instead of locking.
  if (fork_generation() != fork_generation_) return;
  std::lock_guard<std::mutex> lock(mutex_);
  --(b->with_user_ ? counts_.with_user : counts_.with_loader);
  free_.push_back({b->data(), b->filler_});  // never reallocates: acquire() reserved room for every live buffer
  ++counts_.free;
}

BufferPoolCounts BufferPool::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

}  // namespace fastload
