#include "crc_lane.h"

#include <algorithm>
#include <deque>
#include <thread>
#include <utility>

#include "crc32c.h"

namespace kvtier {
namespace {

// Lane threads: few, since they only matter while a core is idle beside the I/O thread.
constexpr size_t kLanes = 2;

class Lanes {
 public:
  // Queues slice `i` of `crc` if a lane is idle; false (nothing queued) when all are busy.
  bool Offer(const std::shared_ptr<SlicedCrc>& crc, size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_ == 0 && started_ == kLanes) return false;
    if (idle_ == 0) {
      try {
        std::thread(&Lanes::Loop, this).detach();
      } catch (...) {
        return false;
      }
      started_++;
      idle_++;
    }
    idle_--;
    jobs_.emplace_back(crc, i);
    cv_.notify_one();
    return true;
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [this] { return !jobs_.empty(); });
      auto job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job.first->Run(job.second);
      job.first.reset();
      lock.lock();
      idle_++;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<SlicedCrc>, size_t>> jobs_;
  size_t started_ = 0;
  size_t idle_ = 0;
};

Lanes& TheLanes() {
  // Never destroyed: detached lane threads may still wait on it while the process exits.
  static Lanes* lanes = new Lanes();
  return *lanes;
}

}  // namespace

SlicedCrc::SlicedCrc(const uint8_t* data, size_t bytes) : data_(data) {
  sliceBytes_ = std::max(kCrcSliceBytes, (bytes + kMaxSlices - 1) / kMaxSlices);
  capacity_ = std::max<size_t>(1, (bytes + sliceBytes_ - 1) / sliceBytes_);
  slices_.reset(new Slice[capacity_]);
}

void SlicedCrc::Ready(const std::shared_ptr<SlicedCrc>& self, size_t from, size_t to) {
  const size_t i = self->count_.load(std::memory_order_relaxed);
  if (i == self->capacity_) {
    // More slices than the size given (a caller slicing finer than SliceBytes): do it here.
    Slice& last = self->slices_[i - 1];
    self->Run(i - 1);
    self->WaitDone(i - 1);
    last.crc = Crc32cCombine(last.crc, Crc32c(0, self->data_ + from, to - from), to - from);
    last.to = to;
    return;
  }
  Slice& s = self->slices_[i];
  s.from = from;
  s.to = to;
  self->count_.store(i + 1, std::memory_order_release);
  if (!TheLanes().Offer(self, i)) self->Run(i);
}

void SlicedCrc::Run(size_t i) {
  Slice& s = slices_[i];
  if (s.claimed.exchange(true)) return;
  s.crc = Crc32c(0, data_ + s.from, s.to - s.from);
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.done.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

uint32_t SlicedCrc::Finish() {
  const size_t n = count_.load(std::memory_order_acquire);
  for (size_t i = 0; i < n; i++) Run(i);
  uint32_t crc = 0;
  for (size_t i = 0; i < n; i++) {
    WaitDone(i);
    const Slice& s = slices_[i];
    crc = i == 0 ? s.crc : Crc32cCombine(crc, s.crc, s.to - s.from);
  }
  return crc;
}

void SlicedCrc::WaitDone(size_t i) {
  Slice& s = slices_[i];
  if (s.done.load(std::memory_order_acquire)) return;
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&s] { return s.done.load(std::memory_order_acquire); });
}

}  // namespace kvtier
