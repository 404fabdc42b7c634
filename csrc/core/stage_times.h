// Per-batch durations of one stage of the loader (collation, a device's copy): total busy time and
// a log-linear histogram for percentiles. Fixed size, no allocation: cheap enough to keep always.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>

namespace fastload {

// Time the calling thread has waited, inside a stage, for a file to be fetched (the provider of
// a lazily mapped file: object storage). The collation loop reads it around each batch, so that
// a stall hint can tell downloads from collation (both are the collation threads' time).
inline thread_local int64_t t_fetch_wait_ns = 0;

class StageTimes {
 public:
  void record(int64_t ns) {
    if (ns < 0) ns = 0;
    ++count_;
    total_ns_ += ns;
    ++buckets_[bucket(ns)];
  }
  void merge(const StageTimes& o) {
    count_ += o.count_;
    total_ns_ += o.total_ns_;
    for (size_t i = 0; i < buckets_.size(); ++i) buckets_[i] += o.buckets_[i];
  }
  int64_t count() const { return count_; }
  int64_t total_ns() const { return total_ns_; }
  // The q-quantile (0 < q < 1), as the upper edge of its bucket: within 1/kSub (12.5%) above.
  int64_t quantile_ns(double q) const {
    if (count_ == 0) return 0;
    const int64_t rank = static_cast<int64_t>(q * static_cast<double>(count_ - 1));
    int64_t seen = 0;
    for (size_t i = 0; i < buckets_.size(); ++i) {
      seen += buckets_[i];
      if (seen > rank) return upper_edge(static_cast<int>(i));
    }
    return upper_edge(static_cast<int>(buckets_.size()) - 1);
  }

  static int64_t since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  // Values below kSub ns get one bucket each; above, each power of two splits into kSub buckets.
  static constexpr int kSub = 8;
  static constexpr int kLogSub = 3;
  static int bucket(int64_t ns) {
    if (ns < kSub) return static_cast<int>(ns);
    const int msb = 63 - __builtin_clzll(static_cast<unsigned long long>(ns));
    const int sub = static_cast<int>((ns >> (msb - kLogSub)) & (kSub - 1));
    return (msb - kLogSub + 1) * kSub + sub;
  }
  static int64_t upper_edge(int b) {
    if (b < kSub) return b;
    const int msb = b / kSub + kLogSub - 1;
    const int64_t sub = b % kSub;
    return ((int64_t{kSub} + sub + 1) << (msb - kLogSub)) - 1;
  }

  int64_t count_ = 0, total_ns_ = 0;
  std::array<int64_t, 64 * kSub> buckets_{};
};

}  // namespace fastload
