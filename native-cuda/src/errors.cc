#include "errors.h"

#include <cmath>
#include <cstring>

namespace kvtier {

Napi::Error MakeError(Napi::Env env, const std::string& code, const std::string& message) {
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, code));
  return error;
}

void Throw(Napi::Env env, const std::string& code, const std::string& message) {
  throw MakeError(env, code, message);
}

std::string ErrnoName(int err) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 32))
  const char* name = strerrorname_np(err);
  if (name != nullptr) return name;
#endif
  return "E" + std::to_string(err);
}

size_t ToSize(Napi::Env env, const Napi::Value& value, const char* name) {
  constexpr double kMaxSafe = 9007199254740991.0;
  if (!value.IsNumber()) {
    Throw(env, kErrInvalidArg, std::string(name) + " must be a non-negative integer");
  }
  const double d = value.As<Napi::Number>().DoubleValue();
  if (!std::isfinite(d) || d < 0 || d > kMaxSafe || std::floor(d) != d) {
    Throw(env, kErrInvalidArg,
          std::string(name) + " must be a non-negative integer, got " + std::to_string(d));
  }
  return static_cast<size_t>(d);
}

}  // namespace kvtier
