#include "cuda_device.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "copy_plan.h"
#include "errors.h"
#include "host_memory.h"
#include "promise_worker.h"

#ifdef KVTIER_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier {
namespace {

#ifdef KVTIER_WITH_CUDA
bool DisabledAtRunTime() {
  const char* v = std::getenv("KVTIER_NO_CUDA");
  return v != nullptr && v[0] != '\0' && std::strcmp(v, "0") != 0;
}
#endif

#ifndef KVTIER_WITH_CUDA
const char* NotCompiledReason() {
#if defined(KVTIER_CUDA_SKIP) && KVTIER_CUDA_SKIP == 2
  return "compiled without CUDA (KVTIER_NO_CUDA=1 at build time)";
#else
  return "compiled without CUDA (nvcc not found at build time)";
#endif
}
#endif

const CudaProbe& RequireCuda(Napi::Env env) {
  const CudaProbe& p = ProbeCuda();
  if (!p.available) Throw(env, kErrNoCuda, "CUDA is not available: " + p.reason);
  return p;
}

int DeviceArg(Napi::Env env, const Napi::Value& v, const CudaProbe& p) {
  const size_t device = ToSize(env, v, "device");
  if (device >= static_cast<size_t>(p.devices)) {
    Throw(env, kErrInvalidArg,
          "device " + std::to_string(device) + " does not exist (" + std::to_string(p.devices) +
              " devices)");
  }
  return static_cast<int>(device);
}

// "GPU-" and the 16 bytes as 8-4-4-4-12 lowercase hex digits, the form nvidia-smi -L prints.
std::string FormatUuid(const unsigned char* bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0xf]);
  }
  return out;
}

uint64_t PointerArg(Napi::Env env, const Napi::Value& v) {
  if (!v.IsBigInt()) Throw(env, kErrInvalidArg, "ptr must be a bigint device pointer");
  bool lossless = false;
  const uint64_t ptr = v.As<Napi::BigInt>().Uint64Value(&lossless);
  if (!lossless || ptr == 0) Throw(env, kErrInvalidArg, "ptr must be a non-zero 64-bit pointer");
  return ptr;
}

#ifdef KVTIER_WITH_CUDA
std::string CudaMessage(cudaError_t err, const char* what) {
  return std::string(what) + " failed: " + cudaGetErrorName(err) + " (" +
         cudaGetErrorString(err) + ")";
}

void CheckCuda(Napi::Env env, cudaError_t err, const char* what) {
  if (err != cudaSuccess) Throw(env, kErrCuda, CudaMessage(err, what));
}

class DeviceCopyWorker : public PromiseWorker {
 public:
  DeviceCopyWorker(Napi::Env env, bool toDevice, int device)
      : PromiseWorker(env, "kvtier.copyBatchDevice"), toDevice_(toDevice), device_(device) {}

  std::vector<Region> host;
  std::vector<Region> dev;
  std::vector<double> ops;

 protected:
  void Work() override {
    std::vector<Run> runs;
    failure_ = PlanCopies(host, dev, ops, false, &runs);
    if (failure_.failed()) return;
    result_ = runs.size();
    if (runs.empty()) return;
    cudaError_t err = cudaSetDevice(device_);
    if (err != cudaSuccess) return Fail(err, "cudaSetDevice");
    cudaStream_t stream = nullptr;
    err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return Fail(err, "cudaStreamCreate");
    const cudaMemcpyKind kind = toDevice_ ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    for (const Run& r : runs) {
      void* dst = toDevice_ ? static_cast<void*>(r.b) : static_cast<void*>(r.a);
      const void* src = toDevice_ ? static_cast<const void*>(r.a) : static_cast<const void*>(r.b);
      err = cudaMemcpyAsync(dst, src, r.bytes, kind, stream);
      if (err != cudaSuccess) break;
    }
    cudaEvent_t done = nullptr;
    // Blocking sync lets this pool thread sleep until the copies finish instead of spinning.
    cudaError_t evErr = cudaEventCreateWithFlags(&done, cudaEventBlockingSync | cudaEventDisableTiming);
    if (evErr == cudaSuccess) evErr = cudaEventRecord(done, stream);
    if (evErr == cudaSuccess) evErr = cudaEventSynchronize(done);
    else cudaStreamSynchronize(stream);
    if (done != nullptr) cudaEventDestroy(done);
    cudaStreamDestroy(stream);
    if (err != cudaSuccess) return Fail(err, "cudaMemcpyAsync");
    if (evErr != cudaSuccess) return Fail(evErr, "cudaEventSynchronize");
  }

 private:
  void Fail(cudaError_t err, const char* what) { failure_ = Failure{kErrCuda, CudaMessage(err, what)}; }

  bool toDevice_;
  int device_;
};
#endif

}  // namespace

const CudaProbe& ProbeCuda() {
  static CudaProbe probe;
  static std::once_flag once;
  std::call_once(once, [] {
#ifndef KVTIER_WITH_CUDA
    probe = CudaProbe{false, false, 0, NotCompiledReason()};
#else
    if (DisabledAtRunTime()) {
      probe = CudaProbe{true, false, 0, "disabled at run time by KVTIER_NO_CUDA"};
      return;
    }
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaErrorInsufficientDriver) {
      probe = CudaProbe{true, false, 0, "no CUDA driver (" + CudaMessage(err, "cudaGetDeviceCount") + ")"};
    } else if (err == cudaErrorNoDevice || (err == cudaSuccess && count == 0)) {
      probe = CudaProbe{true, false, 0, "no CUDA device"};
    } else if (err != cudaSuccess) {
      probe = CudaProbe{true, false, 0, CudaMessage(err, "cudaGetDeviceCount")};
    } else {
      probe = CudaProbe{true, true, count, "ok"};
    }
#endif
  });
  return probe;
}

bool PinHost(void* base, size_t bytes) {
#ifdef KVTIER_WITH_CUDA
  if (!ProbeCuda().available) return false;
  return cudaHostRegister(base, bytes, cudaHostRegisterPortable) == cudaSuccess;
#else
  (void)base;
  (void)bytes;
  return false;
#endif
}

void UnpinHost(void* base) {
#ifdef KVTIER_WITH_CUDA
  cudaHostUnregister(base);
#else
  (void)base;
#endif
}

Napi::Value CudaDeviceUuids(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const CudaProbe& p = RequireCuda(env);
  Napi::Array out = Napi::Array::New(env, static_cast<size_t>(p.devices));
#ifdef KVTIER_WITH_CUDA
  for (int i = 0; i < p.devices; i++) {
    cudaDeviceProp prop;
    CheckCuda(env, cudaGetDeviceProperties(&prop, i), "cudaGetDeviceProperties");
    static_assert(sizeof(prop.uuid.bytes) == 16, "cudaUUID_t is 16 bytes");
    out.Set(static_cast<uint32_t>(i),
            FormatUuid(reinterpret_cast<const unsigned char*>(prop.uuid.bytes)));
  }
#else
  (void)FormatUuid;
#endif
  return out;
}

Napi::Value CudaIpcOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const CudaProbe& p = RequireCuda(env);
  uint8_t* data = nullptr;
  size_t bytes = 0;
  if (!BytesOf(info[0], &data, &bytes) || bytes != 64) {
    Throw(env, kErrInvalidArg, "handle must be 64 bytes (a cudaIpcMemHandle_t)");
  }
  const int device = DeviceArg(env, info[1], p);
#ifdef KVTIER_WITH_CUDA
  cudaIpcMemHandle_t handle;
  static_assert(sizeof(handle) == 64, "cudaIpcMemHandle_t is 64 bytes");
  std::memcpy(&handle, data, sizeof(handle));
  CheckCuda(env, cudaSetDevice(device), "cudaSetDevice");
  void* ptr = nullptr;
  CheckCuda(env, cudaIpcOpenMemHandle(&ptr, handle, cudaIpcMemLazyEnablePeerAccess),
            "cudaIpcOpenMemHandle");
  return Napi::BigInt::New(env, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr)));
#else
  (void)device;
  return env.Undefined();
#endif
}

Napi::Value CudaIpcClose(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const CudaProbe& p = RequireCuda(env);
  const uint64_t ptr = PointerArg(env, info[0]);
  const int device = DeviceArg(env, info[1], p);
#ifdef KVTIER_WITH_CUDA
  CheckCuda(env, cudaSetDevice(device), "cudaSetDevice");
  CheckCuda(env, cudaIpcCloseMemHandle(reinterpret_cast<void*>(ptr)), "cudaIpcCloseMemHandle");
#else
  (void)ptr;
  (void)device;
#endif
  return env.Undefined();
}

Napi::Value CudaMalloc(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const CudaProbe& p = RequireCuda(env);
  const size_t bytes = ToSize(env, info[0], "bytes");
  const int device = DeviceArg(env, info[1], p);
#ifdef KVTIER_WITH_CUDA
  CheckCuda(env, cudaSetDevice(device), "cudaSetDevice");
  void* ptr = nullptr;
  CheckCuda(env, cudaMalloc(&ptr, bytes), "cudaMalloc");
  return Napi::BigInt::New(env, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr)));
#else
  (void)bytes;
  (void)device;
  return env.Undefined();
#endif
}

Napi::Value CudaFree(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const CudaProbe& p = RequireCuda(env);
  const uint64_t ptr = PointerArg(env, info[0]);
  const int device = DeviceArg(env, info[1], p);
#ifdef KVTIER_WITH_CUDA
  CheckCuda(env, cudaSetDevice(device), "cudaSetDevice");
  CheckCuda(env, cudaFree(reinterpret_cast<void*>(ptr)), "cudaFree");
#else
  (void)ptr;
  (void)device;
#endif
  return env.Undefined();
}

Napi::Value CudaIpcGetHandle(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const CudaProbe& p = RequireCuda(env);
  const uint64_t ptr = PointerArg(env, info[0]);
  const int device = DeviceArg(env, info[1], p);
#ifdef KVTIER_WITH_CUDA
  CheckCuda(env, cudaSetDevice(device), "cudaSetDevice");
  cudaIpcMemHandle_t handle;
  CheckCuda(env, cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(ptr)), "cudaIpcGetMemHandle");
  Napi::ArrayBuffer out = Napi::ArrayBuffer::New(env, sizeof(handle));
  std::memcpy(out.Data(), &handle, sizeof(handle));
  return out;
#else
  (void)ptr;
  (void)device;
  return env.Undefined();
#endif
}

Napi::Value CopyBatchDevice(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const CudaProbe& p = RequireCuda(env);
  if (!info[0].IsString()) Throw(env, kErrInvalidArg, "direction must be 'h2d' or 'd2h'");
  const std::string direction = info[0].As<Napi::String>().Utf8Value();
  if (direction != "h2d" && direction != "d2h") {
    Throw(env, kErrInvalidArg, "direction must be 'h2d' or 'd2h', got '" + direction + "'");
  }
  if (!info[1].IsArray()) Throw(env, kErrInvalidArg, "hostBuffers must be an array");
  if (!info[2].IsTypedArray() ||
      info[2].As<Napi::TypedArray>().TypedArrayType() != napi_biguint64_array) {
    Throw(env, kErrInvalidArg, "deviceRegions must be a BigUint64Array of [ptr, bytes] pairs");
  }
  if (!info[3].IsTypedArray() ||
      info[3].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array) {
    Throw(env, kErrInvalidArg, "ops must be a Float64Array");
  }
  const int device = DeviceArg(env, info[4], p);
#ifdef KVTIER_WITH_CUDA
  Napi::Array hostBuffers = info[1].As<Napi::Array>();
  std::vector<Region> host;
  std::vector<Napi::Value> values;
  for (uint32_t i = 0; i < hostBuffers.Length(); i++) {
    Napi::Value b = hostBuffers.Get(i);
    Region r{};
    if (!BytesOf(b, &r.base, &r.bytes)) {
      Throw(env, kErrInvalidArg,
            "hostBuffers[" + std::to_string(i) + "] is not an ArrayBuffer or a view of one");
    }
    host.push_back(r);
    values.push_back(b);
  }
  Napi::BigUint64Array regions = info[2].As<Napi::BigUint64Array>();
  if (regions.ElementLength() % 2 != 0) {
    Throw(env, kErrInvalidArg, "deviceRegions must hold [ptr, bytes] pairs");
  }
  auto* worker = new DeviceCopyWorker(env, direction == "h2d", device);
  worker->host = std::move(host);
  for (const Napi::Value& b : values) worker->Keep(b);
  for (size_t i = 0; i + 1 < regions.ElementLength(); i += 2) {
    worker->dev.push_back(
        Region{reinterpret_cast<uint8_t*>(regions[i]), static_cast<size_t>(regions[i + 1])});
  }
  Napi::Float64Array ops = info[3].As<Napi::Float64Array>();
  worker->ops.assign(ops.Data(), ops.Data() + ops.ElementLength());
  worker->Queue();
  return worker->Promise();
#else
  (void)device;
  return env.Undefined();
#endif
}

}  // namespace kvtier
