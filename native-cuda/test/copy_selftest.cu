// Self-test of the addon's host<->device copy paths (src/cuda_copy.cu) without Node.js: every
// method (memcpy, batch, kernel) on scattered blocks of several sizes, both directions, each
// destination poisoned first and every byte compared; then each timed against one contiguous
// cudaMemcpyAsync of the same bytes between the same pinned host memory and the device.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Inative-cuda/src \
//     native-cuda/test/copy_selftest.cu native-cuda/src/cuda_copy.cu -o copy_selftest
//   ./copy_selftest [--bytes N] [--reps N] [--json FILE]
//
// Exit 0 when every check passed, 1 on a mismatch or CUDA error, 2 without a CUDA device.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_copy.h"

using kvtier::cudacopy::DeviceRun;
using kvtier::cudacopy::Method;

namespace {

struct Options {
  size_t bytes = size_t{512} << 20;
  int reps = 5;
  std::string json;
};

uint64_t gRng = 0x9e3779b97f4a7c15ull;
uint64_t Next() {
  gRng ^= gRng << 13;
  gRng ^= gRng >> 7;
  gRng ^= gRng << 17;
  return gRng;
}

void Fill(uint8_t* p, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = Next();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; i++) p[i] = static_cast<uint8_t>(Next());
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

bool Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  std::fprintf(stderr, "copy_selftest: %s failed: %s\n", what, cudaGetErrorString(err));
  return false;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs moving `count` blocks of `block` bytes: host block i <-> device block perm[i].
std::vector<DeviceRun> ScatteredRuns(uint8_t* host, uint8_t* hostDev, uint8_t* dev, size_t block,
                                     size_t count) {
  std::vector<size_t> perm(count);
  for (size_t i = 0; i < count; i++) perm[i] = i;
  for (size_t i = count; i > 1; i--) std::swap(perm[i - 1], perm[Next() % i]);
  std::vector<DeviceRun> runs(count);
  for (size_t i = 0; i < count; i++) {
    runs[i] = DeviceRun{host + i * block, hostDev == nullptr ? nullptr : hostDev + i * block,
                        dev + perm[i] * block, block};
  }
  return runs;
}

struct Row {
  std::string method;
  std::string direction;
  size_t block;
  bool exact;
  double gbps;
  double contiguousGbps;
  std::string used;
};

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; i++) {
    const std::string a = argv[i];
    if (a == "--bytes" && i + 1 < argc) opt.bytes = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--reps" && i + 1 < argc) opt.reps = std::atoi(argv[++i]);
    else if (a == "--json" && i + 1 < argc) opt.json = argv[++i];
    else {
      std::fprintf(stderr, "usage: copy_selftest [--bytes N] [--reps N] [--json FILE]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("{\"skipped\": \"no CUDA device\"}\n");
    return 2;
  }
  cudaDeviceProp prop;
  if (!Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties")) return 1;
  if (!Check(cudaSetDevice(0), "cudaSetDevice")) return 1;
  const size_t total = opt.bytes;
  // Host memory as the addon's slabs are: anonymous mmap, registered portable and mapped.
  auto* host = static_cast<uint8_t*>(
      mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  auto* expect = static_cast<uint8_t*>(std::malloc(total));
  auto* back = static_cast<uint8_t*>(std::malloc(total));
  if (host == MAP_FAILED || expect == nullptr || back == nullptr) {
    std::fprintf(stderr, "copy_selftest: out of host memory\n");
    return 1;
  }
  if (!Check(cudaHostRegister(host, total, cudaHostRegisterPortable | cudaHostRegisterMapped),
             "cudaHostRegister"))
    return 1;
  uint8_t* hostDev = kvtier::cudacopy::DeviceAddressOf(host);
  uint8_t* dev = nullptr;
  if (!Check(cudaMalloc(&dev, total), "cudaMalloc")) return 1;
  cudaStream_t stream = nullptr;
  if (!Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) return 1;

  // The raw limit: one contiguous copy of all the bytes, as torch's Tensor.copy_ issues it.
  auto contiguous = [&](bool toDevice) {
    std::vector<double> t;
    for (int r = 0; r < opt.reps; r++) {
      const double t0 = Now();
      cudaMemcpyAsync(toDevice ? static_cast<void*>(dev) : host, toDevice ? static_cast<void*>(host) : dev,
                      total, toDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream);
      cudaStreamSynchronize(stream);
      t.push_back(Now() - t0);
    }
    return total / Median(t) / 1e9;
  };
  const double rawH2d = contiguous(true);
  const double rawD2h = contiguous(false);

  bool ok = true;
  std::vector<Row> rows;
  const size_t blocks[] = {size_t{4} << 10, size_t{32} << 10, size_t{256} << 10, size_t{2} << 20};
  const Method methods[] = {Method::kMemcpy, Method::kBatch, Method::kKernel, Method::kStaged,
                            Method::kAuto};
  for (size_t block : blocks) {
    const size_t count = total / block;
    for (Method m : methods) {
      for (bool toDevice : {true, false}) {
        std::vector<DeviceRun> runs = ScatteredRuns(host, hostDev, dev, block, count);
        // Correctness: fresh random source, poisoned destination, every byte compared.
        bool exact = true;
        if (toDevice) {
          Fill(host, total);
          cudaMemset(dev, 0xA5, total);
          cudaDeviceSynchronize();
        } else {
          Fill(expect, total);
          cudaMemcpy(dev, expect, total, cudaMemcpyHostToDevice);
          std::memset(host, 0x5A, total);
        }
        const kvtier::cudacopy::Outcome o = kvtier::cudacopy::Execute(toDevice, 0, runs, m, nullptr);
        if (!o.ok()) {
          std::fprintf(stderr, "copy_selftest: %s %s %zu: %s failed: %s\n",
                       kvtier::cudacopy::MethodName(m), toDevice ? "h2d" : "d2h", block,
                       o.what.c_str(), cudaGetErrorString(o.err));
          ok = false;
          exact = false;
        } else if (toDevice) {
          cudaMemcpy(back, dev, total, cudaMemcpyDeviceToHost);
          for (const DeviceRun& r : runs) exact = exact && std::memcmp(back + (r.dev - dev), r.host, r.bytes) == 0;
        } else {
          for (const DeviceRun& r : runs) exact = exact && std::memcmp(r.host, expect + (r.dev - dev), r.bytes) == 0;
        }
        ok = ok && exact;
        std::vector<double> t;
        for (int r = 0; exact && r < opt.reps; r++) {
          const double t0 = Now();
          kvtier::cudacopy::Execute(toDevice, 0, runs, m, nullptr);
          t.push_back(Now() - t0);
        }
        const double gbps = exact ? total / Median(t) / 1e9 : 0;
        rows.push_back(Row{kvtier::cudacopy::MethodName(m), toDevice ? "h2d" : "d2h", block, exact,
                           gbps, toDevice ? rawH2d : rawD2h, kvtier::cudacopy::MethodName(o.used)});
      }
    }
  }
  // The addon's slabs ask for transparent huge pages (MADV_HUGEPAGE); the same 32 KiB copies
  // and the contiguous limit from such memory, to see whether the page size moves the link rate.
  {
    auto* huge = static_cast<uint8_t*>(
        mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    bool registered = false;
    if (huge != MAP_FAILED) {
#ifdef MADV_HUGEPAGE
      madvise(huge, total, MADV_HUGEPAGE);
#endif
      registered = cudaHostRegister(huge, total, cudaHostRegisterPortable | cudaHostRegisterMapped) ==
                   cudaSuccess;
    }
    if (registered) {
      uint8_t* hugeDev = kvtier::cudacopy::DeviceAddressOf(huge);
      for (bool toDevice : {true, false}) {
        std::vector<double> t;
        for (int r = 0; r < opt.reps; r++) {
          const double t0 = Now();
          cudaMemcpyAsync(toDevice ? static_cast<void*>(dev) : huge,
                          toDevice ? static_cast<void*>(huge) : dev, total,
                          toDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost, stream);
          cudaStreamSynchronize(stream);
          t.push_back(Now() - t0);
        }
        const double raw = total / Median(t) / 1e9;
        rows.push_back(Row{"contig", toDevice ? "h2d-thp" : "d2h-thp", total, true, raw,
                           toDevice ? rawH2d : rawD2h, "memcpy"});
        for (Method m : {Method::kKernel, Method::kStaged}) {
          std::vector<DeviceRun> runs = ScatteredRuns(huge, hugeDev, dev, size_t{32} << 10, total >> 15);
          if (toDevice) {
            Fill(huge, total);
            cudaMemset(dev, 0xA5, total);
            cudaDeviceSynchronize();
          } else {
            Fill(expect, total);
            cudaMemcpy(dev, expect, total, cudaMemcpyHostToDevice);
            std::memset(huge, 0x5A, total);
          }
          const auto o = kvtier::cudacopy::Execute(toDevice, 0, runs, m, nullptr);
          bool exact = o.ok();
          if (exact && toDevice) {
            cudaMemcpy(back, dev, total, cudaMemcpyDeviceToHost);
            for (const DeviceRun& r : runs) exact = exact && std::memcmp(back + (r.dev - dev), r.host, r.bytes) == 0;
          } else if (exact) {
            for (const DeviceRun& r : runs) exact = exact && std::memcmp(r.host, expect + (r.dev - dev), r.bytes) == 0;
          }
          ok = ok && exact;
          std::vector<double> tm;
          for (int r = 0; exact && r < opt.reps; r++) {
            const double t0 = Now();
            kvtier::cudacopy::Execute(toDevice, 0, runs, m, nullptr);
            tm.push_back(Now() - t0);
          }
          rows.push_back(Row{kvtier::cudacopy::MethodName(m), toDevice ? "h2d-thp" : "d2h-thp",
                             size_t{32} << 10, exact, exact ? total / Median(tm) / 1e9 : 0,
                             raw, kvtier::cudacopy::MethodName(o.used)});
        }
      }
      cudaHostUnregister(huge);
    }
    if (huge != MAP_FAILED) munmap(huge, total);
  }
  // Unaligned runs: odd sizes and offsets take the kernel's byte path.
  if (hostDev != nullptr) {
    std::vector<DeviceRun> runs;
    size_t at = 0;
    for (size_t i = 0; i < 4096; i++) {
      const size_t n = 1 + Next() % 9000;
      const size_t hOff = at + 3;
      const size_t dOff = total - at - n - 5;
      runs.push_back(DeviceRun{host + hOff, hostDev + hOff, dev + dOff, n});
      at += n + 16;
    }
    Fill(host, at + 16);
    cudaMemset(dev, 0xA5, total);
    cudaDeviceSynchronize();
    const auto o = kvtier::cudacopy::Execute(true, 0, runs, Method::kKernel, nullptr);
    bool exact = o.ok();
    cudaMemcpy(back, dev, total, cudaMemcpyDeviceToHost);
    for (const DeviceRun& r : runs) exact = exact && std::memcmp(back + (r.dev - dev), r.host, r.bytes) == 0;
    rows.push_back(Row{"kernel", "h2d-unaligned", 0, exact, 0, 0, kvtier::cudacopy::MethodName(o.used)});
    ok = ok && exact;
  }

  std::printf("%-8s %-14s %9s %6s %10s %10s %6s %s\n", "method", "direction", "block", "exact",
              "GB/s", "raw GB/s", "ratio", "ran as");
  for (const Row& r : rows) {
    std::printf("%-8s %-14s %9zu %6s %10.2f %10.2f %6.2f %s\n", r.method.c_str(),
                r.direction.c_str(), r.block, r.exact ? "yes" : "NO", r.gbps, r.contiguousGbps,
                r.contiguousGbps > 0 ? r.gbps / r.contiguousGbps : 0.0, r.used.c_str());
  }
  if (!opt.json.empty()) {
    FILE* f = std::fopen(opt.json.c_str(), "w");
    if (f != nullptr) {
      std::fprintf(f, "{\"device\": \"%s\", \"bytes\": %zu, \"ok\": %s, \"rows\": [", prop.name, total,
                   ok ? "true" : "false");
      for (size_t i = 0; i < rows.size(); i++) {
        const Row& r = rows[i];
        std::fprintf(f,
                     "%s{\"method\": \"%s\", \"direction\": \"%s\", \"blockBytes\": %zu, \"exact\": %s, "
                     "\"GBps\": %.3f, \"contiguousGBps\": %.3f, \"ranAs\": \"%s\"}",
                     i ? ", " : "", r.method.c_str(), r.direction.c_str(), r.block,
                     r.exact ? "true" : "false", r.gbps, r.contiguousGbps, r.used.c_str());
      }
      std::fprintf(f, "]}\n");
      std::fclose(f);
    }
  }
  cudaStreamDestroy(stream);
  cudaFree(dev);
  cudaHostUnregister(host);
  munmap(host, total);
  std::printf("copy_selftest: %s on %s\n", ok ? "all exact" : "MISMATCH or error", prop.name);
  return ok ? 0 : 1;
}
