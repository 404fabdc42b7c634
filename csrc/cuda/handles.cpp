// Owned CUDA handles; see handles.h.
#include "cuda/handles.h"

#include <map>
#include <mutex>

namespace fastload::cuda {

std::shared_ptr<PrimaryContext> PrimaryContext::retain(int device) {
  static std::mutex mutex;
  static auto* registry = new std::map<int, std::weak_ptr<PrimaryContext>>();  // leaked: used at exit
  const api::Functions& f = driver();
  const int count = device_count();
  if (device < 0 || device >= count)
    throw std::invalid_argument("device cuda:" + std::to_string(device) + " does not exist: the driver sees " +
                                std::to_string(count) + " CUDA device(s)");
  std::lock_guard<std::mutex> lock(mutex);
  if (auto existing = (*registry)[device].lock()) return existing;
  api::CUdevice dev = 0;
  check(f.cuDeviceGet(&dev, device), "cuDeviceGet");
  api::CUcontext ctx = nullptr;
  check(f.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  std::shared_ptr<PrimaryContext> p(new PrimaryContext(device, ctx));
  (*registry)[device] = p;
  return p;
}

PrimaryContext::~PrimaryContext() {
  api::CUdevice dev = 0;
  const api::Functions& f = driver();
  if (f.cuDeviceGet(&dev, device_) == api::CUDA_SUCCESS)
    log_failure(f.cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease");
}

void PrimaryContext::make_current() const { check(driver().cuCtxSetCurrent(ctx_), "cuCtxSetCurrent"); }

ScopedContext::ScopedContext(const PrimaryContext& ctx) noexcept {
  const api::Functions& f = driver();
  if (f.cuCtxGetCurrent(&previous_) != api::CUDA_SUCCESS) return;
  if (previous_ == ctx.handle()) {
    ok_ = true;
    return;
  }
  ok_ = f.cuCtxSetCurrent(ctx.handle()) == api::CUDA_SUCCESS;
  switched_ = ok_;
}

ScopedContext::~ScopedContext() {
  if (switched_) driver().cuCtxSetCurrent(previous_);
}

namespace {
thread_local bool t_relaxed_for_good = false;
}  // namespace

void relax_capture_for_this_thread() {
  if (t_relaxed_for_good) return;
  int mode = api::CU_STREAM_CAPTURE_MODE_RELAXED;
  check(driver().cuThreadExchangeStreamCaptureMode(&mode), "cuThreadExchangeStreamCaptureMode");
  t_relaxed_for_good = true;
}

RelaxedCapture::RelaxedCapture() noexcept {
  if (t_relaxed_for_good) return;
  previous_ = api::CU_STREAM_CAPTURE_MODE_RELAXED;
  exchanged_ = driver().cuThreadExchangeStreamCaptureMode(&previous_) == api::CUDA_SUCCESS;
}

RelaxedCapture::~RelaxedCapture() {
  if (exchanged_) driver().cuThreadExchangeStreamCaptureMode(&previous_);
}

Stream::Stream(std::shared_ptr<PrimaryContext> ctx) : ctx_(std::move(ctx)) {
  ScopedContext scope(*ctx_);
  check(driver().cuStreamCreate(&s_, api::CU_STREAM_NON_BLOCKING), "cuStreamCreate");
}

Stream::~Stream() {
  if (!s_) return;
  ScopedContext scope(*ctx_);
  RelaxedCapture relaxed;
  // Destroying a stream with work queued is legal but leaves that work racing the frees that
  // follow: drain it first.
  const api::CUresult r = driver().cuStreamSynchronize(s_);
  log_failure(r, "cuStreamSynchronize");
  log_failure(driver().cuStreamDestroy(s_), "cuStreamDestroy");
}

void Stream::synchronize() const {
  RelaxedCapture relaxed;
  check(driver().cuStreamSynchronize(s_), "cuStreamSynchronize");
}

Event::Event(std::shared_ptr<PrimaryContext> ctx, bool timing) : ctx_(std::move(ctx)) {
  ScopedContext scope(*ctx_);
  const unsigned flags = api::CU_EVENT_BLOCKING_SYNC | (timing ? 0u : api::CU_EVENT_DISABLE_TIMING);
  check(driver().cuEventCreate(&e_, flags), "cuEventCreate");
}

Event::~Event() {
  if (!e_) return;
  ScopedContext scope(*ctx_);
  log_failure(driver().cuEventDestroy(e_), "cuEventDestroy");
}

void Event::record(api::CUstream stream) const { check(driver().cuEventRecord(e_, stream), "cuEventRecord"); }

bool Event::done() const {
  RelaxedCapture relaxed;
  const api::CUresult r = driver().cuEventQuery(e_);
  if (r == api::CUDA_ERROR_NOT_READY) return false;
  check(r, "cuEventQuery");
  return true;
}

void Event::synchronize() const {
  RelaxedCapture relaxed;
  check(driver().cuEventSynchronize(e_), "cuEventSynchronize");
}

float Event::elapsed_since(const Event& start) const {
  float ms = 0;
  check(driver().cuEventElapsedTime(&ms, start.e_, e_), "cuEventElapsedTime");
  return ms;
}

}  // namespace fastload::cuda
