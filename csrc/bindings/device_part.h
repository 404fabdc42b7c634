// A device part of a batch as the user holds it: the device buffer plus the stream the batch was
// handed out on. When the last reference dies, the buffer's release event is recorded on that
// stream, so the loader rewrites the memory only after the work queued there has run.
#pragma once
#include <memory>

#include "cuda/memory.h"

namespace fastload {

struct UserDevicePart {
  std::shared_ptr<cuda::DeviceBuffer> buffer;
  cuda::api::CUstream stream;
  UserDevicePart(std::shared_ptr<cuda::DeviceBuffer> b, cuda::api::CUstream s) : buffer(std::move(b)), stream(s) {
    buffer->hand_out(stream);
  }
  ~UserDevicePart() { buffer->release_after(stream); }
  UserDevicePart(const UserDevicePart&) = delete;
  UserDevicePart& operator=(const UserDevicePart&) = delete;
};

}  // namespace fastload
