// Pre-faulting host memory on the libuv pool, without touching its contents.
#pragma once

#include <napi.h>

namespace kvtier {

// prefaultAsync(buffer | view) -> Promise<number>: commits every whole system page the bytes
// cover, writable, with madvise(MADV_POPULATE_WRITE); contents are left as they are (pages
// already present are untouched, missing ones come in zero filled as a first write would bring
// them). Resolves with the bytes covered, or -1 when the kernel lacks MADV_POPULATE_WRITE
// (Linux < 5.14: EINVAL or ENOSYS). Rejects with the errno name (ENOMEM, EFAULT, ...) otherwise.
Napi::Value PrefaultAsync(const Napi::CallbackInfo& info);

}  // namespace kvtier
