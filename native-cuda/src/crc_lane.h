// Checksums computed beside a file read or write: the I/O thread hands each slice it has read
// (or is about to write) to a small set of lane threads and goes on with the next; slices the
// lanes have not started when the I/O ends are done by the I/O thread itself, and the slice
// checksums are then combined in order. When every lane is busy (many reads at once on few
// cores) the I/O thread checksums the slice itself right away, while it is in its cache.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace kvtier {

// Slice size checksummed at once: small enough to still be in the core's cache.
inline constexpr size_t kCrcSliceBytes = 256u << 10;

// The CRC-32C of one buffer, computed slice by slice as its bytes become ready.
class SlicedCrc {
 public:
  // `data` is the buffer of `bytes` bytes; slices are added in order with Ready().
  SlicedCrc(const uint8_t* data, size_t bytes);

  // Bytes per slice for this buffer: kCrcSliceBytes, more for a very large one.
  size_t SliceBytes() const { return sliceBytes_; }

  // Bytes [from, to) of the buffer are ready: a lane checksums them, or this thread does.
  static void Ready(const std::shared_ptr<SlicedCrc>& self, size_t from, size_t to);

  // Waits until every slice is checksummed (doing unclaimed ones on this thread) and returns
  // the CRC-32C of the concatenated slices.
  uint32_t Finish();

  // Runs slice `i` unless another thread has claimed it.
  void Run(size_t i);

  // Waits until slice `i` is checksummed.
  void WaitDone(size_t i);

 private:
  struct Slice {
    size_t from;
    size_t to;
    uint32_t crc;
    std::atomic<bool> claimed{false};
    std::atomic<bool> done{false};
  };
  static constexpr size_t kMaxSlices = 1024;
  const uint8_t* data_;
  size_t sliceBytes_;
  size_t capacity_;
  // Allocated once (never moved), so lanes may index it while the I/O thread adds slices.
  std::unique_ptr<Slice[]> slices_;
  std::atomic<size_t> count_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};


}  // namespace kvtier
