// Buffer recycling; see buffer_pool.h.
#include "core/buffer_pool.h"

#include <cstdlib>
#include <new>

#include "core/fork_guard.h"

namespace fastload {

namespace {
class AlignedAllocator final : public HostAllocator {
 public:
  void* allocate(size_t bytes) override {
    // Page alignment: whole pages for the kernel and for a later cudaHostRegister-style pinning.
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

std::shared_ptr<BufferPool> BufferPool::create(size_t buffer_bytes, int64_t keep,
                                               std::shared_ptr<HostAllocator> allocator) {
  return std::shared_ptr<BufferPool>(new BufferPool(buffer_bytes, keep, std::move(allocator)));
}

BufferPool::BufferPool(size_t buffer_bytes, int64_t keep, std::shared_ptr<HostAllocator> allocator)
    : buffer_bytes_(buffer_bytes ? buffer_bytes : 1), keep_(keep),
      fork_generation_(fork_generation()), allocator_(std::move(allocator)) {}

BufferPool::~BufferPool() {
  for (std::byte* p : free_) allocator_->deallocate(p, buffer_bytes_);
}

std::shared_ptr<HostBuffer> BufferPool::acquire() {
  std::byte* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++in_pipeline_;
    if (!free_.empty()) {
      data = free_.back();
      free_.pop_back();
    }
  }
  if (!data) {
    try {
      data = static_cast<std::byte*>(allocator_->allocate(buffer_bytes_));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      --in_pipeline_;
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    ++allocations_;
    ++live_;
  }
  // The deleter holds the pool alive: a batch may outlive the loader that made it.
  auto self = shared_from_this();
  return std::shared_ptr<HostBuffer>(new HostBuffer(data, buffer_bytes_),
                                     [self](HostBuffer* b) {
                                       self->give_back(b->data());
                                       delete b;
                                     });
}

void BufferPool::left_pipeline() {
  if (fork_generation() != fork_generation_) return;  // see give_back
  std::lock_guard<std::mutex> lock(mutex_);
  --in_pipeline_;
}

void BufferPool::set_keep(int64_t keep) {
  std::vector<std::byte*> excess;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    keep_ = keep;
    while (!free_.empty() && static_cast<int64_t>(free_.size()) + in_pipeline_ > keep_) {
      excess.push_back(free_.back());
      free_.pop_back();
      --live_;
    }
  }
  for (std::byte* p : excess) allocator_->deallocate(p, buffer_bytes_);
}

void BufferPool::give_back(std::byte* data) noexcept {
  // In a forked child the parent's threads may have held this mutex: leak instead of locking.
  if (fork_generation() != fork_generation_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (static_cast<int64_t>(free_.size()) + in_pipeline_ < keep_) {
      free_.push_back(data);
      return;
    }
    --live_;
  }
  allocator_->deallocate(data, buffer_bytes_);
}

int64_t BufferPool::allocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocations_;
}

int64_t BufferPool::live_buffers() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

}  // namespace fastload
