// Recycled host buffers for batches. A buffer handed to the user returns only when the last
// reference dies; the pool never waits for one (it allocates), and keeps only a few spares.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace fastload {

// Where buffer memory comes from: plain aligned memory here; page-locked memory for GPU targets.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  virtual void* allocate(size_t bytes) = 0;  // throws std::bad_alloc or std::runtime_error
  virtual void deallocate(void* p, size_t bytes) noexcept = 0;
};
std::shared_ptr<HostAllocator> make_aligned_allocator();

class HostBuffer {
 public:
  std::byte* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  friend class BufferPool;
  HostBuffer(std::byte* data, size_t bytes) : data_(data), bytes_(bytes) {}
  std::byte* data_;
  size_t bytes_;
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // keep: most buffers the pool holds on its side (free plus acquired-not-yet-handed-out); a
  // returning buffer beyond that is freed, so loader-held memory stays bounded by keep buffers.
  static std::shared_ptr<BufferPool> create(size_t buffer_bytes, int64_t keep,
                                            std::shared_ptr<HostAllocator> allocator);
  ~BufferPool();

  // A buffer for the pipeline; reused when one is free, else freshly allocated. Never waits.
  std::shared_ptr<HostBuffer> acquire();
  // An acquired buffer left the pipeline (handed to the user, or dropped by a cancelled epoch):
  // it no longer counts against `keep` while it lives.
  void left_pipeline();
  // Changes `keep` (an epoch with more outputs has more batches in flight); frees spares beyond it.
  void set_keep(int64_t keep);

  size_t buffer_bytes() const { return buffer_bytes_; }
  int64_t allocations() const;  // buffers allocated so far (for tests and stats)
  int64_t live_buffers() const;  // allocated and not yet freed

 private:
  BufferPool(size_t buffer_bytes, int64_t keep, std::shared_ptr<HostAllocator> allocator);
  void give_back(std::byte* data) noexcept;

  const size_t buffer_bytes_;
  int64_t keep_;  // guarded by mutex_
  const uint64_t fork_generation_;
  std::shared_ptr<HostAllocator> allocator_;
  mutable std::mutex mutex_;
  std::vector<std::byte*> free_;
  int64_t in_pipeline_ = 0;
  int64_t allocations_ = 0;
  int64_t live_ = 0;
};

}  // namespace fastload
