// Loading the driver; see driver.h.
#include "cuda/driver.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace fastload::cuda {

namespace {

struct Loaded {
  api::Functions fn;
  std::string error;  // non-empty: unusable, with the reason
  int devices = 0;
};

template <typename F>
bool fetch(void* getter, bool v2, const char* name, F* out, std::string* error) {
  void* p = nullptr;
  api::CUresult r;
  int status = 0;
  if (v2) {
    r = reinterpret_cast<api::PFN_cuGetProcAddress_v2>(getter)(name, &p, api::kApiVersion,
                                                               api::CU_GET_PROC_ADDRESS_DEFAULT, &status);
  } else {
    r = reinterpret_cast<api::PFN_cuGetProcAddress_v1>(getter)(name, &p, api::kApiVersion,
                                                               api::CU_GET_PROC_ADDRESS_DEFAULT);
  }
  if (r != api::CUDA_SUCCESS || !p) {
    *error = std::string("the CUDA driver lacks ") + name +
             (status == api::CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                  ? " at the CUDA version fastload asks for (" + std::to_string(api::kApiVersion) + ")"
                  : std::string(" (a driver older than the CUDA version that introduced it)"));
    return false;
  }
  *out = reinterpret_cast<F>(p);
  return true;
}

Loaded load() {
  Loaded L;
  const char* env = std::getenv("FASTLOAD_LIBCUDA");
  const std::string path = env && *env ? env : "libcuda.so.1";
  // Never closed: deleters of batches may call the driver until the process ends.
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    L.error = "no CUDA driver: could not load " + path + " (" + (why ? why : "unknown") +
              "); install the NVIDIA driver, or use device=\"cpu\"";
    return L;
  }
  // Plain dlsym of e.g. cuMemcpyHtoDAsync would give the legacy (pre-_v2) ABI: ask by version.
  bool v2 = true;
  void* getter = dlsym(lib, "cuGetProcAddress_v2");
  if (!getter) {
    v2 = false;
    getter = dlsym(lib, "cuGetProcAddress");
  }
  if (!getter) {
    L.error = "the CUDA driver at " + path + " has no cuGetProcAddress (driver older than CUDA 11.3)";
    return L;
  }
  api::Functions& f = L.fn;
  std::string& e = L.error;
#define FASTLOAD_FETCH(name) \
  if (!fetch(getter, v2, #name, &f.name, &e)) return L;
  FASTLOAD_FETCH(cuGetErrorString)
  FASTLOAD_FETCH(cuGetErrorName)
  FASTLOAD_FETCH(cuInit)
  FASTLOAD_FETCH(cuDriverGetVersion)
  FASTLOAD_FETCH(cuDeviceGetCount)
  FASTLOAD_FETCH(cuDeviceGet)
  FASTLOAD_FETCH(cuDevicePrimaryCtxRetain)
  FASTLOAD_FETCH(cuDevicePrimaryCtxRelease)
  FASTLOAD_FETCH(cuCtxSetCurrent)
  FASTLOAD_FETCH(cuCtxGetCurrent)
  FASTLOAD_FETCH(cuCtxSynchronize)
  FASTLOAD_FETCH(cuStreamCreate)
  FASTLOAD_FETCH(cuStreamDestroy)
  FASTLOAD_FETCH(cuStreamWaitEvent)
  FASTLOAD_FETCH(cuStreamSynchronize)
  FASTLOAD_FETCH(cuEventCreate)
  FASTLOAD_FETCH(cuEventRecord)
  FASTLOAD_FETCH(cuEventQuery)
  FASTLOAD_FETCH(cuEventSynchronize)
  FASTLOAD_FETCH(cuEventDestroy)
  FASTLOAD_FETCH(cuEventElapsedTime)
  FASTLOAD_FETCH(cuMemAlloc)
  FASTLOAD_FETCH(cuMemFree)
  FASTLOAD_FETCH(cuMemGetInfo)
  FASTLOAD_FETCH(cuMemHostAlloc)
  FASTLOAD_FETCH(cuMemFreeHost)
  FASTLOAD_FETCH(cuMemHostRegister)
  FASTLOAD_FETCH(cuMemHostUnregister)
  FASTLOAD_FETCH(cuMemcpyHtoDAsync)
  FASTLOAD_FETCH(cuMemcpyDtoHAsync)
  FASTLOAD_FETCH(cuThreadExchangeStreamCaptureMode)
#undef FASTLOAD_FETCH
  const api::CUresult init = f.cuInit(0);
  if (init == api::CUDA_ERROR_STUB_LIBRARY) {
    L.error = "the CUDA driver library " + path +
              " is the CUDA toolkit's stub (for linking only), not a real driver: no NVIDIA "
              "driver is installed on this machine";
    return L;
  }
  if (init == api::CUDA_ERROR_NO_DEVICE) {
    L.error = "no CUDA device: the driver (" + path + ") is installed but sees no GPU "
              "(check CUDA_VISIBLE_DEVICES)";
    return L;
  }
  if (init != api::CUDA_SUCCESS) {
    L.error = "the CUDA driver (" + path + ") failed to initialise: cuInit returned " +
              std::to_string(init);
    const char* s = nullptr;
    if (f.cuGetErrorString && f.cuGetErrorString(init, &s) == api::CUDA_SUCCESS && s)
      L.error += std::string(" (") + s + ")";
    return L;
  }
  if (f.cuDeviceGetCount(&L.devices) != api::CUDA_SUCCESS || L.devices <= 0) {
    L.error = "no CUDA device: the driver (" + path + ") sees no GPU (check CUDA_VISIBLE_DEVICES)";
    L.devices = 0;
  }
  return L;
}

const Loaded& loaded() {
  static const Loaded* instance = new Loaded(load());  // leaked on purpose: used until exit
  return *instance;
}

}  // namespace

const api::Functions& driver() {
  const Loaded& L = loaded();
  if (!L.error.empty()) throw Unavailable(L.error);
  return L.fn;
}

int device_count() {
  driver();
  return loaded().devices;
}

std::string error_text(api::CUresult result) {
  const api::Functions& f = loaded().fn;
  const char* name = nullptr;
  const char* text = nullptr;
  if (f.cuGetErrorName) f.cuGetErrorName(result, &name);
  if (f.cuGetErrorString) f.cuGetErrorString(result, &text);
  std::string s = name ? name : "CUDA error " + std::to_string(result);
  if (text) s += std::string(" (") + text + ")";
  return s;
}

void check(api::CUresult result, const char* call) {
  if (result == api::CUDA_SUCCESS) return;
  if (is_sticky(result))
    throw DriverError("a CUDA kernel failed on the GPU: " + error_text(result) +
                          ". The error is sticky: the device's CUDA context is unusable for the rest of this "
                          "process, and every later CUDA call fails with it (fastload saw it in " + call +
                          "). The kernel that failed is most likely one of your training step's; run with "
                          "CUDA_LAUNCH_BLOCKING=1 to find which",
                      result);
  throw DriverError(std::string(call) + " failed: " + error_text(result), result);
}

bool is_shutdown(api::CUresult result) {
  return result == api::CUDA_ERROR_DEINITIALIZED || result == api::CUDA_ERROR_NOT_INITIALIZED;
}

bool is_sticky(api::CUresult result) {
  switch (result) {
    case 214:  // CUDA_ERROR_ECC_UNCORRECTABLE
    case 700:  // CUDA_ERROR_ILLEGAL_ADDRESS
    case 702:  // CUDA_ERROR_LAUNCH_TIMEOUT
    case 710:  // CUDA_ERROR_ASSERT
    case 714:  // CUDA_ERROR_HARDWARE_STACK_ERROR
    case 715:  // CUDA_ERROR_ILLEGAL_INSTRUCTION
    case 716:  // CUDA_ERROR_MISALIGNED_ADDRESS
    case 717:  // CUDA_ERROR_INVALID_ADDRESS_SPACE
    case 718:  // CUDA_ERROR_INVALID_PC
    case 719:  // CUDA_ERROR_LAUNCH_FAILED
      return true;
    default:
      return false;
  }
}

void log_failure(api::CUresult result, const char* call) noexcept {
  if (result == api::CUDA_SUCCESS || is_shutdown(result)) return;
  try {
    if (is_sticky(result)) {
      // Every cleanup call fails from now on (each batch's release, each free, each stream):
      // one line says so, instead of one per call.
      static std::atomic<bool> said{false};
      if (!said.exchange(true))
        std::fprintf(stderr,
                     "fastload: a CUDA kernel failed on the GPU (%s); the context is unusable, so fastload's "
                     "cleanup calls fail from now on (%s was the first) and are not reported one by one\n",
                     error_text(result).c_str(), call);
      return;
    }
    std::fprintf(stderr, "fastload: %s failed during cleanup: %s\n", call, error_text(result).c_str());
  } catch (...) {
  }
}

}  // namespace fastload::cuda
