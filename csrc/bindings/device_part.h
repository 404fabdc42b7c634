// A device part of a batch as the user holds it: the device buffer plus the stream the batch was
// handed out on. When the last reference dies, the buffer's release events are recorded on that
// stream (and on the streams fastload.record_stream added), so the loader rewrites the memory only
// after the work queued there has run.
#pragma once
#include <memory>
#include <thread>

#include "cuda/memory.h"

namespace fastload {

struct UserDevicePart {
  std::shared_ptr<cuda::DeviceBuffer> buffer;
  cuda::api::CUstream stream;
  std::thread::id thread;  // the thread next() ran on
  UserDevicePart(std::shared_ptr<cuda::DeviceBuffer> b, cuda::api::CUstream s)
      : buffer(std::move(b)), stream(s), thread(std::this_thread::get_id()) {
    buffer->hand_out(stream);
  }
  ~UserDevicePart() {
    // CU_STREAM_PER_THREAD names the calling thread's own stream: on another thread it is
    // another stream. The legacy stream waits for every blocking stream of the context, the
    // per-thread ones included, so an event recorded there comes after the reads all the same.
    const bool elsewhere = stream == cuda::api::CU_STREAM_PER_THREAD && std::this_thread::get_id() != thread;
    buffer->release_after(elsewhere ? cuda::api::CU_STREAM_LEGACY : stream);
  }
  UserDevicePart(const UserDevicePart&) = delete;
  UserDevicePart& operator=(const UserDevicePart&) = delete;
};

}  // namespace fastload
