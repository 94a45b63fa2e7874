#include "crc32c.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "errors.h"
#include "host_memory.h"
#include "promise_worker.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#include <nmmintrin.h>
#define KVTIER_CRC32C_X86 1
#endif

namespace kvtier {
namespace {

// Reflected Castagnoli polynomial.
constexpr uint32_t kPoly = 0x82f63b78u;

// Slice-by-8 tables: table[0] is the classic byte table; table[k][b] advances it by k bytes.
struct Tables {
  uint32_t t[8][256];
  // x2n[k] = x^(2^k) mod P, for shifting a CRC over zeros (combining parts).
  uint32_t x2n[32];
};

uint32_t MultModP(uint32_t a, uint32_t b) {
  uint32_t m = 1u << 31;
  uint32_t p = 0;
  for (;;) {
    if (a & m) {
      p ^= b;
      if ((a & (m - 1)) == 0) break;
    }
    m >>= 1;
    b = (b & 1) ? (b >> 1) ^ kPoly : b >> 1;
  }
  return p;
}

Tables MakeTables() {
  Tables tb{};
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    tb.t[0][i] = c;
  }
  for (uint32_t i = 0; i < 256; i++) {
    for (int k = 1; k < 8; k++) tb.t[k][i] = (tb.t[k - 1][i] >> 8) ^ tb.t[0][tb.t[k - 1][i] & 0xff];
  }
  uint32_t p = 1u << 30;  // x^1
  for (int k = 0; k < 32; k++) {
    tb.x2n[k] = p;
    p = MultModP(p, p);
  }
  return tb;
}

const Tables& T() {
  static const Tables tables = MakeTables();
  return tables;
}

// The raw register advanced over `bytes` zero bytes: crc * x^(8*bytes) mod P.
uint32_t ShiftZeros(uint32_t crc, size_t bytes) {
  const Tables& tb = T();
  uint32_t p = 1u << 31;  // x^0
  unsigned k = 3;         // 8 bits per byte
  for (uint64_t n = bytes; n != 0; n >>= 1, k++) {
    if (n & 1) p = MultModP(tb.x2n[k & 31], p);
  }
  return MultModP(p, crc);
}

// Raw (not inverted) register update with the tables.
uint32_t RawTable(uint32_t crc, const uint8_t* p, size_t n) {
  const Tables& tb = T();
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    w ^= crc;  // little-endian hosts only (every target the addon builds for)
    crc = tb.t[7][w & 0xff] ^ tb.t[6][(w >> 8) & 0xff] ^ tb.t[5][(w >> 16) & 0xff] ^
          tb.t[4][(w >> 24) & 0xff] ^ tb.t[3][(w >> 32) & 0xff] ^ tb.t[2][(w >> 40) & 0xff] ^
          tb.t[1][(w >> 48) & 0xff] ^ tb.t[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) crc = (crc >> 8) ^ tb.t[0][(crc ^ *p++) & 0xff];
  return crc;
}

#ifdef KVTIER_CRC32C_X86
__attribute__((target("sse4.2"))) uint32_t RawHwOne(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c = _mm_crc32_u64(c, w);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

// Three independent chains over three thirds of the buffer hide the instruction's 3-cycle
// latency (one crc32 per cycle instead of one per three); the thirds are then combined.
__attribute__((target("sse4.2"))) uint32_t RawHw(uint32_t crc, const uint8_t* p, size_t n) {
  constexpr size_t kMinSplit = 3 * 1024;
  if (n < kMinSplit) return RawHwOne(crc, p, n);
  const size_t part = (n / 24) * 8;
  const uint8_t* a = p;
  const uint8_t* b = p + part;
  const uint8_t* c = p + 2 * part;
  uint64_t ca = crc, cb = 0, cc = 0;
  for (size_t i = 0; i < part; i += 8) {
    uint64_t wa, wb, wc;
    std::memcpy(&wa, a + i, 8);
    std::memcpy(&wb, b + i, 8);
    std::memcpy(&wc, c + i, 8);
    ca = _mm_crc32_u64(ca, wa);
    cb = _mm_crc32_u64(cb, wb);
    cc = _mm_crc32_u64(cc, wc);
  }
  uint32_t r = ShiftZeros(static_cast<uint32_t>(ca), part) ^ static_cast<uint32_t>(cb);
  r = ShiftZeros(r, part) ^ static_cast<uint32_t>(cc);
  return RawHwOne(r, p + 3 * part, n - 3 * part);
}

// Folding with carry-less multiplication (AVX-512 VPCLMULQDQ): four 512-bit accumulators, each
// 64-byte block of data folded into the accumulator 256 bytes before it, two multiplications per
// 64 bytes instead of eight dependent crc32 instructions; about twice the three-chain crc32 rate.
//
// A 128-bit lane holds 16 message bytes in the reflected convention: bit t of the lane stands for
// x^(127 - t), so the lane is LO * x^64 + HI (LO its low qword, HI its high one). Moving a lane
// D bytes further down the message multiplies it by x^(8D); modulo P that is
// LO * (x^(8D+64) mod P) + HI * (x^(8D) mod P), a product under 96 bits, XORed into the lane D
// bytes on. A carry-less multiply of two reflected qwords yields their product times x, so the
// constants are x^(8D+63) and x^(8D-1) mod P. The starting register is XORed into the first four
// bytes (a CRC is linear in its initial value), and the last lane is reduced by running the crc32
// instruction over its 16 bytes from a zero register.
struct FoldConstants {
  uint64_t lo;  // x^(8D+63) mod P, reflected into the upper half of a qword
  uint64_t hi;  // x^(8D-1) mod P, likewise
};

// x^e mod P as a reflected qword: the coefficient of x^i at bit 63 - i.
uint64_t ReflectedXPowMod(unsigned e) {
  constexpr uint32_t kPolyNormal = 0x1edc6f41u;  // P without x^32, bit i = coefficient of x^i
  uint32_t r = 1;
  for (unsigned i = 0; i < e; i++) r = (r & 0x80000000u) ? (r << 1) ^ kPolyNormal : r << 1;
  uint64_t out = 0;
  for (int i = 0; i < 32; i++) {
    if ((r >> i) & 1) out |= uint64_t{1} << (63 - i);
  }
  return out;
}

FoldConstants FoldBy(unsigned bytes) {
  return {ReflectedXPowMod(8 * bytes + 63), ReflectedXPowMod(8 * bytes - 1)};
}

// Buffers shorter than this go to the crc32 chains (set-up and the final reduction dominate).
constexpr size_t kFoldMinBytes = 512;

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) inline __m512i Fold512(
    __m512i acc, __m512i k, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(acc, k, 0x00),
                                   _mm512_clmulepi64_epi128(acc, k, 0x11), next, 0x96);
}

__attribute__((target("avx512f"))) inline __m512i Broadcast(FoldConstants k) {
  const auto lo = static_cast<long long>(k.lo);
  const auto hi = static_cast<long long>(k.hi);
  return _mm512_set_epi64(hi, lo, hi, lo, hi, lo, hi, lo);
}

__attribute__((target("pclmul,sse4.2"))) inline __m128i Fold128(__m128i acc, FoldConstants k,
                                                               __m128i next) {
  const __m128i kk = _mm_set_epi64x(static_cast<long long>(k.hi), static_cast<long long>(k.lo));
  return _mm_xor_si128(
      _mm_xor_si128(_mm_clmulepi64_si128(acc, kk, 0x00), _mm_clmulepi64_si128(acc, kk, 0x11)),
      next);
}

// Folds four accumulators into one, goes on over the rest of the buffer (under 256 bytes) and
// reduces to a raw register.
__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) uint32_t FoldFinish(
    __m512i x0, __m512i x1, __m512i x2, __m512i x3, const uint8_t* p, size_t n) {
  static const FoldConstants k64 = FoldBy(64), k48 = FoldBy(48), k32 = FoldBy(32),
                             k16 = FoldBy(16);
  const __m512i f64 = Broadcast(k64);
  x1 = Fold512(x0, f64, x1);
  x2 = Fold512(x1, f64, x2);
  x3 = Fold512(x2, f64, x3);
  while (n >= 64) {
    x3 = Fold512(x3, f64, _mm512_loadu_si512(p));
    p += 64;
    n -= 64;
  }
  alignas(64) __m128i lane[4];
  _mm512_store_si512(lane, x3);
  __m128i acc = Fold128(lane[0], k48, lane[3]);
  acc = Fold128(lane[1], k32, acc);
  acc = Fold128(lane[2], k16, acc);
  while (n >= 16) {
    acc = Fold128(acc, k16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    p += 16;
    n -= 16;
  }
  uint64_t c = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(acc)));
  c = _mm_crc32_u64(c, static_cast<uint64_t>(_mm_extract_epi64(acc, 1)));
  return RawHwOne(static_cast<uint32_t>(c), p, n);
}

// The first 256 bytes in four accumulators, the starting register XORed into the first four.
#define KVTIER_FOLD_LOAD(p, crc)                                                           \
  __m512i x0 = _mm512_xor_si512(_mm512_loadu_si512(p),                                    \
                                _mm512_castsi128_si512(_mm_cvtsi32_si128(                 \
                                    static_cast<int>(crc))));                              \
  __m512i x1 = _mm512_loadu_si512((p) + 64);                                               \
  __m512i x2 = _mm512_loadu_si512((p) + 128);                                              \
  __m512i x3 = _mm512_loadu_si512((p) + 192)

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) uint32_t RawFold(uint32_t crc,
                                                                             const uint8_t* p,
                                                                             size_t n) {
  static const FoldConstants k256 = FoldBy(256);
  KVTIER_FOLD_LOAD(p, crc);
  p += 256;
  n -= 256;
  const __m512i f256 = Broadcast(k256);
  while (n >= 256) {
    x0 = Fold512(x0, f256, _mm512_loadu_si512(p));
    x1 = Fold512(x1, f256, _mm512_loadu_si512(p + 64));
    x2 = Fold512(x2, f256, _mm512_loadu_si512(p + 128));
    x3 = Fold512(x3, f256, _mm512_loadu_si512(p + 192));
    p += 256;
    n -= 256;
  }
  return FoldFinish(x0, x1, x2, x3, p, n);
}

// Folding and the crc32 instruction at once: the carry-less multiplier and the crc32 unit are
// separate, so while the folding loop takes 256 bytes per step from the front of the buffer,
// three crc32 chains take 40 bytes each from three stretches after it (about 85 GB/s on one core
// from the cache against 65 for folding alone). The four parts are then joined, in order, by
// shifting each raw register over the bytes after it and XORing the next part's in; the few
// bytes left over are folded on.
constexpr size_t kHybridFoldBytes = 256;
constexpr size_t kHybridChainBytes = 40;
constexpr size_t kHybridStepBytes = kHybridFoldBytes + 3 * kHybridChainBytes;
constexpr size_t kHybridMinBytes = 16u << 10;
// Above this a buffer is more likely to come from memory than from the cache, where folding
// alone measured faster (four streams at once: 25-28 GB/s against 35-37 for a 32 MiB buffer).
// The file tiers checksum 256 KiB slices right after reading them.
constexpr size_t kHybridMaxBytes = 1u << 20;

// r * k * x^33 mod P for raw registers r and k: their carry-less product is a 64-bit message
// (the product of two reflected operands comes out times x) that the crc32 instruction reduces
// (times x^32).
__attribute__((target("pclmul,sse4.2"))) inline uint32_t MulX33(uint32_t r, uint32_t k) {
  const __m128i prod = _mm_clmulepi64_si128(_mm_cvtsi32_si128(static_cast<int>(r)),
                                            _mm_cvtsi32_si128(static_cast<int>(k)), 0x00);
  return static_cast<uint32_t>(_mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(prod))));
}

// x^e mod P as a raw register (the coefficient of x^i at bit 31 - i).
uint32_t XPowModP(uint64_t e) {
  const Tables& tb = T();
  uint32_t p = 1u << 31;  // x^0
  for (unsigned k = 0; e != 0; e >>= 1, k++) {
    if (e & 1) p = MultModP(tb.x2n[k & 31], p);
  }
  return p;
}

// The k with MulX33(r, k) == r * x^(8 * bytes) mod P, for `bytes` a positive multiple of 8:
// x^(8 * bytes - 33), built from x^(8 * 2^j - 33) for the bits j of `bytes`.
__attribute__((target("pclmul,sse4.2"))) uint32_t ShiftConstant(size_t bytes) {
  static const auto table = [] {
    std::vector<uint32_t> t(64, 0);
    for (unsigned j = 3; j < 40; j++) t[j] = XPowModP((uint64_t{8} << j) - 33);
    return t;
  }();
  uint32_t k = 0;
  bool first = true;
  for (unsigned j = 3; bytes >> j != 0; j++) {
    if (((bytes >> j) & 1) == 0) continue;
    k = first ? table[j] : MulX33(k, table[j]);
    first = false;
  }
  return k;
}

// `steps` steps of the folding loop and the chains over p[0, steps * kHybridStepBytes); `shift`
// is ShiftConstant(steps * kHybridChainBytes).
__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) uint32_t HybridSteps(
    uint32_t crc, const uint8_t* p, size_t steps, uint32_t shift) {
  static const FoldConstants k256 = FoldBy(kHybridFoldBytes);
  const size_t chain = kHybridChainBytes * steps;
  const uint8_t* s0 = p + kHybridFoldBytes * steps;
  const uint8_t* s1 = s0 + chain;
  const uint8_t* s2 = s1 + chain;
  KVTIER_FOLD_LOAD(p, crc);
  const __m512i f256 = Broadcast(k256);
  uint64_t c0 = 0, c1 = 0, c2 = 0;
  for (size_t i = 0; i < steps; i++) {
    if (i > 0) {
      const uint8_t* q = p + kHybridFoldBytes * i;
      x0 = Fold512(x0, f256, _mm512_loadu_si512(q));
      x1 = Fold512(x1, f256, _mm512_loadu_si512(q + 64));
      x2 = Fold512(x2, f256, _mm512_loadu_si512(q + 128));
      x3 = Fold512(x3, f256, _mm512_loadu_si512(q + 192));
    }
    const size_t at = kHybridChainBytes * i;
    for (size_t b = 0; b < kHybridChainBytes; b += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, s0 + at + b, 8);
      std::memcpy(&w1, s1 + at + b, 8);
      std::memcpy(&w2, s2 + at + b, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
  }
  uint32_t r = FoldFinish(x0, x1, x2, x3, p, 0);
  r = MulX33(r, shift) ^ static_cast<uint32_t>(c0);
  r = MulX33(r, shift) ^ static_cast<uint32_t>(c1);
  return MulX33(r, shift) ^ static_cast<uint32_t>(c2);
}

__attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2"))) uint32_t RawHybrid(uint32_t crc,
                                                                               const uint8_t* p,
                                                                               size_t n) {
  const size_t steps = n / kHybridStepBytes;
  crc = HybridSteps(crc, p, steps, ShiftConstant(steps * kHybridChainBytes));
  p += steps * kHybridStepBytes;
  n -= steps * kHybridStepBytes;
  return n >= kFoldMinBytes ? RawFold(crc, p, n) : RawHwOne(crc, p, n);
}

#undef KVTIER_FOLD_LOAD

bool EnvSet(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// KVTIER_CRC32C_SOFTWARE=1 forces the table, KVTIER_CRC32C_NO_FOLD=1 the crc32 chains (tests
// compare every path on one machine).
bool DetectHw() { return !EnvSet("KVTIER_CRC32C_SOFTWARE") && __builtin_cpu_supports("sse4.2"); }

bool DetectFold() {
  return DetectHw() && !EnvSet("KVTIER_CRC32C_NO_FOLD") && __builtin_cpu_supports("pclmul") &&
         __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("vpclmulqdq");
}
#else
uint32_t RawHw(uint32_t crc, const uint8_t* p, size_t n) { return RawTable(crc, p, n); }
uint32_t RawFold(uint32_t crc, const uint8_t* p, size_t n) { return RawTable(crc, p, n); }
uint32_t RawHybrid(uint32_t crc, const uint8_t* p, size_t n) { return RawTable(crc, p, n); }
constexpr size_t kFoldMinBytes = 0;
constexpr size_t kHybridMinBytes = 0;
constexpr size_t kHybridMaxBytes = 0;
bool DetectHw() { return false; }
bool DetectFold() { return false; }
#endif

const bool kHw = DetectHw();
const bool kFold = DetectFold();

class Crc32cWorker : public PromiseWorker {
 public:
  Crc32cWorker(Napi::Env env, const uint8_t* data, size_t bytes, uint32_t crc)
      : PromiseWorker(env, "kvtier.crc32c"), data_(data), bytes_(bytes), crc_(crc) {}

 protected:
  void Work() override { result_ = Crc32c(crc_, data_, bytes_); }

 private:
  const uint8_t* data_;
  size_t bytes_;
  uint32_t crc_;
};

// Copies in blocks small enough to stay in the core's cache and checksums each block right after
// copying it, from the destination: one pass over main memory instead of two, and the checksum
// covers the bytes as written.
constexpr size_t kCopyCrcBlockBytes = 256u << 10;

class CopyCrc32cWorker : public PromiseWorker {
 public:
  CopyCrc32cWorker(Napi::Env env, const uint8_t* src, uint8_t* dst, size_t bytes)
      : PromiseWorker(env, "kvtier.copyCrc32c"), src_(src), dst_(dst), bytes_(bytes) {}

 protected:
  void Work() override {
    uint32_t crc = 0;
    for (size_t off = 0; off < bytes_; off += kCopyCrcBlockBytes) {
      const size_t n = std::min(kCopyCrcBlockBytes, bytes_ - off);
      std::memcpy(dst_ + off, src_ + off, n);
      crc = Crc32c(crc, dst_ + off, n);
    }
    result_ = crc;
  }

 private:
  const uint8_t* src_;
  uint8_t* dst_;
  size_t bytes_;
};

// Reads a file into a buffer block by block and checksums each block right after reading it,
// while it is in cache: one pass over the bytes instead of a read and then a checksum pass.
class PreadCrc32cWorker : public PromiseWorker {
 public:
  PreadCrc32cWorker(Napi::Env env, int fd, uint8_t* dst, size_t bytes, int64_t position,
                    size_t crcFrom)
      : PromiseWorker(env, "kvtier.preadCrc32c"),
        fd_(fd),
        dst_(dst),
        bytes_(bytes),
        position_(position),
        crcFrom_(crcFrom) {}

 protected:
  void Work() override {
    uint32_t crc = 0;
    size_t done = 0;
    while (done < bytes_) {
      const size_t want = std::min(kCopyCrcBlockBytes, bytes_ - done);
      const ssize_t got = pread(fd_, dst_ + done, want, position_ + static_cast<int64_t>(done));
      if (got < 0) {
        if (errno == EINTR) continue;
        failure_ = Failure{"EIO", std::string("pread failed: ") + std::strerror(errno)};
        return;
      }
      if (got == 0) {
        failure_ = Failure{kErrShortRead, "the file ended before the buffer was filled"};
        return;
      }
      const size_t end = done + static_cast<size_t>(got);
      if (end > crcFrom_) {
        const size_t from = std::max(done, crcFrom_);
        crc = Crc32c(crc, dst_ + from, end - from);
      }
      done = end;
    }
    result_ = crc;
  }

 private:
  int fd_;
  uint8_t* dst_;
  size_t bytes_;
  int64_t position_;
  size_t crcFrom_;
};

void Args(const Napi::CallbackInfo& info, uint8_t** data, size_t* bytes, uint32_t* crc) {
  Napi::Env env = info.Env();
  if (!BytesOf(info[0], data, bytes)) {
    Throw(env, kErrInvalidArg, "crc32c expects an ArrayBuffer or a view of one");
  }
  const size_t c = ToSize(env, info[1], "crc");
  if (c > 0xffffffffu) Throw(env, kErrInvalidArg, "crc must be a u32");
  *crc = static_cast<uint32_t>(c);
}

}  // namespace

uint32_t Crc32c(uint32_t crc, const uint8_t* data, size_t bytes) {
  const uint32_t raw = ~crc;
  if (kFold && bytes >= kHybridMinBytes && bytes <= kHybridMaxBytes) {
    return ~RawHybrid(raw, data, bytes);
  }
  if (kFold && bytes >= kFoldMinBytes) return ~RawFold(raw, data, bytes);
  return ~(kHw ? RawHw(raw, data, bytes) : RawTable(raw, data, bytes));
}

uint32_t Crc32cCombine(uint32_t crcA, uint32_t crcB, size_t bytesB) {
  return ShiftZeros(crcA, bytesB) ^ crcB;
}

bool Crc32cHardware() { return kHw; }

Napi::Value Crc32cSync(const Napi::CallbackInfo& info) {
  uint8_t* data;
  size_t bytes;
  uint32_t crc;
  Args(info, &data, &bytes, &crc);
  return Napi::Number::New(info.Env(), Crc32c(crc, data, bytes));
}

Napi::Value Crc32cAsync(const Napi::CallbackInfo& info) {
  uint8_t* data;
  size_t bytes;
  uint32_t crc;
  Args(info, &data, &bytes, &crc);
  auto* worker = new Crc32cWorker(info.Env(), data, bytes, crc);
  worker->Keep(info[0]);
  worker->Queue();
  return worker->Promise();
}

Napi::Value CopyCrc32cAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint8_t* src;
  size_t srcBytes;
  uint8_t* dst;
  size_t dstBytes;
  if (!BytesOf(info[0], &src, &srcBytes) || !BytesOf(info[1], &dst, &dstBytes)) {
    Throw(env, kErrInvalidArg, "copyCrc32c expects ArrayBuffers or views of them");
  }
  const size_t offset = ToSize(env, info[2], "dstOffset");
  if (offset > dstBytes || srcBytes > dstBytes - offset) {
    Throw(env, kErrInvalidArg, "the source does not fit in the destination at dstOffset");
  }
  uint8_t* to = dst + offset;
  if (srcBytes > 0 && to < src + srcBytes && src < to + srcBytes) {
    Throw(env, kErrInvalidArg, "source and destination overlap");
  }
  auto* worker = new CopyCrc32cWorker(env, src, to, srcBytes);
  worker->Keep(info[0]);
  worker->Keep(info[1]);
  worker->Queue();
  return worker->Promise();
}

Napi::Value PreadCrc32cAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t fd = ToSize(env, info[0], "fd");
  if (fd > 0x7fffffff) Throw(env, kErrInvalidArg, "fd must be a file descriptor");
  uint8_t* dst;
  size_t bytes;
  if (!BytesOf(info[1], &dst, &bytes)) {
    Throw(env, kErrInvalidArg, "preadCrc32c expects an ArrayBuffer or a view of one");
  }
  const size_t position = ToSize(env, info[2], "position");
  const size_t crcFrom = ToSize(env, info[3], "crcFrom");
  auto* worker = new PreadCrc32cWorker(env, static_cast<int>(fd), dst, bytes,
                                       static_cast<int64_t>(position), crcFrom);
  worker->Keep(info[1]);
  worker->Queue();
  return worker->Promise();
}

}  // namespace kvtier
