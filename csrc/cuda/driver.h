// The CUDA driver, loaded at run time on first GPU use (never at import): libcuda.so.1, or the
// library named by FASTLOAD_LIBCUDA (the tests' stand-in driver). Entry points come through
// cuGetProcAddress at a fixed API version, so the ABI is the same whatever driver is installed.
#pragma once
#include <stdexcept>
#include <string>

#include "cuda/driver_api.h"

namespace fastload::cuda {

// The driver cannot be used at all: no library, the toolkit's stub library, or no device.
class Unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A driver call failed: names the call and carries the driver's error name and string.
class DriverError : public std::runtime_error {
 public:
  DriverError(const std::string& message, api::CUresult code)
      : std::runtime_error(message), code_(code) {}
  api::CUresult code() const { return code_; }

 private:
  api::CUresult code_;
};

// A device allocation failed for lack of memory, and nothing the loader could wait for would free
// any (the consumer waits for a batch that needs the memory it holds itself). The message says
// what was asked, what the driver has free and what fastload holds. Python: torch's OutOfMemoryError.
class OutOfMemory : public DriverError {
 public:
  explicit OutOfMemory(const std::string& message) : DriverError(message, api::CUDA_ERROR_OUT_OF_MEMORY) {}
};

// The loaded, initialised driver. Loads on the first call (thread-safe); throws Unavailable,
// the same every time, if it cannot be used.
const api::Functions& driver();
// Devices the driver sees (loads it).
int device_count();
// Throws DriverError("<call> failed: NAME (string)") unless result is CUDA_SUCCESS.
void check(api::CUresult result, const char* call);
std::string error_text(api::CUresult result);
// True for the results a call gets once the driver is shutting down (at interpreter exit):
// destructors and deleters then give up quietly.
bool is_shutdown(api::CUresult result);
// True for the errors a failed kernel leaves in its context for good (an illegal address, a
// device-side assert, ...): every later call in that context fails with the same error.
bool is_sticky(api::CUresult result);
// For cleanup paths that must not throw: reports a failure on stderr unless it is a shutdown.
// A sticky error is reported once per process (after it, every cleanup call fails with it).
void log_failure(api::CUresult result, const char* call) noexcept;

}  // namespace fastload::cuda
