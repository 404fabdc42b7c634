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

// What the stall hint is made of: how long the loop waited, and how busy each stage was since the
// epoch began. The runtime measures; the advice text is written in Python (fastload/_advice.py),
// called through the bindings' hook when the hint is due.
struct StallFigures {
  double share = 0;       // the loop's wait in next() over the last kWindow batches' wall time
  double collating = 0;   // the collation threads' busy share
  double copying = 0;     // the busiest GPU's copy streams' busy share (0 on the CPU path)
  double releasing = 0;   // the share of the time copies waited for the consumer's GPU work
  double user_share = -1; // of the collation time, a Python dataset's own code (-1: not one)
  double fetch_share = 0; // of the collation time, waiting for object storage
  bool processes = false; // the dataset's code runs in worker processes
  int num_threads = 0, copy_streams = 0;
  int64_t prefetch = 0;
  int window = RunStats::kWindow;
};

}  // namespace fastload
