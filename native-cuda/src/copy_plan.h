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

// Number of doubles per op: [aIndex, aOffset, bIndex, bOffset, length].
inline constexpr size_t kOpWidth = 5;

// Validates every op of `ops` against `as` and `bs` (all of them, before anything is copied) and
// appends the coalesced runs to `runs`. Zero-length ops are validated and then dropped. When
// `checkOverlap` is set, side B is the destination and no destination byte may be written twice
// or also be read by the batch, so runs can execute in any order and in parallel.
Failure PlanCopies(const std::vector<Region>& as, const std::vector<Region>& bs,
                   const std::vector<double>& ops, bool checkOverlap, std::vector<Run>* runs);

// Copies each run's A bytes to its B bytes, splitting large batches over up to `maxThreads`
// threads (the calling thread included).
void ExecuteHostRuns(const std::vector<Run>& runs, size_t maxThreads);

}  // namespace kvtier
