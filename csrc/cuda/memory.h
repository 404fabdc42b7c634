// Where a GPU loader's memory comes from.
//
// Host: page-locked slots (cuMemHostAlloc, portable to every context) injected into the core's
// buffer pools, so collation threads gather straight into memory the copy engine can read; or,
// with worker processes, their shared-memory slots page-locked in place (cuMemHostRegister), so
// a sample is copied once, from the worker's output to the device.
//
// Device: the engine's own pool of cuMemAlloc buffers, one per part of a batch, not PyTorch's
// caching allocator. Why: a batch's memory must not be reused while the consumer may still read
// it, and only the loader knows when that is (events recorded on the consumer's streams when the
// last reference dies); the transfer thread and deleters allocate and free without the GIL,
// which torch's allocator (a Python call from here) would need; and the stand-in driver can test
// every path of it, which a CPU build of torch cannot do for torch's allocator. The costs of not
// being torch's, and what is done about each: torch does not see the memory (the loader reports
// it: stats().device_bytes); torch's cache may hold the memory the pool needs (on
// CUDA_ERROR_OUT_OF_MEMORY the pool waits for a buffer to come back instead of growing, and the
// consumer's next() empties torch's cache before giving up, as torch's own allocator does);
// torch's record_stream does nothing here (fastload.record_stream does it). Buffers are
// allocated up front (TransferEngine reserves what a loop needs before its first copy), more
// only when the user holds more batches, and reused, never freed mid-epoch (cuMemFree
// synchronises the device); each keeps its device's primary context alive, so a batch stays
// valid after its loader is gone.
#pragma once
#include <chrono>
#include <condition_variable>
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

// Another allocator's memory, page-locked for the GPU: each allocation is registered with
// cuMemHostRegister (portable to every context) once, when it is made, and unregistered before
// it goes back (the segments of worker processes: registered memory must not be unmapped).
// Both the registration and the unregistration may synchronise the device: the latter runs on
// the deferred-free thread, then the memory goes back to the inner allocator.
class RegisteredAllocator final : public fastload::HostAllocator {
 public:
  // skip: the deliberate misuse of tests (the memory is then never page-locked).
  RegisteredAllocator(std::shared_ptr<PrimaryContext> ctx, std::shared_ptr<fastload::HostAllocator> inner,
                      bool skip = false)
      : ctx_(std::move(ctx)), inner_(std::move(inner)), skip_(skip) {}
  void* allocate(size_t bytes) override;  // throws std::bad_alloc when out of memory
  void deallocate(void* p, size_t bytes) noexcept override;
  bool page_locked() const override { return true; }

 private:
  std::shared_ptr<PrimaryContext> ctx_;
  std::shared_ptr<fastload::HostAllocator> inner_;
  const bool skip_;
};

class DevicePool;

// One part's device memory. A new copy may write it only after its release events complete:
// when the user's last reference dies, one is recorded on the stream the batch was handed out on
// and one on every stream recorded with record_stream() meanwhile; when the loader drops a batch
// unseen, one on the copy stream.
class DeviceBuffer {
 public:
  api::CUdeviceptr ptr() const { return ptr_; }
  size_t size() const { return bytes_; }
  int device() const;
  const std::shared_ptr<PrimaryContext>& context() const { return releases_[0].context(); }
  // The events of the last use that a new copy into this buffer must wait on.
  size_t pending_releases() const { return pending_; }
  const Event& release_event(size_t i) const { return releases_[i]; }
  // The buffer is the user's from now on, used on `stream` (see record_stream).
  void hand_out(api::CUstream stream);
  // Records a release event on `stream` (the one the batch was handed out on: the caller may
  // name it differently, see UserDevicePart) and on each recorded stream, after everything
  // queued on them so far. Never throws (it runs in deleters). If a record fails, that event
  // would still mark an older use (or none), and a copy that waited on it could overwrite memory
  // the consumer still reads: the device is synchronised instead, and if even that fails the
  // buffer is retired for good (the pool never hands it out again). A failure other than driver
  // shutdown is logged.
  void release_after(api::CUstream stream) noexcept;

 private:
  friend class DevicePool;
  friend bool record_stream(int device, api::CUdeviceptr ptr, api::CUstream stream);
  DeviceBuffer(std::shared_ptr<PrimaryContext> ctx, api::CUdeviceptr ptr, size_t bytes);
  std::vector<Event> releases_;       // [0] for the stream handed out on; more for recorded streams
  std::vector<api::CUstream> uses_;   // the current use's streams: [0] handed out on, then recorded
  api::CUdeviceptr ptr_;
  size_t bytes_;
  const uint64_t fork_generation_;
  size_t pending_ = 0;
  bool handed_out_ = false;  // guarded by the registry's mutex (memory.cpp)
  bool retired_ = false;
};

// fastload.record_stream: the live batch memory on `device` that holds `ptr` (a tensor's data, a
// view's included) will be rewritten only after the work queued on `stream` when the last
// reference dies has run, as well as the work of the stream it was handed out on. False when
// `ptr` is not in a batch part the user holds. Throws DriverError if an event cannot be made.
bool record_stream(int device, api::CUdeviceptr ptr, api::CUstream stream);

class DevicePool : public std::enable_shared_from_this<DevicePool> {
 public:
  static std::shared_ptr<DevicePool> create(std::shared_ptr<PrimaryContext> ctx, size_t bytes, int64_t keep);
  ~DevicePool();
  // A buffer for a new copy: a spare if one is free, else a new allocation (the pool grows
  // rather than wait for batches the user holds); null when the device is out of memory. The
  // caller makes its copy stream wait on each of its pending_releases().
  std::shared_ptr<DeviceBuffer> acquire();
  // After an out-of-memory acquire(): waits up to `timeout` for a buffer to come back, then
  // tries an allocation again (memory may have been freed elsewhere); null if neither worked.
  std::shared_ptr<DeviceBuffer> acquire_waiting(std::chrono::milliseconds timeout);
  int64_t spare() const;         // buffers free for reuse
  // Allocates spares until `n` buffers are live (those users hold count); false (and stops) when
  // the device is out of memory, throws DriverError on another failure. On the thread that
  // acquires (no acquire() may run concurrently).
  bool reserve(int64_t n);
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
  std::shared_ptr<DeviceBuffer> wrap(DeviceBuffer* b);
  DeviceBuffer* allocate();  // null when out of memory; throws on other errors

  std::shared_ptr<PrimaryContext> ctx_;
  const size_t bytes_;
  const uint64_t fork_generation_;
  mutable std::mutex mutex_;
  std::condition_variable returned_;  // a buffer came back
  int64_t keep_;
  std::vector<DeviceBuffer*> free_;
  int64_t live_ = 0, allocations_ = 0, retired_ = 0;
};

}  // namespace fastload::cuda
