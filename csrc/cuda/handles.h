// Owned CUDA handles: the device's primary context (shared with PyTorch), streams and events.
// Move-only owners whose destructors never throw; each keeps its context alive.
#pragma once
#include <memory>

#include "cuda/driver.h"

namespace fastload::cuda {

// The primary context of one device, retained while any fastload object of that device lives
// (batches may outlive their loader). One per device per process, shared.
class PrimaryContext {
 public:
  static std::shared_ptr<PrimaryContext> retain(int device);  // throws Unavailable / DriverError
  ~PrimaryContext();
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  int device() const { return device_; }
  api::CUcontext handle() const { return ctx_; }
  // For fastload's own threads: makes this context current for good.
  void make_current() const;

 private:
  PrimaryContext(int device, api::CUcontext ctx) : device_(device), ctx_(ctx) {}
  int device_;
  api::CUcontext ctx_;
};

// Makes a context current for a scope on a thread that is not fastload's (a Python thread that
// drops a batch, say) and restores what was current, so PyTorch's idea of the current device
// never changes under the user.
class ScopedContext {
 public:
  explicit ScopedContext(const PrimaryContext& ctx) noexcept;
  ~ScopedContext();
  bool ok() const { return ok_; }

 private:
  api::CUcontext previous_ = nullptr;
  bool switched_ = false, ok_ = false;
};

// A user's CUDA graph capture in global mode (torch.cuda.graph's default) makes every call that may
// synchronise or allocate (cuEventQuery/Synchronize, cuStreamSynchronize, cuMemAlloc/Free,
// cuMemHostAlloc/FreeHost, cuMemHostRegister ...) fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
// on any thread that is not in relaxed capture mode, and invalidates the user's capture. So:
// fastload's own threads (transfer, retire, deferred frees) switch to relaxed mode for good before
// their first driver call; on any other thread (the user's, and the collation threads, which may
// run the user's dataset code) each such call runs inside a RelaxedCapture scope, which restores
// the thread's own mode after.
void relax_capture_for_this_thread();  // throws DriverError

class RelaxedCapture {
 public:
  RelaxedCapture() noexcept;  // a failure leaves the mode as it was (the call then fails as before)
  ~RelaxedCapture();
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  int previous_ = 0;
  bool exchanged_ = false;
};

class Stream {
 public:
  // Non-blocking: a blocking stream would serialise with PyTorch's legacy default stream.
  explicit Stream(std::shared_ptr<PrimaryContext> ctx);
  ~Stream();
  Stream(Stream&& o) noexcept : ctx_(std::move(o.ctx_)), s_(o.s_) { o.s_ = nullptr; }
  Stream& operator=(Stream&&) = delete;
  api::CUstream get() const { return s_; }
  void synchronize() const;

 private:
  std::shared_ptr<PrimaryContext> ctx_;
  api::CUstream s_ = nullptr;
};

class Event {
 public:
  // Blocking sync, so a thread waiting for a copy sleeps instead of spinning on a core the
  // collation threads need; without timing (cheaper) unless asked for.
  explicit Event(std::shared_ptr<PrimaryContext> ctx, bool timing = false);
  ~Event();
  Event(Event&& o) noexcept : ctx_(std::move(o.ctx_)), e_(o.e_) { o.e_ = nullptr; }
  Event& operator=(Event&&) = delete;
  api::CUevent get() const { return e_; }
  void record(api::CUstream stream) const;
  bool done() const;  // cuEventQuery: true when complete; throws on an error
  void synchronize() const;
  // Milliseconds from `start` to this event, both complete timing events (cuEventElapsedTime).
  float elapsed_since(const Event& start) const;
  const std::shared_ptr<PrimaryContext>& context() const { return ctx_; }

 private:
  std::shared_ptr<PrimaryContext> ctx_;
  api::CUevent e_ = nullptr;
};

}  // namespace fastload::cuda
