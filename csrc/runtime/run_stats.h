// What the training loop saw of one epoch: batches, samples and bytes handed out, the time it
// waited inside next(), how many batches were ready when it asked, and whether it has been
// waiting for data over the last few hundred batches (the stall hint). Updated by the iterator
// with the GIL held: no locks; a few adds and two clock reads per batch.
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

struct RunStats {
  using Clock = std::chrono::steady_clock;
  // The hint looks at this many batches, and speaks when the loop waited more than this share
  // of their wall time.
  static constexpr int kWindow = 256;
  static constexpr double kStallShare = 0.2;

  Clock::time_point started = Clock::now();
  int64_t batches = 0, samples = 0, bytes = 0;
  int64_t wait_ns = 0;
  int64_t ready_sum = 0;  // batches ready at each next() call, summed
  // A mixture's rows handed out per source (empty for one source); the plan counts them.
  std::vector<int64_t> source_rows;

  // Records one hand-out; returns the wait share over the last kWindow batches once that many
  // were handed out (else a negative value).
  double record(int64_t rows, int64_t batch_bytes, int64_t waited_ns, int64_t ready) {
    const Clock::time_point now = Clock::now();
    ++batches;
    samples += rows;
    bytes += batch_bytes;
    wait_ns += waited_ns;
    ready_sum += ready;
    const size_t slot = static_cast<size_t>(batches % kWindow);
    window_wait_ns_ += waited_ns - waits_[slot];
    const Clock::time_point oldest = times_[slot];
    waits_[slot] = waited_ns;
    times_[slot] = now;
    if (batches <= kWindow) return -1.0;
    const double span = std::chrono::duration<double, std::nano>(now - oldest).count();
    return span > 0 ? static_cast<double>(window_wait_ns_) / span : 0.0;
  }
 private:
  int64_t window_wait_ns_ = 0;
  std::array<int64_t, kWindow> waits_{};
  std::array<Clock::time_point, kWindow> times_{};
};

// The knob a stall hint names, from how busy each stage was since the epoch began: the share of
// the collation threads' time spent building batches, and of the busiest GPU's copy streams'
// time spent copying (0 on the CPU path). A stage busy more than kBusyShare of the time is the
// bottleneck; when neither is, the data came but came unevenly, which a deeper window absorbs.
inline constexpr double kBusyShare = 0.7;

// releasing: the share of the time the busiest GPU's copies waited for the consumer's work to
// release batch memory (the training step queued on the GPU ahead of them). When it is high, the
// loop waits in next() for its own GPU work, not for the loader: no loader knob helps.
inline bool step_bound(double releasing) { return releasing > kBusyShare; }

// user_share: of the collation time, the share spent in a Python dataset's own code (negative for
// array sources); processes: whether that code runs in worker processes already; fetch_share: of
// the collation time, the share spent waiting for files from object storage.
inline std::string stall_advice(double collating, double copying, int num_threads, int streams, int64_t prefetch,
                                double user_share = -1.0, bool processes = false, double releasing = 0.0,
                                double fetch_share = 0.0) {
  if (step_bound(releasing))
    return "the copies of the next batches waited " + std::to_string(static_cast<int>(releasing * 100)) +
           "% of the time for your training step's GPU work to release batch memory: the training step is the "
           "bottleneck, not data loading (no loader setting helps; a deeper prefetch would only hold more device "
           "memory)";
  if (collating > kBusyShare && user_share > 0.5)
    return "the dataset's own code (__getitem__) is the bottleneck (" + std::to_string(static_cast<int>(user_share * 100)) +
           "% of the workers' time): raise num_workers (now " + std::to_string(num_threads) + ")" +
           (processes ? std::string("") : std::string(", or use workers='processes' if that code is pure Python "
                                                      "(threads share one GIL)"));
  if (collating > kBusyShare && fetch_share > 0.5)
    return "the collation threads waited for object storage " + std::to_string(static_cast<int>(fetch_share * 100)) +
           "% of their time: downloads are the bottleneck, not collation (a cache_limit that holds the dataset "
           "makes later epochs read the local cache; more requests in flight: storage_options={'max_concurrency': "
           "...})";
  if (collating > kBusyShare)
    return "collation is the bottleneck (" + std::to_string(num_threads) +
           " threads): raise num_threads, or store fewer bytes per sample (float16, uint16)";
  if (copying > kBusyShare)
    return "the host-to-device copy is the bottleneck: raise streams (now " + std::to_string(streams) +
           "), or store fewer bytes per sample";
  return "batches arrive irregularly: raise prefetch (now " + std::to_string(prefetch) + ")";
}

}  // namespace fastload
