// Test instruments of fastload._C, kept apart from the loader's own bindings: device parts read
// back through the driver (the stand-in driver's "device" memory is host memory torch cannot
// import as CUDA), misuse switches for the transfer engine, and private knobs.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bindings/device_part.h"
#include "bindings/without_gil.h"
#include "core/dtype.h"
#include "cuda/driver.h"
#include "cuda/transfer_engine.h"

namespace fastload {

cuda::Misuse parse_misuse(const std::string& s);

// A device part handed to a test instead of a torch tensor (the stand-in driver's "device"
// memory is host memory torch cannot import as CUDA): read() copies it back through the driver,
// on the stream the batch was handed out on.
struct RawDevicePart {
  std::shared_ptr<UserDevicePart> part;
  size_t bytes;
  DType dtype;
  std::vector<int64_t> shape;

  pybind11::bytes read() const {
    std::string out(bytes, '\0');
    without_gil([&] {
      const auto& f = cuda::driver();
      cuda::ScopedContext scope(*part->buffer->context());
      if (bytes) {
        cuda::check(f.cuMemcpyDtoHAsync(out.data(), part->buffer->ptr(), bytes, part->stream), "cuMemcpyDtoHAsync");
        cuda::check(f.cuStreamSynchronize(part->stream), "cuStreamSynchronize");
      }
    });
    return pybind11::bytes(out);
  }

  // Queues a read of the part on its stream (or on `on`, a side stream) without waiting, as a
  // kernel of the training step would. The destination is page-locked scratch memory (a pageable
  // one would make the copy synchronous) that lives until exit: the read may still be queued
  // when the part dies.
  void touch(uintptr_t on = 0) const {
    const auto stream = on ? reinterpret_cast<cuda::api::CUstream>(on) : part->stream;
    static std::mutex mutex;
    static void* scratch = nullptr;
    static size_t scratch_bytes = 0;
    without_gil([&] {
      cuda::ScopedContext scope(*part->buffer->context());
      const auto& f = cuda::driver();
      void* dst;
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (scratch_bytes < bytes) {  // the old one is leaked: a queued read may still write it
          cuda::check(f.cuMemHostAlloc(&scratch, bytes, cuda::api::CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
          scratch_bytes = bytes;
        }
        dst = scratch;
      }
      if (bytes) cuda::check(f.cuMemcpyDtoHAsync(dst, part->buffer->ptr(), bytes, stream), "cuMemcpyDtoHAsync");
    });
  }
};

}  // namespace fastload
