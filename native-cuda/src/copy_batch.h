// The host copy engine: batched memcpy between ArrayBuffers, off the JS thread.
#pragma once

#include <napi.h>

namespace kvtier {

// copyBatch(buffers, ops: Float64Array, maxThreads) -> Promise<number of coalesced copies>
Napi::Value CopyBatch(const Napi::CallbackInfo& info);

}  // namespace kvtier
