#include "host_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "cuda_device.h"
#include "errors.h"

namespace kvtier {
namespace {

constexpr size_t kMaxSlabBytes = size_t{1} << 30;
// Typed arrays over a mapping stop at 4 GiB.
constexpr size_t kMaxMapBytes = size_t{4} << 30;

struct Mapping {
  void* base;
  size_t bytes;
  bool pinned;
};

void Unmap(Napi::Env env, void* /*data*/, Mapping* m) {
  if (m->pinned) UnpinHost(m->base);
  munmap(m->base, m->bytes);
  Napi::MemoryManagement::AdjustExternalMemory(env, -static_cast<int64_t>(m->bytes));
  delete m;
}

Napi::ArrayBuffer Wrap(Napi::Env env, void* base, size_t bytes, bool pinned) {
  auto* m = new Mapping{base, bytes, pinned};
  Napi::ArrayBuffer ab = Napi::ArrayBuffer::New(env, base, bytes, Unmap, m);
  // Lets V8 weigh the native bytes when it decides to collect.
  Napi::MemoryManagement::AdjustExternalMemory(env, static_cast<int64_t>(bytes));
  return ab;
}

[[noreturn]] void ThrowErrno(Napi::Env env, int err, const std::string& what) {
  Throw(env, ErrnoName(err), what + ": " + std::strerror(err));
}

}  // namespace

size_t PageBytes() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

bool BytesOf(const Napi::Value& value, uint8_t** data, size_t* bytes) {
  if (value.IsArrayBuffer()) {
    Napi::ArrayBuffer ab = value.As<Napi::ArrayBuffer>();
    *data = static_cast<uint8_t*>(ab.Data());
    *bytes = ab.ByteLength();
    return true;
  }
  if (value.IsTypedArray()) {
    Napi::TypedArray ta = value.As<Napi::TypedArray>();
    *data = static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset();
    *bytes = ta.ByteLength();
    return true;
  }
  if (value.IsDataView()) {
    Napi::DataView dv = value.As<Napi::DataView>();
    *data = static_cast<uint8_t*>(dv.ArrayBuffer().Data()) + dv.ByteOffset();
    *bytes = dv.ByteLength();
    return true;
  }
  return false;
}

Napi::Value AllocSlab(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t bytes = ToSize(env, info[0], "bytes");
  if (bytes == 0) Throw(env, kErrInvalidArg, "bytes must be at least 1");
  if (bytes > kMaxSlabBytes) {
    Throw(env, kErrTooLarge,
          "a slab holds at most " + std::to_string(kMaxSlabBytes) + " bytes, asked for " +
              std::to_string(bytes));
  }
  // Anonymous mappings are page aligned, zero filled and committed lazily.
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) ThrowErrno(env, errno, "allocSlab(" + std::to_string(bytes) + ")");
#ifdef MADV_HUGEPAGE
  // Huge pages cut TLB misses when whole chunks are copied in and out (best effort).
  (void)madvise(base, bytes, MADV_HUGEPAGE);
#endif
  const bool pinned = PinHost(base, bytes);
  return Wrap(env, base, bytes, pinned);
}

Napi::Value MapFile(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsString()) Throw(env, kErrInvalidArg, "path must be a string");
  const std::string path = info[0].As<Napi::String>().Utf8Value();
  const size_t offset = ToSize(env, info[1], "offset");
  size_t length = ToSize(env, info[2], "length");
  if (!info[3].IsBoolean()) Throw(env, kErrInvalidArg, "writable must be a boolean");
  const bool writable = info[3].As<Napi::Boolean>().Value();
  if (offset % PageBytes() != 0) {
    Throw(env, kErrMisaligned,
          "offset " + std::to_string(offset) + " is not a multiple of the page size (" +
              std::to_string(PageBytes()) + " bytes)");
  }
  const int fd = open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) ThrowErrno(env, errno, "mapFile: open " + path);
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    ThrowErrno(env, err, "mapFile: stat " + path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (length == 0 && offset < size) length = size - offset;
  if (length == 0 || offset > size || length > size - offset) {
    close(fd);
    Throw(env, kErrOutOfRange,
          "mapFile: range [" + std::to_string(offset) + ", " + std::to_string(offset + length) +
              ") is not inside " + path + " (" + std::to_string(size) + " bytes)");
  }
  if (length > kMaxMapBytes) {
    close(fd);
    Throw(env, kErrTooLarge, "mapFile: a mapping holds at most " + std::to_string(kMaxMapBytes) +
                                 " bytes, asked for " + std::to_string(length));
  }
  // A read-only view is a private copy-on-write mapping: a stray JS write then changes only
  // this process's page instead of faulting, and unwritten pages still show the file.
  const int flags = writable ? MAP_SHARED : MAP_PRIVATE;
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, flags, fd, static_cast<off_t>(offset));
  const int err = errno;
  close(fd);
  if (base == MAP_FAILED) ThrowErrno(env, err, "mapFile: mmap " + path);
  return Wrap(env, base, length, false);
}

Napi::Value AddressOf(const Napi::CallbackInfo& info) {
  uint8_t* data = nullptr;
  size_t bytes = 0;
  if (!BytesOf(info[0], &data, &bytes)) {
    Throw(info.Env(), kErrInvalidArg, "addressOf expects an ArrayBuffer or a view of one");
  }
  return Napi::BigInt::New(info.Env(), static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data)));
}

}  // namespace kvtier
