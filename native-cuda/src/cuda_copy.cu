// Host <-> device copies of the data plane: see cuda_copy.h.
#include "cuda_copy.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>
#include <utility>

namespace kvtier {
namespace cudacopy {
namespace {

// A run is cut into pieces of at most this many bytes, one thread block per piece at a time, so
// a batch of large runs still spreads over every multiprocessor.
constexpr size_t kPieceBytes = size_t{64} << 10;
constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;

struct Piece {
  const uint8_t* src;
  uint8_t* dst;
  unsigned long long bytes;
};

// Each block copies whole pieces; its threads move 16-byte words, four loads in flight before
// the first store, so reads of host memory over the link overlap.
__global__ void CopyPiecesKernel(const Piece* __restrict__ pieces, unsigned n) {
  for (unsigned p = blockIdx.x; p < n; p += gridDim.x) {
    const Piece pc = pieces[p];
    const uint8_t* s = pc.src;
    uint8_t* d = pc.dst;
    const size_t bytes = static_cast<size_t>(pc.bytes);
    const size_t step = blockDim.x;
    if (((reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d)) & 15) == 0) {
      const uint4* s4 = reinterpret_cast<const uint4*>(s);
      uint4* d4 = reinterpret_cast<uint4*>(d);
      const size_t n4 = bytes >> 4;
      size_t i = threadIdx.x;
      for (; i + 3 * step < n4; i += 4 * step) {
        const uint4 a = s4[i];
        const uint4 b = s4[i + step];
        const uint4 c = s4[i + 2 * step];
        const uint4 e = s4[i + 3 * step];
        d4[i] = a;
        d4[i + step] = b;
        d4[i + 2 * step] = c;
        d4[i + 3 * step] = e;
      }
      for (; i < n4; i += step) d4[i] = s4[i];
      for (size_t t = (n4 << 4) + threadIdx.x; t < bytes; t += step) d[t] = s[t];
    } else {
      for (size_t t = threadIdx.x; t < bytes; t += step) d[t] = s[t];
    }
  }
}

// Pinned, mapped host buffers for the kernel's piece tables, reused across batches (allocating
// pinned memory costs far more than a batch).
class Staging {
 public:
  struct Buffer {
    Piece* host = nullptr;
    Piece* dev = nullptr;
    size_t capacity = 0;  // pieces
  };

  cudaError_t Acquire(size_t pieces, Buffer* out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->capacity >= pieces) {
          *out = *it;
          free_.erase(it);
          return cudaSuccess;
        }
      }
    }
    size_t cap = 4096;
    while (cap < pieces) cap *= 2;
    void* host = nullptr;
    cudaError_t err =
        cudaHostAlloc(&host, cap * sizeof(Piece), cudaHostAllocMapped | cudaHostAllocPortable);
    if (err != cudaSuccess) return err;
    void* dev = nullptr;
    err = cudaHostGetDevicePointer(&dev, host, 0);
    if (err != cudaSuccess) {
      cudaFreeHost(host);
      return err;
    }
    *out = Buffer{static_cast<Piece*>(host), static_cast<Piece*>(dev), cap};
    return cudaSuccess;
  }

  void Release(const Buffer& b) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
    // A few buffers serve the pool threads; more would only hold pinned memory.
    while (free_.size() > 8) {
      cudaFreeHost(free_.front().host);
      free_.pop_front();
    }
  }

 private:
  std::mutex mu_;
  std::list<Buffer> free_;
};

Staging& TheStaging() {
  static Staging* s = new Staging();  // never destroyed: the driver may be gone at exit
  return *s;
}

// Interprocess events opened from their handles, per device; an engine records the same few
// events step after step, so each is opened once.
class EventCache {
 public:
  cudaError_t Get(int device, const cudaIpcEventHandle_t& handle, cudaEvent_t* out) {
    std::string key(reinterpret_cast<const char*>(&handle), sizeof(handle));
    key.push_back(static_cast<char>(device));
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->first == key) {
        entries_.splice(entries_.begin(), entries_, it);
        *out = it->second;
        return cudaSuccess;
      }
    }
    cudaEvent_t ev = nullptr;
    const cudaError_t err = cudaIpcOpenEventHandle(&ev, handle);
    if (err != cudaSuccess) return err;
    entries_.emplace_front(std::move(key), ev);
    if (entries_.size() > kMaxEvents) {
      // A wait already issued on it holds; destroying only drops this process's reference.
      cudaEventDestroy(entries_.back().second);
      entries_.pop_back();
    }
    *out = ev;
    return cudaSuccess;
  }

 private:
  static constexpr size_t kMaxEvents = 256;
  std::mutex mu_;
  std::list<std::pair<std::string, cudaEvent_t>> entries_;
};

EventCache& TheEvents() {
  static EventCache* c = new EventCache();
  return *c;
}

int MultiprocessorCount(int device) {
  static std::array<int, 64> counts{};
  static std::mutex mu;
  if (device < 0 || device >= 64) return 1;
  std::lock_guard<std::mutex> lock(mu);
  if (counts[device] == 0) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n <= 0)
      n = 16;
    counts[device] = n;
  }
  return counts[device];
}

cudaError_t IssueMemcpy(bool toDevice, const std::vector<DeviceRun>& runs, cudaStream_t stream,
                        std::string* what) {
  const cudaMemcpyKind kind = toDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
  for (const DeviceRun& r : runs) {
    void* dst = toDevice ? static_cast<void*>(r.dev) : static_cast<void*>(r.host);
    const void* src = toDevice ? static_cast<const void*>(r.host) : static_cast<const void*>(r.dev);
    const cudaError_t err = cudaMemcpyAsync(dst, src, r.bytes, kind, stream);
    if (err != cudaSuccess) {
      *what = "cudaMemcpyAsync";
      return err;
    }
  }
  return cudaSuccess;
}

cudaError_t IssueBatch(bool toDevice, const std::vector<DeviceRun>& runs, cudaStream_t stream,
                       std::string* what) {
  std::vector<void*> dsts(runs.size());
  std::vector<const void*> srcs(runs.size());
  std::vector<size_t> sizes(runs.size());
  for (size_t i = 0; i < runs.size(); i++) {
    dsts[i] = toDevice ? static_cast<void*>(runs[i].dev) : static_cast<void*>(runs[i].host);
    srcs[i] = toDevice ? static_cast<const void*>(runs[i].host) : static_cast<const void*>(runs[i].dev);
    sizes[i] = runs[i].bytes;
  }
  cudaMemcpyAttributes attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t attrIndex = 0;
  const cudaError_t err = cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), runs.size(),
                                               &attr, &attrIndex, 1, stream);
  if (err != cudaSuccess) *what = "cudaMemcpyBatchAsync";
  return err;
}

cudaError_t IssueKernel(bool toDevice, int device, const std::vector<DeviceRun>& runs,
                        cudaStream_t stream, Staging::Buffer* staged, std::string* what) {
  size_t pieces = 0;
  for (const DeviceRun& r : runs) pieces += (r.bytes + kPieceBytes - 1) / kPieceBytes;
  cudaError_t err = TheStaging().Acquire(pieces, staged);
  if (err != cudaSuccess) {
    *what = "cudaHostAlloc (piece table)";
    return err;
  }
  Piece* out = staged->host;
  for (const DeviceRun& r : runs) {
    for (size_t off = 0; off < r.bytes; off += kPieceBytes) {
      const size_t n = std::min(kPieceBytes, r.bytes - off);
      uint8_t* hostSide = r.hostDev + off;
      uint8_t* devSide = r.dev + off;
      *out++ = toDevice ? Piece{hostSide, devSide, n} : Piece{devSide, hostSide, n};
    }
  }
  const unsigned n = static_cast<unsigned>(pieces);
  const unsigned grid = static_cast<unsigned>(
      std::min<size_t>(pieces, static_cast<size_t>(MultiprocessorCount(device)) * kBlocksPerSm));
  CopyPiecesKernel<<<grid, kThreads, 0, stream>>>(staged->dev, n);
  err = cudaGetLastError();
  if (err != cudaSuccess) *what = "copy kernel launch";
  return err;
}

// Room after a staging buffer for the kernel's piece table, so the kernel reads its pieces from
// device memory: read over the link, they would queue behind the DMA filling the link.
constexpr size_t kTableBytes = size_t{1} << 20;

// Device staging buffers of kStageBytes (+ kTableBytes), per device, reused (cudaMalloc
// synchronizes).
class DeviceStages {
 public:
  cudaError_t Acquire(int device, uint8_t** out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->first == device) {
          *out = it->second;
          free_.erase(it);
          return cudaSuccess;
        }
      }
    }
    void* p = nullptr;
    const cudaError_t err = cudaMalloc(&p, kStageBytes + kTableBytes);
    if (err == cudaSuccess) *out = static_cast<uint8_t*>(p);
    return err;
  }
  void Release(int device, uint8_t* p) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.emplace_back(device, p);
  }

 private:
  std::mutex mu_;
  std::list<std::pair<int, uint8_t*>> free_;
};

DeviceStages& TheStages() {
  static DeviceStages* s = new DeviceStages();
  return *s;
}

// Runs cut into parts of at most kStageBytes, ordered by host address.
std::vector<DeviceRun> ByHostAddress(const std::vector<DeviceRun>& runs) {
  std::vector<DeviceRun> out;
  out.reserve(runs.size());
  for (const DeviceRun& r : runs) {
    for (size_t off = 0; off < r.bytes; off += kStageBytes) {
      const size_t n = std::min(kStageBytes, r.bytes - off);
      out.push_back(DeviceRun{r.host + off, r.hostDev == nullptr ? nullptr : r.hostDev + off,
                              r.dev + off, n});
    }
  }
  std::sort(out.begin(), out.end(),
            [](const DeviceRun& a, const DeviceRun& b) { return a.host < b.host; });
  return out;
}

// Average length of the host-contiguous spans of `runs` (each span at most kStageBytes).
size_t AverageSpan(const std::vector<DeviceRun>& runs) {
  if (runs.empty()) return 0;
  const std::vector<DeviceRun> sorted = ByHostAddress(runs);
  size_t spans = 0;
  size_t total = 0;
  size_t cur = 0;
  const uint8_t* end = nullptr;
  for (const DeviceRun& r : sorted) {
    if (r.host != end || cur + r.bytes > kStageBytes) {
      spans++;
      cur = 0;
    }
    cur += r.bytes;
    total += r.bytes;
    end = r.host + r.bytes;
  }
  return total / spans;
}

// Streams and events a staged batch adds to the batch's own stream, destroyed after it is done.
struct StagedResources {
  cudaStream_t kernels = nullptr;
  std::vector<cudaEvent_t> events;
  ~StagedResources() {
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (kernels != nullptr) cudaStreamDestroy(kernels);
  }
  cudaError_t Event(cudaEvent_t* out) {
    const cudaError_t err = cudaEventCreateWithFlags(out, cudaEventDisableTiming);
    if (err == cudaSuccess) events.push_back(*out);
    return err;
  }
};

// Each span of host-contiguous runs: one DMA between the host span and a staging buffer on the
// batch's stream, and the kernel between that buffer and the runs' device bytes on a second
// stream. With two buffers the DMA of one span overlaps the kernel of the one before; events
// keep each buffer's DMA and kernel in order. The batch's stream ends after everything.
cudaError_t IssueStaged(bool toDevice, int device, const std::vector<DeviceRun>& runs,
                        cudaStream_t dma, Staging::Buffer* table, uint8_t* const* stages,
                        int nStages, StagedResources* res, std::string* what) {
  const std::vector<DeviceRun> sorted = ByHostAddress(runs);
  size_t pieces = 0;
  for (const DeviceRun& r : sorted) pieces += (r.bytes + kPieceBytes - 1) / kPieceBytes;
  cudaError_t err = TheStaging().Acquire(pieces, table);
  if (err != cudaSuccess) {
    *what = "cudaHostAlloc (piece table)";
    return err;
  }
  const auto fail = [what](cudaError_t e, const char* call) {
    *what = call;
    return e;
  };
  err = cudaStreamCreateWithFlags(&res->kernels, cudaStreamNonBlocking);
  if (err != cudaSuccess) return fail(err, "cudaStreamCreate (staged)");
  cudaEvent_t start = nullptr;
  cudaEvent_t dmaDone[2] = {nullptr, nullptr};
  cudaEvent_t kerDone[2] = {nullptr, nullptr};
  if ((err = res->Event(&start)) != cudaSuccess) return fail(err, "cudaEventCreate");
  for (int b = 0; b < nStages; b++) {
    if ((err = res->Event(&dmaDone[b])) != cudaSuccess || (err = res->Event(&kerDone[b])) != cudaSuccess)
      return fail(err, "cudaEventCreate");
  }
  // The spans and their pieces first: the piece table then goes to device memory in one copy.
  struct Span {
    uint8_t* host;
    size_t bytes;
    size_t firstPiece;
    size_t pieces;
  };
  std::vector<Span> spans;
  Piece* next = table->host;
  for (size_t i = 0; i < sorted.size();) {
    uint8_t* stage = stages[spans.size() % nStages];
    Span sp{sorted[i].host, 0, static_cast<size_t>(next - table->host), 0};
    while (i < sorted.size() && sorted[i].host == sp.host + sp.bytes &&
           sp.bytes + sorted[i].bytes <= kStageBytes) {
      const DeviceRun& r = sorted[i];
      for (size_t off = 0; off < r.bytes; off += kPieceBytes) {
        const size_t n = std::min(kPieceBytes, r.bytes - off);
        uint8_t* staged = stage + sp.bytes + off;
        *next++ = toDevice ? Piece{staged, r.dev + off, n} : Piece{r.dev + off, staged, n};
      }
      sp.bytes += r.bytes;
      i++;
    }
    sp.pieces = static_cast<size_t>(next - table->host) - sp.firstPiece;
    spans.push_back(sp);
  }
  Piece* devTable = table->dev;
  if (pieces * sizeof(Piece) <= kTableBytes) {
    devTable = reinterpret_cast<Piece*>(stages[0] + kStageBytes);
    if ((err = cudaMemcpyAsync(devTable, table->host, pieces * sizeof(Piece), cudaMemcpyHostToDevice,
                               dma)) != cudaSuccess)
      return fail(err, "cudaMemcpyAsync (piece table)");
  }
  // The kernel stream starts after whatever the batch's stream waits for (an engine's event)
  // and after the piece table is in place.
  if ((err = cudaEventRecord(start, dma)) != cudaSuccess) return fail(err, "cudaEventRecord");
  if ((err = cudaStreamWaitEvent(res->kernels, start, 0)) != cudaSuccess)
    return fail(err, "cudaStreamWaitEvent");
  const unsigned maxGrid = static_cast<unsigned>(MultiprocessorCount(device) * kBlocksPerSm);
  bool used[2] = {false, false};
  for (size_t k = 0; k < spans.size(); k++) {
    const Span& sp = spans[k];
    const int b = static_cast<int>(k % nStages);
    uint8_t* stage = stages[b];
    uint8_t* hostStart = sp.host;
    const size_t spanBytes = sp.bytes;
    const unsigned n = static_cast<unsigned>(sp.pieces);
    const unsigned grid = std::min(n, maxGrid);
    Piece* spanTable = devTable + sp.firstPiece;
    if (toDevice) {
      // The buffer is free once the kernel of its previous span has read it.
      if (used[b] && (err = cudaStreamWaitEvent(dma, kerDone[b], 0)) != cudaSuccess)
        return fail(err, "cudaStreamWaitEvent");
      if ((err = cudaMemcpyAsync(stage, hostStart, spanBytes, cudaMemcpyHostToDevice, dma)) != cudaSuccess)
        return fail(err, "cudaMemcpyAsync (staged)");
      if ((err = cudaEventRecord(dmaDone[b], dma)) != cudaSuccess) return fail(err, "cudaEventRecord");
      if ((err = cudaStreamWaitEvent(res->kernels, dmaDone[b], 0)) != cudaSuccess)
        return fail(err, "cudaStreamWaitEvent");
      CopyPiecesKernel<<<grid, kThreads, 0, res->kernels>>>(spanTable, n);
      if ((err = cudaGetLastError()) != cudaSuccess) return fail(err, "copy kernel launch (staged)");
      if ((err = cudaEventRecord(kerDone[b], res->kernels)) != cudaSuccess)
        return fail(err, "cudaEventRecord");
    } else {
      // The buffer is free once the DMA of its previous span has drained it.
      if (used[b] && (err = cudaStreamWaitEvent(res->kernels, dmaDone[b], 0)) != cudaSuccess)
        return fail(err, "cudaStreamWaitEvent");
      CopyPiecesKernel<<<grid, kThreads, 0, res->kernels>>>(spanTable, n);
      if ((err = cudaGetLastError()) != cudaSuccess) return fail(err, "copy kernel launch (staged)");
      if ((err = cudaEventRecord(kerDone[b], res->kernels)) != cudaSuccess)
        return fail(err, "cudaEventRecord");
      if ((err = cudaStreamWaitEvent(dma, kerDone[b], 0)) != cudaSuccess)
        return fail(err, "cudaStreamWaitEvent");
      if ((err = cudaMemcpyAsync(hostStart, stage, spanBytes, cudaMemcpyDeviceToHost, dma)) != cudaSuccess)
        return fail(err, "cudaMemcpyAsync (staged)");
      if ((err = cudaEventRecord(dmaDone[b], dma)) != cudaSuccess) return fail(err, "cudaEventRecord");
    }
    used[b] = true;
  }
  // The batch's stream finishes only after the last kernel too.
  cudaEvent_t last = nullptr;
  if ((err = res->Event(&last)) != cudaSuccess) return fail(err, "cudaEventCreate");
  if ((err = cudaEventRecord(last, res->kernels)) != cudaSuccess) return fail(err, "cudaEventRecord");
  if ((err = cudaStreamWaitEvent(dma, last, 0)) != cudaSuccess) return fail(err, "cudaStreamWaitEvent");
  return cudaSuccess;
}

}  // namespace

const char* MethodName(Method m) {
  switch (m) {
    case Method::kMemcpy:
      return "memcpy";
    case Method::kBatch:
      return "batch";
    case Method::kKernel:
      return "kernel";
    case Method::kStaged:
      return "staged";
    default:
      return "auto";
  }
}

bool ParseMethod(const char* name, Method* out) {
  if (name == nullptr) return false;
  for (Method m : {Method::kAuto, Method::kMemcpy, Method::kBatch, Method::kKernel, Method::kStaged}) {
    if (std::strcmp(name, MethodName(m)) == 0) {
      *out = m;
      return true;
    }
  }
  return false;
}

Method MethodFromEnv() {
  Method m = Method::kAuto;
  const char* v = std::getenv("KVTIER_CUDA_COPY");
  if (v != nullptr && v[0] != '\0') ParseMethod(v, &m);
  return m;
}

Method Resolve(Method requested, const std::vector<DeviceRun>& runs) {
  bool mapped = true;
  size_t total = 0;
  for (const DeviceRun& r : runs) {
    mapped = mapped && r.hostDev != nullptr;
    total += r.bytes;
  }
  if (requested == Method::kKernel) return mapped ? Method::kKernel : Method::kMemcpy;
  if (requested != Method::kAuto) return requested;
  if (runs.empty()) return Method::kMemcpy;
  // Tiny runs lose more to the staged scatter's piece table than the kernel does (measured on
  // an H100: 4 KiB blocks 0.68 of the link staged, 0.79 by the kernel; equal at 32 KiB).
  if (total / runs.size() >= kAutoStagedMinRunBytes && AverageSpan(runs) >= kAutoStagedFromBytes)
    return Method::kStaged;
  if (mapped && total / runs.size() < kAutoKernelBelowBytes) return Method::kKernel;
  return Method::kMemcpy;
}

uint8_t* DeviceAddressOf(const void* host) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, host) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state of the failed query
    return nullptr;
  }
  if (attr.type != cudaMemoryTypeHost || attr.devicePointer == nullptr) return nullptr;
  return static_cast<uint8_t*>(attr.devicePointer);
}

uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

Outcome Execute(bool toDevice, int device, const std::vector<DeviceRun>& runs, Method requested,
                const cudaIpcEventHandle_t* waitEvent) {
  Outcome out;
  const uint64_t t0 = NowNs();
  out.used = Resolve(requested == Method::kAuto ? MethodFromEnv() : requested, runs);
  if (runs.empty()) return out;
  cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    out.err = err;
    out.what = "cudaSetDevice";
    return out;
  }
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) {
    out.err = err;
    out.what = "cudaStreamCreate";
    return out;
  }
  std::string what;
  if (waitEvent != nullptr) {
    cudaEvent_t ev = nullptr;
    err = TheEvents().Get(device, *waitEvent, &ev);
    if (err != cudaSuccess) what = "cudaIpcOpenEventHandle";
    if (err == cudaSuccess) {
      err = cudaStreamWaitEvent(stream, ev, 0);
      if (err != cudaSuccess) what = "cudaStreamWaitEvent";
    }
  }
  Staging::Buffer staged;
  uint8_t* stages[2] = {nullptr, nullptr};
  int nStages = 0;
  StagedResources* res = nullptr;
  if (err == cudaSuccess && out.used == Method::kStaged) {
    // Two staging buffers let DMA and kernel overlap; one still works; with none (no device
    // memory) the kernel (or memcpy) takes the batch.
    while (nStages < 2 && TheStages().Acquire(device, &stages[nStages]) == cudaSuccess) nStages++;
    cudaGetLastError();
    if (nStages == 0) out.used = Resolve(Method::kKernel, runs);
    else res = new StagedResources();
  }
  if (err == cudaSuccess) {
    switch (out.used) {
      case Method::kStaged:
        err = IssueStaged(toDevice, device, runs, stream, &staged, stages, nStages, res, &what);
        break;
      case Method::kKernel:
        err = IssueKernel(toDevice, device, runs, stream, &staged, &what);
        break;
      case Method::kBatch:
        err = IssueBatch(toDevice, runs, stream, &what);
        if (err == cudaErrorNotSupported) {  // a driver without batched copies
          cudaGetLastError();
          out.used = Method::kMemcpy;
          err = IssueMemcpy(toDevice, runs, stream, &what);
        }
        break;
      default:
        err = IssueMemcpy(toDevice, runs, stream, &what);
        break;
    }
  }
  // Whatever was issued finishes before the buffers go back to their owners.
  const uint64_t t1 = NowNs();
  out.issueNs = t1 - t0;
  cudaEvent_t done = nullptr;
  cudaError_t evErr =
      cudaEventCreateWithFlags(&done, cudaEventBlockingSync | cudaEventDisableTiming);
  if (evErr == cudaSuccess) evErr = cudaEventRecord(done, stream);
  if (evErr == cudaSuccess) evErr = cudaEventSynchronize(done);
  else cudaStreamSynchronize(stream);
  if (done != nullptr) cudaEventDestroy(done);
  cudaStreamDestroy(stream);
  if (staged.host != nullptr) TheStaging().Release(staged);
  // The batch's stream waited for the kernel stream, so both are idle now (or an issue failed
  // and the kernel stream is synchronized before its buffers go back).
  if (res != nullptr) {
    if (res->kernels != nullptr) cudaStreamSynchronize(res->kernels);
    delete res;
  }
  for (int b = 0; b < nStages; b++) TheStages().Release(device, stages[b]);
  out.waitNs = NowNs() - t1;
  if (err != cudaSuccess) {
    out.err = err;
    out.what = what;
  } else if (evErr != cudaSuccess) {
    out.err = evErr;
    out.what = "cudaEventSynchronize";
  }
  return out;
}

}  // namespace cudacopy
}  // namespace kvtier
