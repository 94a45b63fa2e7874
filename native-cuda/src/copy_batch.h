// The host copy engine: batched memcpy between ArrayBuffers, off the JS thread.
#pragma once

#include <napi.h>

namespace kvtier {

// copyBatch(buffers, ops: Float64Array, maxThreads) -> Promise<number of coalesced copies>
Napi::Value CopyBatch(const Napi::CallbackInfo& info);

// copyBatchStrided(buffers, ops: Float64Array of 8-tuples, maxThreads) -> Promise<number of
// copies after coalescing>: CopyBatch with ops [aIndex, aOffset, bIndex, bOffset, length,
// count, aStride, bStride].
Napi::Value CopyBatchStrided(const Napi::CallbackInfo& info);

}  // namespace kvtier
