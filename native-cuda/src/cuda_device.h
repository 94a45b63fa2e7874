// The CUDA side of the addon. Every entry point works in a build without CUDA: the probe says
// why CUDA is missing and the CUDA functions throw ERR_NO_CUDA.
#pragma once

#include <napi.h>

#include <string>

namespace kvtier {

struct CudaProbe {
  bool compiled;
  bool available;
  int devices;
  std::string reason;
};

// Probes once per process (the first call loads the driver, if any) and caches the answer.
const CudaProbe& ProbeCuda();

// Registers host memory as pinned when CUDA is available; false when it did not.
bool PinHost(void* base, size_t bytes);
void UnpinHost(void* base);

// cudaDeviceUuids() -> string[]: the UUID of each visible device by index, formatted as
// nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lowercase hex).
Napi::Value CudaDeviceUuids(const Napi::CallbackInfo& info);
// cudaIpcOpen(handle: 64-byte view, device) -> bigint device pointer
Napi::Value CudaIpcOpen(const Napi::CallbackInfo& info);
// cudaIpcClose(ptr: bigint, device)
Napi::Value CudaIpcClose(const Napi::CallbackInfo& info);
// cudaMalloc(bytes, device) -> bigint; cudaFree(ptr, device); for tests and benchmarks.
Napi::Value CudaMalloc(const Napi::CallbackInfo& info);
Napi::Value CudaFree(const Napi::CallbackInfo& info);
// cudaIpcGetHandle(ptr, device) -> ArrayBuffer of 64 bytes
Napi::Value CudaIpcGetHandle(const Napi::CallbackInfo& info);
// copyBatchDevice(direction, hostBuffers, deviceRegions: BigUint64Array [ptr, bytes]*,
//                 ops: Float64Array [hostIndex, hostOffset, deviceIndex, deviceOffset, length]*,
//                 device) -> Promise<number of coalesced copies>
//                 device, options?: { method?: 'auto'|'memcpy'|'batch'|'kernel',
//                                     waitEvent?: 64-byte cudaIpcEventHandle_t })
Napi::Value CopyBatchDevice(const Napi::CallbackInfo& info);
// deviceCopyCounts() -> { memcpy|batch|kernel: { batches, runs } }: device copy batches so far
// by the method that ran them (cuda_copy.h).
Napi::Value DeviceCopyCounts(const Napi::CallbackInfo& info);

}  // namespace kvtier
