#include "copy_plan.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define KVTIER_COPY_X86 1
#endif

namespace kvtier {
namespace {

// Below this many bytes per thread, starting a thread costs more than it saves.
constexpr size_t kMinBytesPerThread = 8u << 20;

size_t EnvSize(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || v[0] == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return (end != nullptr && *end == '\0' && n > 0) ? static_cast<size_t>(n) : fallback;
}

// Unit of work the copy threads of one batch take in turn (KVTIER_COPY_SLICE_KIB, default 1 MiB).
const size_t kSliceBytes = EnvSize("KVTIER_COPY_SLICE_KIB", 1024) << 10;

// Batches of at least this many bytes are copied with non-temporal (streaming) stores: they
// write whole cache lines to memory without reading them first and without evicting the cache,
// which is what a copy far larger than the cache wants (KVTIER_COPY_STREAM_MIB; 0 never).
const size_t kStreamMinBytes = [] {
  const char* v = std::getenv("KVTIER_COPY_STREAM_MIB");
  if (v != nullptr && v[0] == '0' && v[1] == '\0') return SIZE_MAX;
  return EnvSize("KVTIER_COPY_STREAM_MIB", 16) << 20;
}();

#ifdef KVTIER_COPY_X86
const bool kAvx2 = __builtin_cpu_supports("avx2");

// Copies with 32-byte streaming stores (the destination aligned first); the tail with memcpy.
__attribute__((target("avx2"))) void StreamCopy(uint8_t* d, const uint8_t* s, size_t n) {
  const size_t head = std::min(n, (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31);
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 128; n -= 128, d += 128, s += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
  }
  std::memcpy(d, s, n);
}

void CopyRun(uint8_t* d, const uint8_t* s, size_t n, bool stream) {
  if (stream && kAvx2 && n >= 4096) StreamCopy(d, s, n);
  else std::memcpy(d, s, n);
}

// Streaming stores are weakly ordered: fence them before the batch counts as done.
void StreamFence(bool stream) {
  if (stream) _mm_sfence();
}
#else
void CopyRun(uint8_t* d, const uint8_t* s, size_t n, bool) { std::memcpy(d, s, n); }
void StreamFence(bool) {}
#endif

bool ReadIndex(double v, size_t* out) {
  constexpr double kMaxSafe = 9007199254740991.0;
  if (!std::isfinite(v) || v < 0 || v > kMaxSafe || std::floor(v) != v) return false;
  *out = static_cast<size_t>(v);
  return true;
}

Failure OpFailure(const char* code, size_t op, const std::string& what) {
  return Failure{code, "op " + std::to_string(op) + ": " + what};
}

Failure CheckRange(const std::vector<Region>& regions, size_t op, const char* side, size_t index,
                   size_t offset, size_t length, uint8_t** out) {
  if (index >= regions.size()) {
    return OpFailure(kErrBadOp, op,
                     std::string(side) + " buffer index " + std::to_string(index) +
                         " is out of range (" + std::to_string(regions.size()) + " buffers)");
  }
  const Region& r = regions[index];
  if (offset > r.bytes || length > r.bytes - offset) {
    return OpFailure(kErrOutOfRange, op,
                     std::string(side) + " range [" + std::to_string(offset) + ", " +
                         std::to_string(offset + length) + ") exceeds buffer " +
                         std::to_string(index) + " of " + std::to_string(r.bytes) + " bytes");
  }
  *out = r.base + offset;
  return Failure{};
}

using Span = std::pair<uintptr_t, uintptr_t>;  // [begin, end)

Failure CheckOverlap(const std::vector<Run>& runs) {
  std::vector<Span> dst;
  std::vector<Span> src;
  dst.reserve(runs.size());
  src.reserve(runs.size());
  for (const Run& r : runs) {
    src.emplace_back(reinterpret_cast<uintptr_t>(r.a), reinterpret_cast<uintptr_t>(r.a) + r.bytes);
    dst.emplace_back(reinterpret_cast<uintptr_t>(r.b), reinterpret_cast<uintptr_t>(r.b) + r.bytes);
  }
  std::sort(dst.begin(), dst.end());
  std::sort(src.begin(), src.end());
  for (size_t i = 1; i < dst.size(); i++) {
    if (dst[i].first < dst[i - 1].second) {
      return Failure{kErrOverlap, "two ops write the same destination bytes"};
    }
  }
  // Destinations are sorted and disjoint, so one forward sweep finds any source that meets one.
  size_t d = 0;
  for (const Span& s : src) {
    while (d < dst.size() && dst[d].second <= s.first) d++;
    if (d == dst.size()) break;
    if (dst[d].first < s.second) {
      return Failure{kErrOverlap, "an op reads bytes that the batch also writes"};
    }
  }
  return Failure{};
}

}  // namespace

Failure PlanCopies(const std::vector<Region>& as, const std::vector<Region>& bs,
                   const std::vector<double>& ops, bool checkOverlap, std::vector<Run>* runs) {
  if (ops.size() % kOpWidth != 0) {
    return Failure{kErrBadOp, "ops length " + std::to_string(ops.size()) +
                                  " is not a multiple of 5 ([aIndex, aOffset, bIndex, "
                                  "bOffset, length] per op)"};
  }
  const size_t count = ops.size() / kOpWidth;
  size_t prevA = SIZE_MAX;
  size_t prevB = SIZE_MAX;
  for (size_t i = 0; i < count; i++) {
    size_t v[kOpWidth];
    for (size_t k = 0; k < kOpWidth; k++) {
      if (!ReadIndex(ops[i * kOpWidth + k], &v[k])) {
        return OpFailure(kErrBadOp, i,
                         "field " + std::to_string(k) + " must be a non-negative integer");
      }
    }
    uint8_t* a = nullptr;
    uint8_t* b = nullptr;
    Failure f = CheckRange(as, i, "source", v[0], v[1], v[4], &a);
    if (f.failed()) return f;
    f = CheckRange(bs, i, "destination", v[2], v[3], v[4], &b);
    if (f.failed()) return f;
    if (v[4] == 0) continue;
    if (!runs->empty() && v[0] == prevA && v[2] == prevB) {
      Run& last = runs->back();
      if (last.a + last.bytes == a && last.b + last.bytes == b) {
        last.bytes += v[4];
        continue;
      }
    }
    runs->push_back(Run{a, b, v[4]});
    prevA = v[0];
    prevB = v[2];
  }
  if (checkOverlap) return CheckOverlap(*runs);
  return Failure{};
}

void ExecuteHostRuns(const std::vector<Run>& runs, size_t maxThreads) {
  size_t total = 0;
  for (const Run& r : runs) total += r.bytes;
  const size_t threads =
      std::max<size_t>(1, std::min(maxThreads, total / kMinBytesPerThread));
  const bool stream = total >= kStreamMinBytes;
  if (threads == 1) {
    for (const Run& r : runs) CopyRun(r.b, r.a, r.bytes, stream);
    StreamFence(stream);
    return;
  }
  // starts[i] is the offset of run i in the concatenated bytes of all runs.
  std::vector<size_t> starts(runs.size());
  size_t pos = 0;
  for (size_t i = 0; i < runs.size(); i++) {
    starts[i] = pos;
    pos += runs[i].bytes;
  }
  // Threads take slices from a shared counter instead of fixed shares: on a machine shared with
  // other work, a thread that is descheduled leaves its remaining slices to the others, so the
  // batch is not held up by its slowest thread.
  const size_t slices = (total + kSliceBytes - 1) / kSliceBytes;
  std::atomic<size_t> next{0};
  auto work = [&runs, &starts, &next, total, slices, stream]() {
    for (size_t s = next.fetch_add(1, std::memory_order_relaxed); s < slices;
         s = next.fetch_add(1, std::memory_order_relaxed)) {
      size_t begin = s * kSliceBytes;
      const size_t end = std::min(total, begin + kSliceBytes);
      size_t i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), begin) -
                                     starts.begin()) -
                 1;
      while (begin < end) {
        const Run& r = runs[i];
        const size_t from = begin - starts[i];
        const size_t to = std::min(r.bytes, end - starts[i]);
        CopyRun(r.b + from, r.a + from, to - from, stream);
        begin = starts[i] + to;
        i++;
      }
    }
    StreamFence(stream);
  };
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  for (size_t t = 1; t < threads; t++) {
    try {
      helpers.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // out of threads: the slices left are taken by those that started
    }
  }
  work();
  for (std::thread& h : helpers) h.join();
}

}  // namespace kvtier
