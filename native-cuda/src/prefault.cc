#include "prefault.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "errors.h"
#include "host_memory.h"
#include "promise_worker.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it, the kernel decides.
#endif

namespace kvtier {
namespace {

class PrefaultWorker : public PromiseWorker {
 public:
  PrefaultWorker(Napi::Env env, uint8_t* data, size_t bytes)
      : PromiseWorker(env, "kvtier.prefault"), data_(data), bytes_(bytes) {}

 protected:
  void Work() override {
    // Only whole pages inside the view: never fault (or lock) a byte outside it.
    const uintptr_t page = PageBytes();
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(data_) + page - 1) & ~(page - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(data_) + bytes_) & ~(page - 1);
    if (end <= begin) return;
    int rc;
    int tries = 0;
    do {
      rc = madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);
    } while (rc != 0 && (errno == EINTR || errno == EAGAIN) && ++tries < 4);
    if (rc == 0) {
      result_ = end - begin;
      return;
    }
    const int err = errno;
    if (err == EINVAL || err == ENOSYS) {
      unsupported_ = true;
      return;
    }
    failure_ = Failure{ErrnoName(err), std::string("prefault: madvise(MADV_POPULATE_WRITE): ") +
                                           std::strerror(err)};
  }

  Napi::Value Resolution(Napi::Env env) override {
    return Napi::Number::New(env, unsupported_ ? -1.0 : static_cast<double>(result_));
  }

 private:
  uint8_t* data_;
  size_t bytes_;
  bool unsupported_ = false;
};

}  // namespace

Napi::Value PrefaultAsync(const Napi::CallbackInfo& info) {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  if (!BytesOf(info[0], &data, &bytes)) {
    Throw(info.Env(), kErrInvalidArg, "prefaultAsync expects an ArrayBuffer or a view of one");
  }
  auto* worker = new PrefaultWorker(info.Env(), data, bytes);
  worker->Keep(info[0]);
  worker->Queue();
  return worker->Promise();
}

}  // namespace kvtier
