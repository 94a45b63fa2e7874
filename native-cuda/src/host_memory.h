// Host memory handed to JS as external ArrayBuffers: page-aligned slabs and shared file mappings.
#pragma once

#include <napi.h>

namespace kvtier {

// allocSlab(bytes) -> ArrayBuffer
Napi::Value AllocSlab(const Napi::CallbackInfo& info);
// mapFile(path, offset, length, writable) -> ArrayBuffer; length 0 maps to the end of the file.
Napi::Value MapFile(const Napi::CallbackInfo& info);
// addressOf(buffer | view) -> bigint address of its first byte.
Napi::Value AddressOf(const Napi::CallbackInfo& info);
// The system page size in bytes.
size_t PageBytes();

// The bytes of an ArrayBuffer, typed array or DataView; false when `value` is none of them.
bool BytesOf(const Napi::Value& value, uint8_t** data, size_t* bytes);

}  // namespace kvtier
