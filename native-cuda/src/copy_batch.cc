#include "copy_batch.h"

#include <string>
#include <utility>
#include <vector>

#include "copy_plan.h"
#include "errors.h"
#include "host_memory.h"
#include "promise_worker.h"

namespace kvtier {
namespace {

class HostCopyWorker : public PromiseWorker {
 public:
  HostCopyWorker(Napi::Env env, std::vector<Region> buffers, std::vector<double> ops,
                 size_t width, size_t maxThreads)
      : PromiseWorker(env, "kvtier.copyBatch"),
        buffers_(std::move(buffers)),
        ops_(std::move(ops)),
        width_(width),
        maxThreads_(maxThreads) {}

 protected:
  void Work() override {
    std::vector<StridedRun> runs;
    // Validation runs here too, so a batch of many ops never stalls the JS thread.
    failure_ = PlanStridedCopies(buffers_, buffers_, ops_, width_, true, &runs);
    if (failure_.failed()) return;
    ExecuteHostRuns(runs, maxThreads_);
    result_ = runs.size();
  }

 private:
  std::vector<Region> buffers_;
  std::vector<double> ops_;
  size_t width_;
  size_t maxThreads_;
};

Napi::Value QueueHostCopy(const Napi::CallbackInfo& info, size_t width) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray()) Throw(env, kErrInvalidArg, "buffers must be an array");
  if (!info[1].IsTypedArray() ||
      info[1].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array) {
    Throw(env, kErrInvalidArg, "ops must be a Float64Array");
  }
  const size_t maxThreads = ToSize(env, info[2], "maxThreads");
  if (maxThreads < 1 || maxThreads > 64) Throw(env, kErrInvalidArg, "maxThreads must be in [1, 64]");
  Napi::Array list = info[0].As<Napi::Array>();
  std::vector<Region> buffers;
  std::vector<Napi::Value> values;
  buffers.reserve(list.Length());
  for (uint32_t i = 0; i < list.Length(); i++) {
    Napi::Value b = list.Get(i);
    Region r{};
    if (!BytesOf(b, &r.base, &r.bytes)) {
      Throw(env, kErrInvalidArg,
            "buffers[" + std::to_string(i) + "] is not an ArrayBuffer or a view of one");
    }
    buffers.push_back(r);
    values.push_back(b);
  }
  // The ops are copied so that later writes to the array cannot change a batch in flight.
  Napi::Float64Array ops = info[1].As<Napi::Float64Array>();
  std::vector<double> opsCopy(ops.Data(), ops.Data() + ops.ElementLength());
  auto* worker =
      new HostCopyWorker(env, std::move(buffers), std::move(opsCopy), width, maxThreads);
  for (const Napi::Value& b : values) worker->Keep(b);
  worker->Queue();
  return worker->Promise();
}

}  // namespace

Napi::Value CopyBatch(const Napi::CallbackInfo& info) { return QueueHostCopy(info, kOpWidth); }

Napi::Value CopyBatchStrided(const Napi::CallbackInfo& info) {
  return QueueHostCopy(info, kStridedOpWidth);
}

}  // namespace kvtier
