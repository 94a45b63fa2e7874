// Validation and coalescing of copy batches, shared by the host and CUDA copy engines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "errors.h"

namespace kvtier {

// One buffer a batch may touch: its first byte and its length.
struct Region {
  uint8_t* base;
  size_t bytes;
};

// One contiguous copy after coalescing, between side A and side B of an op.
struct Run {
  uint8_t* a;
  uint8_t* b;
  size_t bytes;
};

// One copy after coalescing, of `count` pieces of `bytes` each: piece k copies the bytes at
// a + k * aStride to b + k * bStride. A contiguous copy has count 1 (its strides unused); the
// pieces of one side never overlap each other (stride >= bytes).
struct StridedRun {
  uint8_t* a;
  uint8_t* b;
  size_t bytes;
  size_t count;
  size_t aStride;
  size_t bStride;
};

// Number of doubles per op: [aIndex, aOffset, bIndex, bOffset, length].
inline constexpr size_t kOpWidth = 5;
// Number of doubles per strided op: [aIndex, aOffset, bIndex, bOffset, length, count, aStride,
// bStride]: `count` pieces of `length` bytes, each side advancing by its stride.
inline constexpr size_t kStridedOpWidth = 8;

// Validates every op of `ops` against `as` and `bs` (all of them, before anything is copied) and
// appends the coalesced runs to `runs`. Zero-length ops are validated and then dropped. When
// `checkOverlap` is set, side B is the destination and no destination byte may be written twice
// or also be read by the batch, so runs can execute in any order and in parallel.
Failure PlanCopies(const std::vector<Region>& as, const std::vector<Region>& bs,
                   const std::vector<double>& ops, bool checkOverlap, std::vector<Run>* runs);

// PlanCopies for ops of `width` doubles (kOpWidth or kStridedOpWidth). A strided op of count 0
// or length 0 is validated (its indexes, and its offsets within their buffers) and dropped; with
// count > 1 each stride must be >= length (ERR_BAD_OP), and its last piece must end inside its
// buffer (ERR_OUT_OF_RANGE). A strided op whose pieces are contiguous on both sides becomes a
// contiguous run, and contiguous runs that continue each other are merged as PlanCopies does.
// The overlap check is exact: per-op bounds first, piece-level arithmetic only where bounds meet.
Failure PlanStridedCopies(const std::vector<Region>& as, const std::vector<Region>& bs,
                          const std::vector<double>& ops, size_t width, bool checkOverlap,
                          std::vector<StridedRun>* runs);

// Copies each run's A bytes to its B bytes, splitting large batches over up to `maxThreads`
// threads (the calling thread included).
void ExecuteHostRuns(const std::vector<StridedRun>& runs, size_t maxThreads);

}  // namespace kvtier
