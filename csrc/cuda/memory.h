// Where a GPU loader's memory comes from.
//
// Host: page-locked slots (cuMemHostAlloc, portable to every context) injected into the core's
// buffer pools, so collation threads gather straight into memory the copy engine can read.
//
// Device: the engine's own pool of cuMemAlloc buffers, one per part of a batch, not PyTorch's
// caching allocator. Why: a batch's memory must not be reused while the consumer may still read
// it, and only the loader knows when that is (an event recorded on the consumer's stream when
// the last reference dies). PyTorch's record_stream cannot protect memory its allocator did not
// make, and memory taken from the caching allocator on a side stream is exactly the race SPDL
// documents. Buffers are allocated when first needed and reused, never freed mid-epoch
// (cuMemFree synchronises the device); each keeps its device's primary context alive, so a
// batch stays valid after its loader is gone.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/buffer_pool.h"
#include "core/fork_guard.h"
#include "cuda/handles.h"

namespace fastload::cuda {

class PinnedAllocator final : public fastload::HostAllocator {
 public:
  explicit PinnedAllocator(std::shared_ptr<PrimaryContext> ctx) : ctx_(std::move(ctx)) {}
  void* allocate(size_t bytes) override;  // throws std::bad_alloc when the driver is out of memory
  void deallocate(void* p, size_t bytes) noexcept override;
  bool page_locked() const override { return true; }

 private:
  std::shared_ptr<PrimaryContext> ctx_;
};

class DevicePool;

// One part's device memory. A new copy may write it only after `release` completes: the event
// is recorded on the consumer's stream when the user's last reference dies, or on the copy
// stream when the loader drops the batch unseen.
class DeviceBuffer {
 public:
  api::CUdeviceptr ptr() const { return ptr_; }
  size_t size() const { return bytes_; }
  int device() const;
  const Event& release_event() const { return release_; }
  bool release_pending() const { return release_pending_; }
  // Records the release event on `stream`, after everything queued there so far. Never throws
  // (it runs in deleters). If the record fails, the event would still mark an older use (or
  // none), and a copy that waited on it could overwrite memory the consumer still reads: the
  // device is synchronised instead, and if even that fails the buffer is retired for good (the
  // pool never hands it out again). A failure other than driver shutdown is logged.
  void release_after(api::CUstream stream) noexcept;
  bool retired() const { return retired_; }

 private:
  friend class DevicePool;
  DeviceBuffer(std::shared_ptr<PrimaryContext> ctx, api::CUdeviceptr ptr, size_t bytes)
      : release_(std::move(ctx)), ptr_(ptr), bytes_(bytes), fork_generation_(fork_generation()) {}
  Event release_;
  api::CUdeviceptr ptr_;
  size_t bytes_;
  const uint64_t fork_generation_;
  bool release_pending_ = false;
  bool retired_ = false;
};

class DevicePool : public std::enable_shared_from_this<DevicePool> {
 public:
  static std::shared_ptr<DevicePool> create(std::shared_ptr<PrimaryContext> ctx, size_t bytes, int64_t keep);
  ~DevicePool();
  // A buffer for a new copy: a spare if one is free, else a new allocation (the pool grows
  // rather than wait for batches the user holds). The caller makes its copy stream wait on
  // release_event() when release_pending().
  std::shared_ptr<DeviceBuffer> acquire();
  void set_keep(int64_t keep);  // frees spares beyond keep (at epoch boundaries only)
  int64_t live() const;          // allocated and not freed
  int64_t allocations() const;
  int64_t retired() const;       // buffers never reused: their release could not be ordered
  size_t buffer_bytes() const { return bytes_; }

 private:
  DevicePool(std::shared_ptr<PrimaryContext> ctx, size_t bytes, int64_t keep)
      : ctx_(std::move(ctx)), bytes_(bytes), fork_generation_(fork_generation()), keep_(keep) {}
  void give_back(DeviceBuffer* b) noexcept;
  void free_buffer(DeviceBuffer* b) noexcept;

  std::shared_ptr<PrimaryContext> ctx_;
  const size_t bytes_;
  const uint64_t fork_generation_;
  mutable std::mutex mutex_;
  int64_t keep_;
  std::vector<DeviceBuffer*> free_;
  int64_t live_ = 0, allocations_ = 0, retired_ = 0;
};

}  // namespace fastload::cuda
