// Errors thrown by the addon carry a stable `code` string; src/native/native.ts maps each code
// onto a KvtierError code and keeps the native one as `nativeCode`.
#pragma once

#include <napi.h>

#include <string>

namespace kvtier {

// Codes shared with the pure-JS fallback in src/native/native.ts; keep both lists in step.
inline constexpr const char* kErrInvalidArg = "ERR_INVALID_ARG";
inline constexpr const char* kErrBadOp = "ERR_BAD_OP";
inline constexpr const char* kErrOutOfRange = "ERR_OUT_OF_RANGE";
inline constexpr const char* kErrOverlap = "ERR_OVERLAP";
inline constexpr const char* kErrMisaligned = "ERR_MISALIGNED";
inline constexpr const char* kErrTooLarge = "ERR_TOO_LARGE";
inline constexpr const char* kErrNoCuda = "ERR_NO_CUDA";
inline constexpr const char* kErrCuda = "ERR_CUDA";
inline constexpr const char* kErrInternal = "ERR_INTERNAL";
inline constexpr const char* kErrShortRead = "ERR_SHORT_READ";

// A failure that happened off the JS thread, turned into a JS error later.
struct Failure {
  std::string code;
  std::string message;
  bool failed() const { return !code.empty(); }
};

// Creates a JS Error with `code` set.
Napi::Error MakeError(Napi::Env env, const std::string& code, const std::string& message);

// Throws a JS Error with `code` set (C++ exception, caught by node-addon-api).
[[noreturn]] void Throw(Napi::Env env, const std::string& code, const std::string& message);

// The symbolic name of an errno value ("ENOENT"), or "E<number>" when unknown.
std::string ErrnoName(int err);

// Reads a non-negative safe integer argument or throws ERR_INVALID_ARG naming it.
size_t ToSize(Napi::Env env, const Napi::Value& value, const char* name);

}  // namespace kvtier
