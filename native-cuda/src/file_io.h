// Whole-object file operations for the file tiers, each one task on the libuv pool instead of
// one round trip per system call: listing sizes of many files, reading an object and checksumming
// it as it is read, and writing an object atomically with its checksum computed as it is written.
#pragma once

#include <napi.h>

namespace kvtier {

// statFilesAsync(dir, names) -> Promise<Float64Array>: for each name, [size, mtimeMs, isFile]
// (lstat in `dir`); size -1 when the file is gone.
Napi::Value StatFilesAsync(const Napi::CallbackInfo& info);

// readFileCrc32cAsync(path, dst, maxBytes, crcFrom) -> Promise<{status, size, crc, mtimeMs}>:
// opens `path`, and when its size is exactly dst's length reads the whole file into `dst` and
// returns the CRC-32C of dst[crcFrom..] (each 256 KiB slice checksummed by the reading thread
// right after it is read). status 0: read; 1: no such file; 2: the file's size is not dst's
// length (`size` says what it is, nothing read); 3: larger than maxBytes; 4: the file ended
// before dst was full (cut short while read).
Napi::Value ReadFileCrc32cAsync(const Napi::CallbackInfo& info);

// writeFileAtomicAsync(tempPath, finalPath, header, payload, fsync, makeDirs, checksumAt,
// headerCrcAt) -> Promise<number>: creates `tempPath` (exclusive; when the first create finds no
// directory, the directories `makeDirs` names are created in order and it is tried again), writes
// `payload` after the header in pieces that end on 2 MiB file offsets, each checksummed (CRC-32C)
// right before it is written, stores their CRC-32C as a u64le at header[checksumAt] and the CRC-32
// (IEEE) of header[0..headerCrcAt) at header[headerCrcAt] (in a copy: `header` is not changed),
// writes the header, fdatasyncs when fsync >= 1, closes, renames to `finalPath` and fsyncs its
// directory when fsync == 2. The temp file is removed on failure. Resolves with the bytes written.
Napi::Value WriteFileAtomicAsync(const Napi::CallbackInfo& info);

}  // namespace kvtier
