// Drives the fake driver the way fastload's transfer engine does -- several threads, two devices,
// slots reused behind events, frees from other threads -- so ThreadSanitizer can check the
// library itself. Then takes the paths that drain work after a misuse (destroy and free while
// copies are queued), and exits with streams still busy and a thread blocked in a wait, which the
// library's unload path must survive.
//
//   smoke LIBRARY.so        exit 0: clean; 1: a call failed; 2: wrong misuse count
//
// Only the dlopen'ed library is used (no CUDA headers), as fastload loads the driver.

#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using Handle = void*;

struct Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDevicePrimaryCtxRetain)(Handle*, int);
  CUresult (*cuDevicePrimaryCtxRelease)(int);
  CUresult (*cuCtxSetCurrent)(Handle);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuStreamCreate)(Handle*, unsigned);
  CUresult (*cuStreamDestroy)(Handle);
  CUresult (*cuStreamWaitEvent)(Handle, Handle, unsigned);
  CUresult (*cuStreamSynchronize)(Handle);
  CUresult (*cuEventCreate)(Handle*, unsigned);
  CUresult (*cuEventRecord)(Handle, Handle);
  CUresult (*cuEventQuery)(Handle);
  CUresult (*cuEventSynchronize)(Handle);
  CUresult (*cuEventDestroy)(Handle);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned);
  CUresult (*cuMemFreeHost)(void*);
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, Handle);
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, Handle);
  int (*misuse_count)();
  int (*misuse_message)(int, char*, int);
  void (*reset_misuses)();
  int (*configure)(const char*, long long);
};

Api api;
Handle contexts[2];

void check(CUresult rc, const char* what, int line) {
  if (rc != 0) {
    std::fprintf(stderr, "smoke: %s failed with %d (line %d)\n", what, rc, line);
    std::fflush(stderr);
    std::_Exit(1);
  }
}

#define CHECK(call) check((call), #call, __LINE__)

template <class F>
void fetch(void* lib, const char* name, F& fn) {
  using GetProc = CUresult (*)(const char*, void**, int, unsigned long long, int*);
  static auto get = reinterpret_cast<GetProc>(dlsym(lib, "cuGetProcAddress_v2"));
  if (get == nullptr) check(-1, "dlsym(cuGetProcAddress_v2)", __LINE__);
  void* p = nullptr;
  int status = -1;
  check(get(name, &p, 12000, 0, &status), name, __LINE__);
  fn = reinterpret_cast<F>(p);
}

template <class F>
void control(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (fn == nullptr) check(-1, name, __LINE__);
}

constexpr size_t kBytes = 64 * 1024;
constexpr int kSlots = 2;
constexpr int kIterations = 40;

unsigned char pattern(int worker, int iteration, size_t i) {
  return static_cast<unsigned char>(worker * 31 + iteration * 7 + i);
}

// One producer/consumer pair: a copy stream filling device slots from pinned slots, a consumer
// stream reading them back, each slot reused only behind the events that release it.
void transfer(int worker, int device) {
  CHECK(api.cuCtxSetCurrent(contexts[device]));
  Handle copy, consume;
  CHECK(api.cuStreamCreate(&copy, 1));
  CHECK(api.cuStreamCreate(&consume, 1));
  void* staging[kSlots];
  CUdeviceptr slots[kSlots];
  Handle copied[kSlots], released[kSlots];
  for (int k = 0; k < kSlots; ++k) {
    CHECK(api.cuMemHostAlloc(&staging[k], kBytes, 0));
    CHECK(api.cuMemAlloc(&slots[k], kBytes));
    CHECK(api.cuEventCreate(&copied[k], 2));
    CHECK(api.cuEventCreate(&released[k], 2));
  }
  void* out;
  CHECK(api.cuMemHostAlloc(&out, kBytes, 0));
  for (int it = 0; it < kIterations; ++it) {
    int k = it % kSlots;
    if (it >= kSlots) {
      CHECK(api.cuEventSynchronize(copied[k]));             // staging slot k is free again
      CHECK(api.cuStreamWaitEvent(copy, released[k], 0));  // device slot k is free again
    }
    auto* src = static_cast<unsigned char*>(staging[k]);
    for (size_t i = 0; i < kBytes; ++i) src[i] = pattern(worker, it, i);
    CHECK(api.cuMemcpyHtoDAsync(slots[k], staging[k], kBytes, copy));
    CHECK(api.cuEventRecord(copied[k], copy));
    CHECK(api.cuStreamWaitEvent(consume, copied[k], 0));
    CHECK(api.cuMemcpyDtoHAsync(out, slots[k], kBytes, consume));
    CHECK(api.cuEventRecord(released[k], consume));
    while (api.cuEventQuery(released[k]) == 600) std::this_thread::yield();
    auto* got = static_cast<const unsigned char*>(out);
    for (size_t i = 0; i < kBytes; ++i) {
      if (got[i] != pattern(worker, it, i)) {
        std::fprintf(stderr, "smoke: worker %d iteration %d byte %zu is wrong\n", worker, it, i);
        std::_Exit(1);
      }
    }
  }
  CHECK(api.cuStreamSynchronize(copy));
  CHECK(api.cuStreamSynchronize(consume));
  // Frees from another thread, as deleters run wherever the last reference drops.
  std::thread deleter([&] {
    for (int k = 0; k < kSlots; ++k) {
      CHECK(api.cuMemFree(slots[k]));
      CHECK(api.cuMemFreeHost(staging[k]));
      CHECK(api.cuEventDestroy(copied[k]));
      CHECK(api.cuEventDestroy(released[k]));
    }
    CHECK(api.cuMemFreeHost(out));
  });
  deleter.join();
  CHECK(api.cuStreamDestroy(copy));
  CHECK(api.cuStreamDestroy(consume));
}

// Frees device memory from another thread and destroys the stream while copies are queued on
// it: two misuses, each followed by the library draining the work it still has.
void destroy_and_free_while_busy() {
  CHECK(api.cuCtxSetCurrent(contexts[1]));
  Handle stream;
  void* src;
  CUdeviceptr dst[2];
  CHECK(api.cuStreamCreate(&stream, 1));
  CHECK(api.cuMemHostAlloc(&src, kBytes, 0));
  for (CUdeviceptr& d : dst) CHECK(api.cuMemAlloc(&d, kBytes));
  std::memset(src, 7, kBytes);
  for (int i = 0; i < 4; ++i) CHECK(api.cuMemcpyHtoDAsync(dst[0], src, kBytes, stream));
  std::thread([&] { CHECK(api.cuMemFree(dst[0])); }).join();
  for (int i = 0; i < 4; ++i) CHECK(api.cuMemcpyHtoDAsync(dst[1], src, kBytes, stream));
  CHECK(api.cuStreamDestroy(stream));
  CHECK(api.cuCtxSynchronize());  // the destroy drained the stream, but the host did not wait
  CHECK(api.cuMemFree(dst[1]));
  CHECK(api.cuMemFreeHost(src));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: smoke LIBRARY.so\n");
    return 1;
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "smoke: %s\n", dlerror());
    return 1;
  }
  fetch(lib, "cuInit", api.cuInit);
  fetch(lib, "cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain);
  fetch(lib, "cuDevicePrimaryCtxRelease", api.cuDevicePrimaryCtxRelease);
  fetch(lib, "cuCtxSetCurrent", api.cuCtxSetCurrent);
  fetch(lib, "cuCtxSynchronize", api.cuCtxSynchronize);
  fetch(lib, "cuStreamCreate", api.cuStreamCreate);
  fetch(lib, "cuStreamDestroy", api.cuStreamDestroy);
  fetch(lib, "cuStreamWaitEvent", api.cuStreamWaitEvent);
  fetch(lib, "cuStreamSynchronize", api.cuStreamSynchronize);
  fetch(lib, "cuEventCreate", api.cuEventCreate);
  fetch(lib, "cuEventRecord", api.cuEventRecord);
  fetch(lib, "cuEventQuery", api.cuEventQuery);
  fetch(lib, "cuEventSynchronize", api.cuEventSynchronize);
  fetch(lib, "cuEventDestroy", api.cuEventDestroy);
  fetch(lib, "cuMemAlloc", api.cuMemAlloc);
  fetch(lib, "cuMemFree", api.cuMemFree);
  fetch(lib, "cuMemHostAlloc", api.cuMemHostAlloc);
  fetch(lib, "cuMemFreeHost", api.cuMemFreeHost);
  fetch(lib, "cuMemcpyHtoDAsync", api.cuMemcpyHtoDAsync);
  fetch(lib, "cuMemcpyDtoHAsync", api.cuMemcpyDtoHAsync);
  control(lib, "fake_cuda_misuse_count", api.misuse_count);
  control(lib, "fake_cuda_misuse_message", api.misuse_message);
  control(lib, "fake_cuda_reset_misuses", api.reset_misuses);
  control(lib, "fake_cuda_configure", api.configure);

  CHECK(api.cuInit(0));
  CHECK(api.cuDevicePrimaryCtxRetain(&contexts[0], 0));
  CHECK(api.cuDevicePrimaryCtxRetain(&contexts[1], 1));
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) workers.emplace_back(transfer, w, w % 2);
  for (std::thread& t : workers) t.join();

  int misuses = api.misuse_count();
  for (int i = 0; i < misuses; ++i) {
    char buf[512];
    if (api.misuse_message(i, buf, sizeof buf) >= 0) std::fprintf(stderr, "smoke: misuse: %s\n", buf);
  }
  if (misuses != 0) return 2;

  destroy_and_free_while_busy();
  if (api.misuse_count() != 2) {
    std::fprintf(stderr, "smoke: expected 2 misuses, got %d\n", api.misuse_count());
    return 2;
  }
  api.reset_misuses();

  // Leave work queued and a thread blocked on it: process exit must stop the stream workers and
  // wake the waiter without hanging or touching freed state.
  CHECK(api.cuCtxSetCurrent(contexts[0]));
  Handle stream, event;
  void* src;
  CUdeviceptr dst;
  CHECK(api.cuStreamCreate(&stream, 1));
  CHECK(api.cuEventCreate(&event, 0));
  CHECK(api.cuMemHostAlloc(&src, kBytes, 0));
  CHECK(api.cuMemAlloc(&dst, kBytes));
  if (api.configure("paused", 1) != 0) check(-1, "configure(paused)", __LINE__);
  CHECK(api.cuMemcpyHtoDAsync(dst, src, kBytes, stream));
  CHECK(api.cuEventRecord(event, stream));
  std::thread([event] { api.cuEventSynchronize(event); }).detach();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::printf("smoke: ok\n");
  return 0;
}
