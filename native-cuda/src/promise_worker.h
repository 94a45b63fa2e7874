// An AsyncWorker that settles a promise, rejecting with an error that carries a `code`, and
// holds references to the JS buffers it reads or writes until the work is over.
#pragma once

#include <napi.h>

#include <exception>
#include <new>
#include <vector>

#include "errors.h"

namespace kvtier {

class PromiseWorker : public Napi::AsyncWorker {
 public:
  PromiseWorker(Napi::Env env, const char* name)
      : Napi::AsyncWorker(env, name), deferred_(Napi::Promise::Deferred::New(env)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

  // Keeps `value` (a buffer the worker touches) from being collected while the work runs.
  void Keep(const Napi::Value& value) { kept_.push_back(Napi::Persistent(value)); }

 protected:
  // Called off the JS thread; `failure_` set means reject.
  virtual void Work() = 0;

  void Execute() final {
    try {
      Work();
    } catch (const std::bad_alloc&) {
      failure_ = Failure{"ENOMEM", "out of memory while planning the batch"};
    } catch (const std::exception& e) {
      failure_ = Failure{kErrInternal, e.what()};
    }
    if (failure_.failed()) SetError(failure_.message);
  }

  void OnOK() final { deferred_.Resolve(Resolution(Env())); }

  // What the promise resolves with: `result_` as a number unless a worker says otherwise.
  virtual Napi::Value Resolution(Napi::Env env) {
    return Napi::Number::New(env, static_cast<double>(result_));
  }

  void OnError(const Napi::Error& /*error*/) final {
    deferred_.Reject(MakeError(Env(), failure_.code, failure_.message).Value());
  }

  Failure failure_;
  size_t result_ = 0;

 private:
  Napi::Promise::Deferred deferred_;
  std::vector<Napi::Reference<Napi::Value>> kept_;
};

}  // namespace kvtier
