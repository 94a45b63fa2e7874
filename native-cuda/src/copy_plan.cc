#include "copy_plan.h"

#include <algorithm>
#include <atomic>
#include <iterator>
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
// One piece of a strided run: streamed only when it is whole, aligned cache lines (a part-filled
// line would flush a write-combining buffer half empty).
void CopyPiece(uint8_t* d, const uint8_t* s, size_t n, bool stream) {
  if (stream && kAvx2 && n >= 128 && ((reinterpret_cast<uintptr_t>(d) | n) & 63) == 0) {
    StreamCopy(d, s, n);
  } else {
    std::memcpy(d, s, n);
  }
}
// `n` pieces of `bytes` (whole cache lines, every destination piece line aligned) with 32-byte
// streaming stores, piece k from s + k * sStride to d + k * dStride.
__attribute__((target("avx2"))) void StreamPieces(uint8_t* d, const uint8_t* s, size_t bytes,
                                                  size_t n, size_t dStride, size_t sStride) {
  for (size_t k = 0; k < n; k++) {
    uint8_t* dp = d + k * dStride;
    const uint8_t* sp = s + k * sStride;
    for (size_t o = 0; o < bytes; o += 64) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + o));
      const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + o + 32));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dp + o), x);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dp + o + 32), y);
    }
  }
}

bool StreamsPieces(const uint8_t* d, size_t bytes, size_t dStride, bool stream) {
  return stream && kAvx2 && ((reinterpret_cast<uintptr_t>(d) | bytes | dStride) & 63) == 0;
}
#else
void CopyRun(uint8_t* d, const uint8_t* s, size_t n, bool) { std::memcpy(d, s, n); }
void CopyPiece(uint8_t* d, const uint8_t* s, size_t n, bool) { std::memcpy(d, s, n); }
void StreamPieces(uint8_t*, const uint8_t*, size_t, size_t, size_t, size_t) {}
bool StreamsPieces(const uint8_t*, size_t, size_t, bool) { return false; }
void StreamFence(bool) {}
#endif

bool ReadIndex(double v, size_t* out) {
  constexpr double kMaxSafe = 9007199254740991.0;
  // Comparisons are false for NaN; a fraction does not survive the round trip.
  if (!(v >= 0 && v <= kMaxSafe)) return false;
  const size_t n = static_cast<size_t>(v);
  if (static_cast<double>(n) != v) return false;
  *out = n;
  return true;
}

Failure OpFailure(const char* code, size_t op, const std::string& what) {
  return Failure{code, "op " + std::to_string(op) + ": " + what};
}

// Checks that `count` pieces of `length` bytes, `stride` apart from `offset`, lie in buffer
// `index` of `regions`; sets `out` to the first piece's address.
Failure CheckRange(const std::vector<Region>& regions, size_t op, const char* side, size_t index,
                   size_t offset, size_t length, size_t count, size_t stride, uint8_t** out) {
  if (index >= regions.size()) {
    return OpFailure(kErrBadOp, op,
                     std::string(side) + " buffer index " + std::to_string(index) +
                         " is out of range (" + std::to_string(regions.size()) + " buffers)");
  }
  const Region& r = regions[index];
  // Bytes from `offset` to the end of the last piece.
  size_t span = 0;
  bool overflow = false;
  if (count > 0 && length > 0) {
    size_t steps = 0;
    overflow = __builtin_mul_overflow(count - 1, stride, &steps) ||
               __builtin_add_overflow(steps, length, &span);
  }
  if (offset > r.bytes || overflow || span > r.bytes - offset) {
    const std::string what =
        count == 1
            ? "range [" + std::to_string(offset) + ", " + std::to_string(offset + length) + ")"
        : overflow ? std::to_string(count) + " pieces at stride " + std::to_string(stride)
                   : std::to_string(count) + " pieces of " + std::to_string(length) +
                         " bytes at stride " + std::to_string(stride) + ", range [" +
                         std::to_string(offset) + ", " + std::to_string(offset + span) + "),";
    return OpFailure(kErrOutOfRange, op,
                     std::string(side) + " " + what + " exceeds buffer " + std::to_string(index) +
                         " of " + std::to_string(r.bytes) + " bytes");
  }
  *out = r.base + offset;
  return Failure{};
}

// CheckRange's test alone, for the loop over every op (CheckRange then says what is wrong).
inline bool Fits(const std::vector<Region>& regions, size_t index, size_t offset, size_t length,
                 size_t count, size_t stride) {
  if (index >= regions.size()) return false;
  const size_t bytes = regions[index].bytes;
  if (offset > bytes) return false;
  if (count == 0 || length == 0) return true;
  size_t steps = 0;
  size_t span = 0;
  if (__builtin_mul_overflow(count - 1, stride, &steps) ||
      __builtin_add_overflow(steps, length, &span)) {
    return false;
  }
  return span <= bytes - offset;
}

// ---- Overlap ----------------------------------------------------------------------------------

// One side of a run: `count` disjoint pieces of `bytes` at base + k * stride, k < count. A side
// whose pieces touch (count 1, or stride == bytes) is one piece.
struct Side {
  uintptr_t base;
  size_t bytes;
  size_t count;
  size_t stride;
  uintptr_t end() const { return base + (count - 1) * stride + bytes; }
};

Side SideOf(const uint8_t* p, size_t bytes, size_t count, size_t stride) {
  if (count == 1 || stride == bytes) {
    return Side{reinterpret_cast<uintptr_t>(p), bytes * count, 1, bytes * count};
  }
  return Side{reinterpret_cast<uintptr_t>(p), bytes, count, stride};
}
Side DstOf(const StridedRun& r) { return SideOf(r.b, r.bytes, r.count, r.bStride); }
Side SrcOf(const StridedRun& r) { return SideOf(r.a, r.bytes, r.count, r.aStride); }

// Index of the first piece of `s` that ends after `x` (s.count when none does).
size_t FirstEndingAfter(const Side& s, uintptr_t x) {
  if (s.base + s.bytes > x) return 0;
  const size_t k = (x - s.base - s.bytes) / s.stride + 1;
  return std::min(k, s.count);
}

enum class Meet { kNo, kYes, kUnknown };

int64_t FloorDiv(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}

// Whether a piece of `p` and a piece of `q` share a byte. Exact: O(1) when either is one piece
// or both have one stride; otherwise a walk over the pieces inside both bounds, which spends
// `budget` (kUnknown once it runs out).
Meet Meets(const Side& p, const Side& q, size_t* budget) {
  const uintptr_t lo = std::max(p.base, q.base);
  const uintptr_t hi = std::min(p.end(), q.end());
  if (lo >= hi) return Meet::kNo;
  if (p.count == 1 || q.count == 1) {
    const Side& one = p.count == 1 ? p : q;
    const Side& many = p.count == 1 ? q : p;
    const size_t k = FirstEndingAfter(many, one.base);
    return k < many.count && many.base + k * many.stride < one.base + one.bytes ? Meet::kYes
                                                                                  : Meet::kNo;
  }
  if (p.stride == q.stride) {
    // Piece m of q starts d + n * S after piece k of p (n = m - k); they meet when that lies in
    // (-q.bytes, p.bytes). Take the smallest n allowed with d + n * S > -q.bytes.
    const int64_t s = static_cast<int64_t>(p.stride);
    const int64_t d = static_cast<int64_t>(q.base - p.base);
    const int64_t lq = static_cast<int64_t>(q.bytes);
    int64_t n = std::max(FloorDiv(-lq - d, s) + 1, -static_cast<int64_t>(p.count - 1));
    if (n > static_cast<int64_t>(q.count - 1)) return Meet::kNo;
    return d + n * s < static_cast<int64_t>(p.bytes) ? Meet::kYes : Meet::kNo;
  }
  size_t i = FirstEndingAfter(p, lo);
  size_t j = FirstEndingAfter(q, lo);
  while (i < p.count && j < q.count) {
    if (*budget == 0) return Meet::kUnknown;
    --*budget;
    const uintptr_t pa = p.base + i * p.stride;
    const uintptr_t qa = q.base + j * q.stride;
    if (pa >= hi || qa >= hi) return Meet::kNo;
    if (pa + p.bytes <= qa) i = FirstEndingAfter(p, qa);
    else if (qa + q.bytes <= pa) j = FirstEndingAfter(q, pa);
    else return Meet::kYes;
  }
  return Meet::kNo;
}

struct Bound {
  uintptr_t lo;
  uintptr_t hi;
  size_t run;
};

// Sorts by `lo`: nothing when already sorted (ops usually come in address order), else a radix
// sort of the bits in which the `lo`s differ, 11 at a time (several times std::sort's speed on
// the tens of thousands of ops of a copy group).
void SortByLow(std::vector<Bound>* v) {
  auto less = [](const Bound& x, const Bound& y) { return x.lo < y.lo; };
  if (std::is_sorted(v->begin(), v->end(), less)) return;
  if (v->size() < 2048) {
    std::sort(v->begin(), v->end(), less);
    return;
  }
  uintptr_t lo = UINTPTR_MAX;
  uintptr_t hi = 0;
  for (const Bound& b : *v) {
    lo = std::min(lo, b.lo);
    hi = std::max(hi, b.lo);
  }
  const uintptr_t range = hi - lo;
  constexpr unsigned kBits = 11;
  constexpr size_t kBuckets = size_t{1} << kBits;
  std::vector<Bound> tmp(v->size());
  std::vector<size_t> counts(kBuckets);
  for (unsigned shift = 0; shift < 64 && (range >> shift) != 0; shift += kBits) {
    std::fill(counts.begin(), counts.end(), 0);
    for (const Bound& b : *v) counts[((b.lo - lo) >> shift) & (kBuckets - 1)]++;
    size_t at = 0;
    for (size_t& c : counts) {
      const size_t n = c;
      c = at;
      at += n;
    }
    for (const Bound& b : *v) tmp[counts[((b.lo - lo) >> shift) & (kBuckets - 1)]++] = b;
    v->swap(tmp);
  }
}

const Failure kWriteTwice{kErrOverlap, "two ops write the same destination bytes"};
const Failure kReadWritten{kErrOverlap, "an op reads bytes that the batch also writes"};

// Piece by piece: every piece of every run as a span, sorted. Used only when the checks on
// bounds could not decide within their budget.
constexpr size_t kMaxCheckedPieces = size_t{1} << 26;

Failure CheckPieces(const std::vector<StridedRun>& runs) {
  using Span = std::pair<uintptr_t, uintptr_t>;  // [begin, end)
  size_t pieces = 0;
  for (const StridedRun& r : runs) pieces += r.count;
  if (pieces > kMaxCheckedPieces) {
    return Failure{kErrTooLarge, "the batch's strided ops interleave too irregularly to check " +
                                     std::to_string(pieces) + " pieces for overlap"};
  }
  std::vector<Span> dst;
  std::vector<Span> src;
  dst.reserve(pieces);
  src.reserve(pieces);
  for (const StridedRun& r : runs) {
    for (size_t k = 0; k < r.count; k++) {
      const uintptr_t a = reinterpret_cast<uintptr_t>(r.a) + k * r.aStride;
      const uintptr_t b = reinterpret_cast<uintptr_t>(r.b) + k * r.bStride;
      src.emplace_back(a, a + r.bytes);
      dst.emplace_back(b, b + r.bytes);
    }
  }
  std::sort(dst.begin(), dst.end());
  std::sort(src.begin(), src.end());
  for (size_t i = 1; i < dst.size(); i++) {
    if (dst[i].first < dst[i - 1].second) return kWriteTwice;
  }
  // Destinations are sorted and disjoint, so one forward sweep finds any source that meets one.
  size_t d = 0;
  for (const Span& s : src) {
    while (d < dst.size() && dst[d].second <= s.first) d++;
    if (d == dst.size()) break;
    if (dst[d].first < s.second) return kReadWritten;
  }
  return Failure{};
}

// Whether the runs `dst[from, to)` (bounds that overlap in a chain) write disjoint bytes.
Meet ClusterDisjoint(const std::vector<StridedRun>& runs, const std::vector<Bound>& dst,
                     size_t from, size_t to, size_t* budget,
                     std::vector<std::pair<size_t, size_t>>* scratch) {
  // One stride for all, each with several pieces: the pieces of run i cover the residues
  // [base_i mod S, + bytes_i) of every period S, so when those arcs are disjoint around the
  // circle no two pieces can meet (the HND gather: one run per head of a block).
  const size_t stride = DstOf(runs[dst[from].run]).stride;
  bool sameStride = true;
  for (size_t i = from; i < to && sameStride; i++) {
    const Side s = DstOf(runs[dst[i].run]);
    sameStride = s.count > 1 && s.stride == stride;
  }
  if (sameStride) {
    std::vector<std::pair<size_t, size_t>>& arcs = *scratch;  // residue, bytes
    arcs.clear();
    for (size_t i = from; i < to; i++) {
      const Side s = DstOf(runs[dst[i].run]);
      arcs.emplace_back(s.base % stride, s.bytes);
    }
    if (!std::is_sorted(arcs.begin(), arcs.end())) std::sort(arcs.begin(), arcs.end());
    bool apart = arcs.back().first + arcs.back().second <= arcs.front().first + stride;
    for (size_t i = 1; i < arcs.size() && apart; i++) {
      apart = arcs[i - 1].first + arcs[i - 1].second <= arcs[i].first;
    }
    if (apart) return Meet::kNo;
  }
  for (size_t i = from; i < to; i++) {
    for (size_t j = i + 1; j < to && dst[j].lo < dst[i].hi; j++) {
      if (*budget == 0) return Meet::kUnknown;
      --*budget;
      const Meet m = Meets(DstOf(runs[dst[i].run]), DstOf(runs[dst[j].run]), budget);
      if (m != Meet::kNo) return m;
    }
  }
  return Meet::kNo;
}

// Which buffers of `as` share memory with a buffer that `bIndex` names as a destination.
std::vector<bool> ReadHazards(const std::vector<Region>& as, const std::vector<Region>& bs,
                              const std::vector<uint32_t>& bIndex) {
  std::vector<bool> written(bs.size(), false);
  for (uint32_t b : bIndex) written[b] = true;
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;  // written memory, [begin, end)
  for (size_t b = 0; b < bs.size(); b++) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(bs[b].base);
    if (written[b] && bs[b].bytes > 0) spans.emplace_back(base, base + bs[b].bytes);
  }
  std::sort(spans.begin(), spans.end());
  // Merged into disjoint spans, ends increase with beginnings.
  size_t w = 0;
  for (size_t i = 0; i < spans.size(); i++) {
    if (w > 0 && spans[i].first <= spans[w - 1].second) {
      spans[w - 1].second = std::max(spans[w - 1].second, spans[i].second);
    } else {
      spans[w++] = spans[i];
    }
  }
  spans.resize(w);
  std::vector<bool> hazard(as.size(), false);
  for (size_t a = 0; a < as.size(); a++) {
    const uintptr_t lo = reinterpret_cast<uintptr_t>(as[a].base);
    const uintptr_t hi = lo + as[a].bytes;
    // The last written span that begins before `hi` meets the buffer when it ends after `lo`.
    auto it = std::lower_bound(spans.begin(), spans.end(), std::make_pair(hi, uintptr_t{0}));
    hazard[a] = as[a].bytes > 0 && it != spans.begin() && std::prev(it)->second > lo;
  }
  return hazard;
}

// No destination byte written twice, none read: per-op bounds sorted once; pieces compared only
// within chains of overlapping bounds, and a source only with the destinations its bounds meet
// (only sources in buffers that share memory with a written buffer are looked at).
Failure CheckOverlap(const std::vector<StridedRun>& runs, const std::vector<bool>& readHazard,
                     const std::vector<uint32_t>& aIndex) {
  const size_t n = runs.size();
  std::vector<Bound> dst(n);
  std::vector<Bound> src;
  for (size_t i = 0; i < n; i++) {
    const Side b = DstOf(runs[i]);
    dst[i] = Bound{b.base, b.end(), i};
    if (readHazard[aIndex[i]]) {
      const Side a = SrcOf(runs[i]);
      src.push_back(Bound{a.base, a.end(), i});
    }
  }
  SortByLow(&dst);
  SortByLow(&src);
  size_t budget = 4096 + 16 * n;
  // Chains of destinations whose bounds overlap: [first, end) in `dst`, and where they end.
  struct Chain {
    size_t from;
    size_t to;
    uintptr_t hi;
  };
  std::vector<Chain> chains;
  std::vector<std::pair<size_t, size_t>> scratch;
  for (size_t i = 0; i < n;) {
    size_t j = i + 1;
    uintptr_t hi = dst[i].hi;
    while (j < n && dst[j].lo < hi) hi = std::max(hi, dst[j++].hi);
    if (j - i > 1) {
      const Meet m = ClusterDisjoint(runs, dst, i, j, &budget, &scratch);
      if (m == Meet::kYes) return kWriteTwice;
      if (m == Meet::kUnknown) return CheckPieces(runs);
    }
    if (!src.empty()) chains.push_back(Chain{i, j, hi});
    i = j;
  }
  size_t c = 0;
  for (const Bound& s : src) {
    while (c < chains.size() && chains[c].hi <= s.lo) c++;
    for (size_t k = c; k < chains.size() && dst[chains[k].from].lo < s.hi; k++) {
      for (size_t i = chains[k].from; i < chains[k].to; i++) {
        if (budget == 0) return CheckPieces(runs);
        --budget;
        if (dst[i].lo >= s.hi || dst[i].hi <= s.lo) continue;
        const Meet m = Meets(SrcOf(runs[s.run]), DstOf(runs[dst[i].run]), &budget);
        if (m == Meet::kYes) return kReadWritten;
        if (m == Meet::kUnknown) return CheckPieces(runs);
      }
    }
  }
  return Failure{};
}

// Copies pieces [k, k + n) of `r` whole.
void CopyPieces(const StridedRun& r, size_t k, size_t n, bool stream) {
  uint8_t* d = r.b + k * r.bStride;
  const uint8_t* s = r.a + k * r.aStride;
  if (StreamsPieces(d, r.bytes, r.bStride, stream)) {
    StreamPieces(d, s, r.bytes, n, r.bStride, r.aStride);
    return;
  }
  for (size_t i = 0; i < n; i++) std::memcpy(d + i * r.bStride, s + i * r.aStride, r.bytes);
}

// Copies bytes [from, to) of run `r`'s pieces taken in order.
void CopyPart(const StridedRun& r, size_t from, size_t to, bool stream) {
  if (r.count == 1) {
    CopyRun(r.b + from, r.a + from, to - from, stream);
    return;
  }
  size_t k = from / r.bytes;
  const size_t off = from - k * r.bytes;
  if (off != 0) {  // the end of a piece a slice boundary cut
    const size_t n = std::min(r.bytes - off, to - from);
    CopyPiece(r.b + k * r.bStride + off, r.a + k * r.aStride + off, n, stream);
    from += n;
    k++;
  }
  const size_t whole = (to - from) / r.bytes;
  CopyPieces(r, k, whole, stream);
  from += whole * r.bytes;
  k += whole;
  if (from < to) CopyPiece(r.b + k * r.bStride, r.a + k * r.aStride, to - from, stream);
}

}  // namespace

Failure PlanStridedCopies(const std::vector<Region>& as, const std::vector<Region>& bs,
                          const std::vector<double>& ops, size_t width, bool checkOverlap,
                          std::vector<StridedRun>* runs) {
  if (width != kOpWidth && width != kStridedOpWidth) {
    return Failure{kErrInvalidArg, "op width must be 5 or 8, got " + std::to_string(width)};
  }
  if (ops.size() % width != 0) {
    return Failure{kErrBadOp,
                   "ops length " + std::to_string(ops.size()) + " is not a multiple of " +
                       std::to_string(width) +
                       (width == kOpWidth ? " ([aIndex, aOffset, bIndex, bOffset, length] per op)"
                                          : " ([aIndex, aOffset, bIndex, bOffset, length, count, "
                                            "aStride, bStride] per op)")};
  }
  const size_t count = ops.size() / width;
  const size_t first = runs->size();
  runs->reserve(first + count);
  // Buffer indexes of each new run, for the overlap check.
  std::vector<uint32_t> aIndex;
  std::vector<uint32_t> bIndex;
  if (checkOverlap) {
    aIndex.reserve(count);
    bIndex.reserve(count);
  }
  size_t prevA = SIZE_MAX;
  size_t prevB = SIZE_MAX;
  for (size_t i = 0; i < count; i++) {
    size_t v[kStridedOpWidth];
    for (size_t k = 0; k < width; k++) {
      if (!ReadIndex(ops[i * width + k], &v[k])) {
        return OpFailure(kErrBadOp, i,
                         "field " + std::to_string(k) + " must be a non-negative integer");
      }
    }
    if (width == kOpWidth) {
      v[5] = 1;
      v[6] = v[4];
      v[7] = v[4];
    }
    const size_t len = v[4];
    const size_t pieces = v[5];
    if (pieces > 1 && len > 0 && (v[6] < len || v[7] < len)) {
      return OpFailure(kErrBadOp, i,
                       std::string(v[6] < len ? "source" : "destination") + " stride " +
                           std::to_string(v[6] < len ? v[6] : v[7]) + " is below the length " +
                           std::to_string(len) + " (its pieces would overlap)");
    }
    if (!Fits(as, v[0], v[1], len, pieces, v[6]) || !Fits(bs, v[2], v[3], len, pieces, v[7])) {
      uint8_t* unused = nullptr;
      Failure f = CheckRange(as, i, "source", v[0], v[1], len, pieces, v[6], &unused);
      if (!f.failed()) f = CheckRange(bs, i, "destination", v[2], v[3], len, pieces, v[7], &unused);
      return f;
    }
    uint8_t* a = as[v[0]].base + v[1];
    uint8_t* b = bs[v[2]].base + v[3];
    if (len == 0 || pieces == 0) continue;
    // Pieces that continue each other on both sides are one contiguous copy (bounded by its
    // buffer, so the product does not overflow).
    if (pieces == 1 || (v[6] == len && v[7] == len)) {
      const size_t bytes = len * pieces;
      if (!runs->empty() && v[0] == prevA && v[2] == prevB) {
        StridedRun& last = runs->back();
        if (last.count == 1 && last.a + last.bytes == a && last.b + last.bytes == b) {
          last.bytes += bytes;
          continue;
        }
      }
      runs->push_back(StridedRun{a, b, bytes, 1, bytes, bytes});
    } else {
      runs->push_back(StridedRun{a, b, len, pieces, v[6], v[7]});
    }
    if (checkOverlap) {
      aIndex.push_back(static_cast<uint32_t>(v[0]));
      bIndex.push_back(static_cast<uint32_t>(v[2]));
    }
    prevA = v[0];
    prevB = v[2];
  }
  if (!checkOverlap) return Failure{};
  if (first != 0) return Failure{kErrInternal, "overlap is checked only for a whole batch"};
  return CheckOverlap(*runs, ReadHazards(as, bs, bIndex), aIndex);
}

Failure PlanCopies(const std::vector<Region>& as, const std::vector<Region>& bs,
                   const std::vector<double>& ops, bool checkOverlap, std::vector<Run>* runs) {
  std::vector<StridedRun> planned;
  const Failure f = PlanStridedCopies(as, bs, ops, kOpWidth, checkOverlap, &planned);
  if (f.failed()) return f;
  // Plain ops plan to contiguous runs only.
  runs->reserve(runs->size() + planned.size());
  for (const StridedRun& r : planned) runs->push_back(Run{r.a, r.b, r.bytes});
  return Failure{};
}

void ExecuteHostRuns(const std::vector<StridedRun>& runs, size_t maxThreads) {
  size_t total = 0;
  for (const StridedRun& r : runs) total += r.bytes * r.count;
  const size_t threads =
      std::max<size_t>(1, std::min(maxThreads, total / kMinBytesPerThread));
  const bool stream = total >= kStreamMinBytes;
  if (threads == 1) {
    for (const StridedRun& r : runs) CopyPart(r, 0, r.bytes * r.count, stream);
    StreamFence(stream);
    return;
  }
  // starts[i] is the offset of run i in the concatenated bytes of all runs.
  std::vector<size_t> starts(runs.size());
  size_t pos = 0;
  for (size_t i = 0; i < runs.size(); i++) {
    starts[i] = pos;
    pos += runs[i].bytes * runs[i].count;
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
        const StridedRun& r = runs[i];
        const size_t from = begin - starts[i];
        const size_t to = std::min(r.bytes * r.count, end - starts[i]);
        CopyPart(r, from, to, stream);
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
