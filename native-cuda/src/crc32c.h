// CRC-32C (Castagnoli): the payload checksum of stored chunk format version 2
// (docs/storage-format.md). SSE4.2's crc32 instruction where the CPU has it, a table otherwise;
// both give the same value (src/util/crc32c.ts computes it in JavaScript when the addon is absent).
#pragma once

#include <napi.h>

#include <cstddef>
#include <cstdint>

namespace kvtier {

// Standard CRC-32C of `bytes` bytes continuing from `crc` (0 to start; pass the previous result
// to continue over a split buffer). CRC-32C("123456789") = 0xE3069283.
uint32_t Crc32c(uint32_t crc, const uint8_t* data, size_t bytes);

// The CRC-32C of A followed by B, from crcA = Crc32c(0, A), crcB = Crc32c(0, B) and B's length.
uint32_t Crc32cCombine(uint32_t crcA, uint32_t crcB, size_t bytesB);

// True when Crc32c uses the CPU instruction (reported by probe()).
bool Crc32cHardware();

// crc32c(buffer, crc) -> number: on the calling thread (small buffers).
Napi::Value Crc32cSync(const Napi::CallbackInfo& info);

// crc32cAsync(buffer, crc) -> Promise<number>: on the libuv pool; the buffer is kept alive.
Napi::Value Crc32cAsync(const Napi::CallbackInfo& info);

// copyCrc32cAsync(src, dst, dstOffset) -> Promise<number>: on the libuv pool, copies `src` into
// `dst` at `dstOffset` and returns the CRC-32C of the copied bytes, in one pass. Both buffers are
// kept alive; overlapping buffers are refused.
Napi::Value CopyCrc32cAsync(const Napi::CallbackInfo& info);

// preadCrc32cAsync(fd, dst, position, crcFrom) -> Promise<number>: on the libuv pool, fills
// `dst` from file `fd` at byte `position` (pread, continued over short reads) and returns the
// CRC-32C of dst[crcFrom..], in one pass. Rejects with ERR_SHORT_READ when the file ends first.
Napi::Value PreadCrc32cAsync(const Napi::CallbackInfo& info);

}  // namespace kvtier
