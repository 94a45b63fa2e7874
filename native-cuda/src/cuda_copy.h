// Copies between pinned host memory and device memory, the CUDA half of the data plane. Free of
// N-API, so the addon (cuda_device.cc) and the standalone self-test (test/copy_selftest.cu) run
// the same code. Compiled by nvcc; included by g++ sources through the CUDA runtime headers.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvtier {
namespace cudacopy {

// How a batch of runs is issued.
//   memcpy: one cudaMemcpyAsync per run (the copy engines; no SM time).
//   batch:  one cudaMemcpyBatchAsync for all runs (the copy engines, one driver call).
//   kernel: one gather/scatter kernel whose threads read and write the pinned host pages through
//           their device mapping (SM time, but no per-run overhead: small blocks move at the
//           link's rate). Needs every host byte mapped (cudaHostRegister'd or cudaHostAlloc'd).
//   staged: the host side moved as large contiguous spans by the copy engines (one
//           cudaMemcpyAsync per span of up to kStageBytes) through a device staging buffer, and
//           the blocks gathered from or scattered into it on the device by the kernel (HBM to
//           HBM, a few percent of the time): DMA speed for small blocks, at the cost of two
//           staging buffers of device memory per device in use.
//   auto:   staged when the runs' host bytes form long contiguous spans (a chunk's payload) of
//           runs of 16 KiB or more, else the kernel for runs under 1 MiB whose host memory is
//           mapped, else memcpy.
enum class Method : int { kAuto = 0, kMemcpy = 1, kBatch = 2, kKernel = 3, kStaged = 4 };

// One contiguous copy. `host` is the host address; `hostDev` the device-visible address of the
// same bytes (nullptr when the host memory is not mapped); `dev` a device address.
struct DeviceRun {
  uint8_t* host;
  uint8_t* hostDev;
  uint8_t* dev;
  size_t bytes;
};

struct Outcome {
  cudaError_t err = cudaSuccess;
  std::string what;  // the call that failed, for the error message
  Method used = Method::kMemcpy;
  uint64_t issueNs = 0;  // stream set-up and issuing the copies
  uint64_t waitNs = 0;   // waiting for them to finish
  bool ok() const { return err == cudaSuccess; }
};

// "auto", "memcpy", "batch", "kernel", "staged".
const char* MethodName(Method m);
// Parses a method name; false for anything else.
bool ParseMethod(const char* name, Method* out);
// The method KVTIER_CUDA_COPY names, or kAuto when it is unset or empty.
Method MethodFromEnv();

// Average run size below which `auto` takes the kernel (when the host memory is mapped).
inline constexpr size_t kAutoKernelBelowBytes = size_t{1} << 20;
// Average host-contiguous span from which `auto` stages through device memory, when the runs
// average at least kAutoStagedMinRunBytes.
inline constexpr size_t kAutoStagedFromBytes = size_t{512} << 10;
inline constexpr size_t kAutoStagedMinRunBytes = size_t{16} << 10;
// Bytes of one device staging buffer.
inline constexpr size_t kStageBytes = size_t{16} << 20;

// The method `requested` resolves to for `runs` (kAuto resolved; kKernel falls back to memcpy
// when a run's host memory is not mapped).
Method Resolve(Method requested, const std::vector<DeviceRun>& runs);

// The device-visible address of host memory at `host`: nullptr when it is not mapped pinned
// memory. Works for addresses inside a registered range.
uint8_t* DeviceAddressOf(const void* host);

// Copies every run, host to device (`toDevice`) or device to host, on device `device`, in a
// fresh non-blocking stream that first waits for `waitEvent` (an interprocess event another
// process recorded after writing the device bytes; nullptr: no wait). Returns when the copies
// are done; the calling thread sleeps meanwhile (blocking-sync event).
Outcome Execute(bool toDevice, int device, const std::vector<DeviceRun>& runs, Method requested,
                const cudaIpcEventHandle_t* waitEvent);

}  // namespace cudacopy
}  // namespace kvtier
