#include "file_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "crc32c.h"
#include "errors.h"
#include "host_memory.h"
#include "promise_worker.h"

namespace kvtier {
namespace {

Failure Errno(const std::string& what) {
  const int err = errno;
  return Failure{ErrnoName(err), what + ": " + std::strerror(err)};
}

// Bytes read per system call and checksummed at once: small enough to stay in the core's cache
// between the two.
constexpr size_t kReadSliceBytes = 256u << 10;

// Writes go in pieces that end on multiples of this file offset, each checksummed right before it
// is written (from the cache). One write call per 2 MiB lets the page cache hold the file in
// large folios, as one write of the whole file would; a file written in smaller pieces (or from
// an offset that is not aligned) is held in smaller ones and reads back measurably slower.
constexpr size_t kWritePieceBytes = 2u << 20;

double MtimeMs(const struct stat& st) {
  return static_cast<double>(st.st_mtim.tv_sec) * 1e3 + static_cast<double>(st.st_mtim.tv_nsec) / 1e6;
}

// CRC-32 (IEEE, as zlib computes it) of a small buffer: the chunk header's self-check.
uint32_t Crc32Ieee(const uint8_t* p, size_t n) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0xedb88320u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  while (n--) c = (c >> 8) ^ table[(c ^ *p++) & 0xff];
  return ~c;
}

void PutLe(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

int CloseQuietly(int fd) {
  const int saved = errno;
  const int rc = close(fd);
  errno = saved;
  return rc;
}

class StatFilesWorker : public PromiseWorker {
 public:
  StatFilesWorker(Napi::Env env, std::string dir, std::vector<std::string> names)
      : PromiseWorker(env, "kvtier.statFiles"), dir_(std::move(dir)), names_(std::move(names)) {}

 protected:
  void Work() override {
    out_.assign(3 * names_.size(), 0.0);
    const int dfd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
      if (errno != ENOENT && errno != ENOTDIR) {
        failure_ = Errno("open " + dir_);
        return;
      }
      for (size_t i = 0; i < names_.size(); i++) out_[3 * i] = -1;
      return;
    }
    for (size_t i = 0; i < names_.size(); i++) {
      struct stat st;
      if (fstatat(dfd, names_[i].c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT || errno == ENOTDIR) {
          out_[3 * i] = -1;
          continue;
        }
        failure_ = Errno("stat " + dir_ + "/" + names_[i]);
        break;
      }
      out_[3 * i] = static_cast<double>(st.st_size);
      out_[3 * i + 1] = MtimeMs(st);
      out_[3 * i + 2] = S_ISREG(st.st_mode) ? 1 : 0;
    }
    close(dfd);
  }

  Napi::Value Resolution(Napi::Env env) override {
    Napi::Float64Array a = Napi::Float64Array::New(env, out_.size());
    std::copy(out_.begin(), out_.end(), a.Data());
    return a;
  }

 private:
  std::string dir_;
  std::vector<std::string> names_;
  std::vector<double> out_;
};

class ReadFileWorker : public PromiseWorker {
 public:
  ReadFileWorker(Napi::Env env, std::string path, uint8_t* dst, size_t bytes, size_t maxBytes,
                 size_t crcFrom)
      : PromiseWorker(env, "kvtier.readFileCrc32c"),
        path_(std::move(path)),
        dst_(dst),
        bytes_(bytes),
        maxBytes_(maxBytes),
        crcFrom_(std::min(crcFrom, bytes)) {}

 protected:
  void Work() override {
    const int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT || errno == ENOTDIR) {
        status_ = 1;
        return;
      }
      failure_ = Errno("open " + path_);
      return;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
      failure_ = Errno("stat " + path_);
      CloseQuietly(fd);
      return;
    }
    size_ = static_cast<double>(st.st_size);
    mtimeMs_ = MtimeMs(st);
    const size_t size = static_cast<size_t>(st.st_size);
    if (size > maxBytes_) status_ = 3;
    else if (size != bytes_) status_ = 2;
    else ReadAll(fd);
    close(fd);
  }

  Napi::Value Resolution(Napi::Env env) override {
    Napi::Object o = Napi::Object::New(env);
    o.Set("status", Napi::Number::New(env, status_));
    o.Set("size", Napi::Number::New(env, size_));
    o.Set("crc", Napi::Number::New(env, crc_));
    o.Set("mtimeMs", Napi::Number::New(env, mtimeMs_));
    return o;
  }

 private:
  // Reads the file slice by slice, each slice checksummed by this thread right after it is read,
  // while it is still in the core's cache: one pass over the bytes, and no hand-off to another
  // thread (on a busy machine a second thread is a context switch and a trip through memory).
  void ReadAll(int fd) {
    uint32_t crc = 0;
    size_t done = 0;
    while (done < bytes_) {
      const size_t want = std::min(kReadSliceBytes, bytes_ - done);
      const ssize_t got = pread(fd, dst_ + done, want, static_cast<off_t>(done));
      if (got < 0) {
        if (errno == EINTR) continue;
        failure_ = Errno("read " + path_);
        return;
      }
      if (got == 0) {
        status_ = 4;
        return;
      }
      const size_t end = done + static_cast<size_t>(got);
      if (end > crcFrom_) {
        const size_t from = std::max(done, crcFrom_);
        crc = Crc32c(crc, dst_ + from, end - from);
      }
      done = end;
    }
    crc_ = crc;
  }

  std::string path_;
  uint8_t* dst_;
  size_t bytes_;
  size_t maxBytes_;
  size_t crcFrom_;
  int status_ = 0;
  double size_ = 0;
  double crc_ = 0;
  double mtimeMs_ = 0;
};

// Creates each directory in order (an existing one is fine).
bool MakeDirs(const std::vector<std::string>& dirs) {
  for (const std::string& d : dirs) {
    if (mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  return true;
}

class WriteFileWorker : public PromiseWorker {
 public:
  WriteFileWorker(Napi::Env env, std::string temp, std::string final, std::vector<uint8_t> header,
                  const uint8_t* payload, size_t payloadBytes, int fsync,
                  std::vector<std::string> makeDirs,
                  size_t checksumAt, size_t headerCrcAt)
      : PromiseWorker(env, "kvtier.writeFileAtomic"),
        temp_(std::move(temp)),
        final_(std::move(final)),
        header_(std::move(header)),
        payload_(payload),
        payloadBytes_(payloadBytes),
        fsync_(fsync),
        makeDirs_(std::move(makeDirs)),
        checksumAt_(checksumAt),
        headerCrcAt_(headerCrcAt) {}

 protected:
  void Work() override {
    int fd = open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ENOENT && !makeDirs_.empty()) {
      if (!MakeDirs(makeDirs_)) {
        failure_ = Errno("mkdir for " + temp_);
        return;
      }
      fd = open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    }
    if (fd < 0) {
      failure_ = Errno("create " + temp_);
      return;
    }
    Failure f = WriteBody(fd);
    if (close(fd) != 0 && !f.failed()) f = Errno("close " + temp_);
    if (!f.failed() && rename(temp_.c_str(), final_.c_str()) != 0) f = Errno("rename " + temp_);
    if (f.failed()) {
      unlink(temp_.c_str());
      failure_ = f;
      return;
    }
    if (fsync_ >= 2) {
      const size_t slash = final_.find_last_of('/');
      const std::string dir = slash == std::string::npos ? "." : final_.substr(0, slash);
      const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (dfd < 0 || ::fsync(dfd) != 0) failure_ = Errno("sync " + dir);
      if (dfd >= 0) close(dfd);
    }
    result_ = header_.size() + payloadBytes_;
  }

 private:
  Failure WriteAt(int fd, const uint8_t* p, size_t n, size_t at) {
    size_t done = 0;
    while (done < n) {
      const ssize_t w = pwrite(fd, p + done, n - done, static_cast<off_t>(at + done));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Errno("write " + temp_);
      }
      if (w == 0) return Failure{"EIO", "write made no progress: " + temp_};
      done += static_cast<size_t>(w);
    }
    return Failure{};
  }

  // Checksums and writes the payload piece by piece (see kWritePieceBytes), then fills in and
  // writes the header.
  Failure WriteBody(int fd) {
    uint32_t c = 0;
    const size_t at = header_.size();
    for (size_t off = 0; off < payloadBytes_;) {
      const size_t end = std::min(payloadBytes_, (at + off) / kWritePieceBytes * kWritePieceBytes +
                                                     kWritePieceBytes - at);
      c = Crc32c(c, payload_ + off, end - off);
      Failure f = WriteAt(fd, payload_ + off, end - off, at + off);
      if (f.failed()) return f;
      off = end;
    }
    if (checksumAt_ + 8 <= header_.size() && headerCrcAt_ + 4 <= header_.size()) {
      PutLe(header_.data() + checksumAt_, c, 8);
      PutLe(header_.data() + headerCrcAt_, Crc32Ieee(header_.data(), headerCrcAt_), 4);
    }
    Failure f = WriteAt(fd, header_.data(), header_.size(), 0);
    if (f.failed()) return f;
    if (fsync_ >= 1 && fdatasync(fd) != 0) return Errno("sync " + temp_);
    return Failure{};
  }

  std::string temp_;
  std::string final_;
  std::vector<uint8_t> header_;
  const uint8_t* payload_;
  size_t payloadBytes_;
  int fsync_;
  std::vector<std::string> makeDirs_;
  size_t checksumAt_;
  size_t headerCrcAt_;
};

std::string StringArg(const Napi::CallbackInfo& info, size_t i, const char* name) {
  if (!info[i].IsString()) Throw(info.Env(), kErrInvalidArg, std::string(name) + " must be a string");
  return info[i].As<Napi::String>().Utf8Value();
}

std::vector<std::string> StringsArg(const Napi::CallbackInfo& info, size_t i, const char* name) {
  Napi::Env env = info.Env();
  if (!info[i].IsArray()) Throw(env, kErrInvalidArg, std::string(name) + " must be an array of strings");
  Napi::Array list = info[i].As<Napi::Array>();
  std::vector<std::string> out;
  out.reserve(list.Length());
  for (uint32_t k = 0; k < list.Length(); k++) {
    Napi::Value v = list.Get(k);
    if (!v.IsString()) Throw(env, kErrInvalidArg, std::string(name) + " must be an array of strings");
    out.push_back(v.As<Napi::String>().Utf8Value());
  }
  return out;
}

}  // namespace

Napi::Value StatFilesAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string dir = StringArg(info, 0, "dir");
  std::vector<std::string> names = StringsArg(info, 1, "names");
  auto* worker = new StatFilesWorker(env, std::move(dir), std::move(names));
  worker->Queue();
  return worker->Promise();
}

Napi::Value ReadFileCrc32cAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = StringArg(info, 0, "path");
  uint8_t* dst;
  size_t bytes;
  if (!BytesOf(info[1], &dst, &bytes)) {
    Throw(env, kErrInvalidArg, "dst must be an ArrayBuffer or a view of one");
  }
  const size_t maxBytes = ToSize(env, info[2], "maxBytes");
  const size_t crcFrom = ToSize(env, info[3], "crcFrom");
  auto* worker = new ReadFileWorker(env, std::move(path), dst, bytes, maxBytes, crcFrom);
  worker->Keep(info[1]);
  worker->Queue();
  return worker->Promise();
}

Napi::Value WriteFileAtomicAsync(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string temp = StringArg(info, 0, "tempPath");
  std::string final = StringArg(info, 1, "finalPath");
  uint8_t* header;
  size_t headerBytes;
  uint8_t* payload;
  size_t payloadBytes;
  if (!BytesOf(info[2], &header, &headerBytes) || !BytesOf(info[3], &payload, &payloadBytes)) {
    Throw(env, kErrInvalidArg, "header and payload must be ArrayBuffers or views of them");
  }
  const size_t fsync = ToSize(env, info[4], "fsync");
  if (fsync > 2) Throw(env, kErrInvalidArg, "fsync must be 0, 1 or 2");
  std::vector<std::string> makeDirs = StringsArg(info, 5, "makeDirs");
  const size_t checksumAt = ToSize(env, info[6], "checksumAt");
  const size_t headerCrcAt = ToSize(env, info[7], "headerCrcAt");
  auto* worker = new WriteFileWorker(env, std::move(temp), std::move(final),
                                     std::vector<uint8_t>(header, header + headerBytes), payload,
                                     payloadBytes, static_cast<int>(fsync), std::move(makeDirs),
                                     checksumAt, headerCrcAt);
  worker->Keep(info[3]);
  worker->Queue();
  return worker->Promise();
}

}  // namespace kvtier
