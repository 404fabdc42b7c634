// Recycled host buffers for one part of a batch (one column, the ids or the valid mask). A buffer
// carries its own state: with the loader (being filled, waiting, or being copied to a device) or
// with the user (handed out; returns when the last reference dies). The pool never waits for a
// buffer (it allocates) and never frees one mid-epoch (allocations cost milliseconds when the
// memory is page-locked); set_keep() at an epoch boundary trims the spares.
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
  virtual bool page_locked() const { return false; }
};
std::shared_ptr<HostAllocator> make_aligned_allocator();

class BufferPool;

class HostBuffer {
 public:
  std::byte* data() const { return data_; }
  size_t size() const { return bytes_; }
  // The buffer leaves the loader's hands: from now on it counts as the user's until it dies.
  void hand_to_user();

 private:
  friend class BufferPool;
  HostBuffer(BufferPool* pool, std::byte* data, size_t bytes, int filler)
      : pool_(pool), data_(data), bytes_(bytes), filler_(filler) {}
  BufferPool* pool_;
  std::byte* data_;
  size_t bytes_;
  int filler_;              // the thread that acquired it to fill it (-1: none named)
  bool with_user_ = false;  // guarded by the pool's mutex
};

struct BufferPoolCounts {
  int64_t allocations = 0;  // buffers allocated so far
  int64_t frees = 0;        // buffers freed so far
  int64_t free = 0;         // spares ready for reuse
  int64_t with_loader = 0;  // acquired and not handed out
  int64_t with_user = 0;    // handed out and still referenced
  int64_t live() const { return free + with_loader + with_user; }
  int64_t loader_held() const { return free + with_loader; }
  BufferPoolCounts& operator+=(const BufferPoolCounts& o) {  // sums over pools
    allocations += o.allocations;
    frees += o.frees;
    free += o.free;
    with_loader += o.with_loader;
    with_user += o.with_user;
    return *this;
  }
};

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // keep: the spares the pool may hold on its side at an epoch boundary (see set_keep).
  static std::shared_ptr<BufferPool> create(size_t buffer_bytes, int64_t keep,
                                            std::shared_ptr<HostAllocator> allocator);
  ~BufferPool();  // frees the spares; in a forked child it leaks them (see fork_guard.h)

  // A buffer for the loader; reused when one is free, else freshly allocated. Never waits.
  // `filler` names the collation thread that will write it: of the last few buffers returned, it
  // gets one that thread wrote before, whose lines are likelier still in that core's own cache
  // (a store to a line another core holds, or only the L3, first has to fetch the line; with
  // 1 KiB rows that doubled the copy's cost, bench/RESULTS.md). -1: the last one returned.
  std::shared_ptr<HostBuffer> acquire(int filler = -1);
  // Sets `keep` and frees spares beyond it. Called when an epoch starts: mid-epoch the pool
  // keeps every returned buffer, so a user who holds batches for a while and drops them together
  // costs allocations once per epoch, not once per batch.
  void set_keep(int64_t keep);
  // Allocates spares until `n` buffers are live (those users hold count): at an epoch start, for
  // memory whose allocation may synchronise a device, so that the epoch itself allocates none.
  // The caller must not acquire() concurrently (else both may allocate the last one). False
  // when an allocation failed: the pool then grows on demand as usual (and reports it there).
  bool reserve(int64_t n) noexcept;

  size_t buffer_bytes() const { return buffer_bytes_; }
  const HostAllocator& allocator() const { return *allocator_; }
  BufferPoolCounts counts() const;

 private:
  friend class HostBuffer;
  BufferPool(size_t buffer_bytes, int64_t keep, std::shared_ptr<HostAllocator> allocator);
  void give_back(HostBuffer* b) noexcept;
  void trim_locked(std::vector<std::byte*>* excess);
  // A newly allocated and counted buffer: a spare in free_, or else one the caller holds (with_loader).
  std::byte* allocate_new(bool spare);

  const size_t buffer_bytes_;
  const uint64_t fork_generation_;
  std::shared_ptr<HostAllocator> allocator_;
  mutable std::mutex mutex_;
  int64_t keep_;  // guarded by mutex_
  // Spares, the last returned at the back, each with the thread that last filled it.
  struct Spare {
    std::byte* data;
    int filler;
  };
  std::vector<Spare> free_;
  BufferPoolCounts counts_;
};

}  // namespace fastload
