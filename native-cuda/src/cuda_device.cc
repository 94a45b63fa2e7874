#include "cuda_device.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
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

#include "cuda_copy.h"
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

// Device copy batches by the method that ran them (memcpy, batch, kernel, staged): how many, their runs
// and bytes, and where their time went (planning and mapping, issuing, waiting), in ns.
struct CopyTally {
  std::atomic<uint64_t> batches{0};
  std::atomic<uint64_t> runs{0};
  std::atomic<uint64_t> bytes{0};
  std::atomic<uint64_t> planNs{0};
  std::atomic<uint64_t> issueNs{0};
  std::atomic<uint64_t> waitNs{0};
};
CopyTally gTally[4];

#ifdef KVTIER_WITH_CUDA
uint64_t SteadyNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

void CountCopies(const cudacopy::Outcome& o, size_t runs, size_t bytes, uint64_t planNs) {
  const int i = o.used == cudacopy::Method::kBatch    ? 1
                : o.used == cudacopy::Method::kKernel ? 2
                : o.used == cudacopy::Method::kStaged ? 3
                                                      : 0;
  CopyTally& t = gTally[i];
  t.batches.fetch_add(1, std::memory_order_relaxed);
  t.runs.fetch_add(runs, std::memory_order_relaxed);
  t.bytes.fetch_add(bytes, std::memory_order_relaxed);
  t.planNs.fetch_add(planNs, std::memory_order_relaxed);
  t.issueNs.fetch_add(o.issueNs, std::memory_order_relaxed);
  t.waitNs.fetch_add(o.waitNs, std::memory_order_relaxed);
}
#endif

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
  DeviceCopyWorker(Napi::Env env, bool toDevice, int device, cudacopy::Method method)
      : PromiseWorker(env, "kvtier.copyBatchDevice"),
        toDevice_(toDevice),
        device_(device),
        method_(method) {}

  std::vector<Region> host;
  std::vector<Region> dev;
  std::vector<double> ops;
  bool hasWaitEvent = false;
  cudaIpcEventHandle_t waitEvent{};

 protected:
  void Work() override {
    const uint64_t t0 = SteadyNs();
    std::vector<Run> runs;
    failure_ = PlanCopies(host, dev, ops, false, &runs);
    if (failure_.failed()) return;
    result_ = runs.size();
    if (runs.empty()) return;
    // The device's context must be current on this pool thread before host memory is queried:
    // without one the query fails and the batch would lose the kernel.
    const cudaError_t set = cudaSetDevice(device_);
    if (set != cudaSuccess) {
      failure_ = Failure{kErrCuda, CudaMessage(set, "cudaSetDevice")};
      return;
    }
    // Where the device sees each host buffer (pinned slabs are mapped; other memory is not).
    std::vector<HostSpan> spans;
    spans.reserve(host.size());
    for (const Region& r : host) spans.push_back(HostSpan{r.base, r.bytes, cudacopy::DeviceAddressOf(r.base)});
    std::sort(spans.begin(), spans.end(),
              [](const HostSpan& x, const HostSpan& y) { return x.base < y.base; });
    std::vector<cudacopy::DeviceRun> devRuns;
    devRuns.reserve(runs.size());
    for (const Run& r : runs) devRuns.push_back(cudacopy::DeviceRun{r.a, MappedAddress(spans, r), r.b, r.bytes});
    size_t bytes = 0;
    for (const Run& r : runs) bytes += r.bytes;
    const uint64_t planNs = SteadyNs() - t0;
    const cudacopy::Outcome o =
        cudacopy::Execute(toDevice_, device_, devRuns, method_, hasWaitEvent ? &waitEvent : nullptr);
    CountCopies(o, runs.size(), bytes, planNs);
    if (!o.ok()) failure_ = Failure{kErrCuda, CudaMessage(o.err, o.what.c_str())};
  }

 private:
  struct HostSpan {
    uint8_t* base;
    size_t bytes;
    uint8_t* dev;  // nullptr: not mapped
  };

  // The device address of a run's host bytes: its first and last byte lie in mapped buffers
  // that map with one offset (the same pinned slab). nullptr otherwise.
  static uint8_t* MappedAddress(const std::vector<HostSpan>& spans, const Run& r) {
    const auto delta = [&spans](const uint8_t* p, ptrdiff_t* d) {
      auto it = std::upper_bound(spans.begin(), spans.end(), p,
                                 [](const uint8_t* q, const HostSpan& s) { return q < s.base; });
      while (it != spans.begin()) {
        --it;
        if (it->dev != nullptr && p < it->base + it->bytes) {
          *d = it->dev - it->base;
          return true;
        }
      }
      return false;
    };
    ptrdiff_t first = 0;
    ptrdiff_t last = 0;
    if (!delta(r.a, &first) || !delta(r.a + r.bytes - 1, &last) || first != last) return nullptr;
    return r.a + first;
  }

  bool toDevice_;
  int device_;
  cudacopy::Method method_;
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
  // Mapped too, so the copy kernel can read and write the pages through their device address.
  return cudaHostRegister(base, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped) ==
         cudaSuccess;
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
  cudacopy::Method method = cudacopy::Method::kAuto;
  bool hasWaitEvent = false;
  cudaIpcEventHandle_t waitEvent{};
  if (info.Length() > 5 && !info[5].IsUndefined() && !info[5].IsNull()) {
    if (!info[5].IsObject()) Throw(env, kErrInvalidArg, "options must be an object");
    Napi::Object o = info[5].As<Napi::Object>();
    Napi::Value m = o.Get("method");
    if (!m.IsUndefined()) {
      const std::string name = m.IsString() ? m.As<Napi::String>().Utf8Value() : "";
      if (!cudacopy::ParseMethod(name.c_str(), &method)) {
        Throw(env, kErrInvalidArg,
              "method must be 'auto', 'memcpy', 'batch', 'kernel' or 'staged'");
      }
    }
    Napi::Value ev = o.Get("waitEvent");
    if (!ev.IsUndefined() && !ev.IsNull()) {
      uint8_t* data = nullptr;
      size_t bytes = 0;
      if (!BytesOf(ev, &data, &bytes) || bytes != sizeof(cudaIpcEventHandle_t)) {
        Throw(env, kErrInvalidArg, "waitEvent must be 64 bytes (a cudaIpcEventHandle_t)");
      }
      std::memcpy(&waitEvent, data, sizeof(waitEvent));
      hasWaitEvent = true;
    }
  }
  auto* worker = new DeviceCopyWorker(env, direction == "h2d", device, method);
  worker->hasWaitEvent = hasWaitEvent;
  worker->waitEvent = waitEvent;
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

Napi::Value DeviceCopyCounts(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  const char* names[4] = {"memcpy", "batch", "kernel", "staged"};
  const auto num = [&env](const std::atomic<uint64_t>& v) {
    return Napi::Number::New(env, static_cast<double>(v.load(std::memory_order_relaxed)));
  };
  for (int i = 0; i < 4; i++) {
    Napi::Object one = Napi::Object::New(env);
    one.Set("batches", num(gTally[i].batches));
    one.Set("runs", num(gTally[i].runs));
    one.Set("bytes", num(gTally[i].bytes));
    one.Set("planMs", Napi::Number::New(env, gTally[i].planNs.load() / 1e6));
    one.Set("issueMs", Napi::Number::New(env, gTally[i].issueNs.load() / 1e6));
    one.Set("waitMs", Napi::Number::New(env, gTally[i].waitNs.load() / 1e6));
    out.Set(names[i], one);
  }
  return out;
}

}  // namespace kvtier
