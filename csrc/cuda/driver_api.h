// The few CUDA driver API declarations fastload uses, written out here so that building needs no
// CUDA toolkit. Values and signatures are those of cuda.h (the _v2 forms, size_t sizes); entry
// points are fetched at run time through cuGetProcAddress (see driver.cpp). Private to csrc/cuda.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fastload::cuda::api {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;

constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
// The reserved stream handles besides 0 (the legacy default stream too).
inline const CUstream CU_STREAM_LEGACY = reinterpret_cast<CUstream>(0x1);
inline const CUstream CU_STREAM_PER_THREAD = reinterpret_cast<CUstream>(0x2);
constexpr unsigned CU_EVENT_BLOCKING_SYNC = 0x1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 0x1;
constexpr unsigned CU_MEMHOSTREGISTER_PORTABLE = 0x1;
constexpr int CU_GET_PROC_ADDRESS_DEFAULT = 0;
constexpr int CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2;  // the symbol status out-parameter
// CUstreamCaptureMode.
constexpr int CU_STREAM_CAPTURE_MODE_GLOBAL = 0;
constexpr int CU_STREAM_CAPTURE_MODE_RELAXED = 2;
// The API version whose entry points we ask for: CUDA 12.0 (size_t sizes, _v2 semantics).
constexpr int kApiVersion = 12000;

using PFN_cuGetProcAddress_v2 = CUresult (*)(const char*, void**, int, uint64_t, int*);
using PFN_cuGetProcAddress_v1 = CUresult (*)(const char*, void**, int, uint64_t);

// One member per entry point; driver.cpp fills them by name.
struct Functions {
  CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*cuInit)(unsigned) = nullptr;
  CUresult (*cuDriverGetVersion)(int*) = nullptr;
  CUresult (*cuDeviceGetCount)(int*) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
  CUresult (*cuCtxSynchronize)() = nullptr;
  CUresult (*cuStreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream) = nullptr;
  CUresult (*cuStreamWaitEvent)(CUstream, CUevent, unsigned) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream) = nullptr;
  CUresult (*cuEventCreate)(CUevent*, unsigned) = nullptr;
  CUresult (*cuEventRecord)(CUevent, CUstream) = nullptr;
  CUresult (*cuEventQuery)(CUevent) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent) = nullptr;
  CUresult (*cuEventDestroy)(CUevent) = nullptr;
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr) = nullptr;
  CUresult (*cuMemGetInfo)(size_t*, size_t*) = nullptr;
  CUresult (*cuMemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*cuMemFreeHost)(void*) = nullptr;
  CUresult (*cuMemHostRegister)(void*, size_t, unsigned) = nullptr;  // _v2
  CUresult (*cuMemHostUnregister)(void*) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*cuThreadExchangeStreamCaptureMode)(int*) = nullptr;  // CUDA 10.1
};

}  // namespace fastload::cuda::api
