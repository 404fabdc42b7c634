// A driver for instruction counts of the core's engine alone (no Python): run it under
// `valgrind --tool=callgrind` twice with different batch counts and divide the difference by the
// difference in batches (bench/mix_instructions.sh does that), which leaves the steady state per
// batch without set-up. Counts are stable under other load, unlike times on a shared machine.
//
//   mix_instructions MODE BATCHES [--batch B] [--tokens T] [--threads N] [--row-bytes R] [--replicas W]
//
// MODE: epoch (one array column, EpochPlan: the epoch path's hot loop; rows of R bytes),
//       one   (token windows of one array through a StreamPlan of one source, as steps= runs it),
//       mix1  (the same through a MixSource of one child: the mixture path with one run),
//       mix3  (a MixSource of three windowed views of that array, weights 0.6/0.3/0.1, sized so),
//       mix3eq (the same weights over views of 1/2, 1/4 and 1/4 of the array: each part's
//              permutation cycle-walks as much as the one source's).
// Token windows are 1025 uint16 tokens with stride 1024, as bench/bench_mix.py reads them.
// --replicas W: stream modes build rank 0's batches of W replicas (world size W: a global batch
// of W * B, every W-th position of each source's share).
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/array_source.h"
#include "core/engine.h"
#include "core/mix_source.h"
#include "core/stream_plan.h"

using namespace fastload;

namespace {

constexpr int64_t kWindow = 1025, kStride = 1024;
constexpr uint64_t kSeed = 0;

ArrayColumn windows(const uint16_t* tokens, int64_t count) {
  ArrayColumn c;
  c.name = "tokens";
  c.dtype = DType{kUInt, 16};
  c.row_shape = {kWindow};
  c.base = reinterpret_cast<const std::byte*>(tokens);
  c.rows = (count - kWindow) / kStride + 1;
  c.pitch = kStride * 2;
  c.row_bytes = kWindow * 2;
  return c;
}

// Integer quotas of weights w (summing to 1) of a global batch: base counts and 2^32 shares.
MixSchedule schedule_of(const std::vector<double>& w, int64_t g) {
  std::vector<int64_t> base;
  std::vector<uint64_t> shares;
  int64_t extras = g;
  uint64_t share_sum = 0;
  for (double x : w) {
    const double q = x * static_cast<double>(g);
    base.push_back(static_cast<int64_t>(q));
    extras -= base.back();
    shares.push_back(static_cast<uint64_t>((q - static_cast<double>(base.back())) * 4294967296.0));
    share_sum += shares.back();
  }
  shares[0] += static_cast<uint64_t>(extras) * MixSchedule::kScale - share_sum;  // rounding
  return MixSchedule(g, base, shares, mix_phase(kSeed));
}

std::shared_ptr<const StreamConfig> stream_of(const std::vector<int64_t>& lengths, const std::vector<double>& w,
                                              int64_t batch, int64_t replicas) {
  auto c = std::make_shared<StreamConfig>();
  int64_t offset = 0;
  const int n = static_cast<int>(lengths.size());
  for (int j = 0; j < n; ++j) {
    StreamSource s;
    s.order.num_samples = lengths[static_cast<size_t>(j)];
    s.order.seed = stream_source_seed(kSeed, j, n);
    s.order.shuffle = true;
    s.offset = offset;
    offset += s.order.num_samples;
    c->sources.push_back(s);
    c->base_positions.push_back(0);
  }
  c->schedule = schedule_of(w, batch * replicas);
  c->batch_size = batch;
  c->replicas = replicas;
  c->seed = kSeed;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s epoch|one|mix1|mix3 BATCHES [--batch B] [--tokens T] [--threads N] "
                         "[--row-bytes R] [--replicas W]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const int64_t batches = std::atoll(argv[2]);
  int64_t batch = 64, tokens = int64_t{1} << 28, row_bytes = 64, replicas = 1;
  int threads = 2;
  for (int i = 3; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (k == "--batch") batch = v;
    else if (k == "--tokens") tokens = v;
    else if (k == "--threads") threads = static_cast<int>(v);
    else if (k == "--row-bytes") row_bytes = v;
    else if (k == "--replicas") replicas = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  EngineOptions o;
  o.num_threads = threads;
  o.prefetch = 4;
  o.batch_size = batch;
  std::shared_ptr<BatchSource> source;
  std::shared_ptr<const BatchPlan> plan;
  // Zeroed pages cost no instructions to make; the values do not change what the engine does.
  std::unique_ptr<uint16_t, decltype(&std::free)> data(nullptr, &std::free);
  if (mode == "epoch") {
    const int64_t rows = tokens * 2 / row_bytes;
    data.reset(static_cast<uint16_t*>(std::calloc(static_cast<size_t>(rows * row_bytes), 1)));
    ArrayColumn c;
    c.name = "x";
    c.dtype = DType{kUInt, 8};
    c.row_shape = {row_bytes};
    c.base = reinterpret_cast<const std::byte*>(data.get());
    c.rows = rows;
    c.pitch = c.row_bytes = row_bytes;
    source = std::make_shared<ArraySource>(std::vector<ArrayColumn>{c});
    SamplerConfig cfg;
    cfg.num_samples = rows;
    cfg.batch_size = batch;
    cfg.shuffle = true;
    // The epoch's last BATCHES batches: the engine builds exactly those (a run that stops early
    // leaves a varying number of prefetched batches in the count).
    plan = std::make_shared<EpochPlan>(cfg, 0, rows / batch * batch - batches * batch);
  } else {
    data.reset(static_cast<uint16_t*>(std::calloc(static_cast<size_t>(tokens), 2)));
    const uint16_t* t = data.get();
    if (mode == "one" || mode == "mix1") {
      const ArrayColumn c = windows(t, tokens);
      auto child = std::make_shared<ArraySource>(std::vector<ArrayColumn>{c});
      source = mode == "one" ? std::shared_ptr<BatchSource>(child)
                             : std::make_shared<MixSource>(std::vector<std::shared_ptr<BatchSource>>{child});
      plan = std::make_shared<StreamPlan>(stream_of({c.rows}, {1.0}, batch, replicas), 0, batches, 0);
    } else if (mode == "mix3" || mode == "mix3eq") {
      const std::vector<double> w = {0.6, 0.3, 0.1};
      // mix3: parts sized as the weights; mix3eq: 1/2, 1/4, 1/4 of the tokens, so that each
      // part's permutation cycle-walks as much as the one source's (a power of two apart).
      const std::vector<double> sizes = mode == "mix3" ? w : std::vector<double>{0.5, 0.25, 0.25};
      std::vector<std::shared_ptr<BatchSource>> children;
      std::vector<int64_t> lengths;
      int64_t at = 0;
      for (double x : sizes) {
        const int64_t n = static_cast<int64_t>(static_cast<double>(tokens) * x);
        const ArrayColumn c = windows(t + at, n);
        at += n;
        lengths.push_back(c.rows);
        children.push_back(std::make_shared<ArraySource>(std::vector<ArrayColumn>{c}));
      }
      source = std::make_shared<MixSource>(children);
      plan = std::make_shared<StreamPlan>(stream_of(lengths, w, batch, replicas), 0, batches, 0);
    } else {
      std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
      return 2;
    }
  }
  Engine e(source, o);
  std::vector<OutputSpec> outputs;
  outputs.emplace_back(plan, false);
  auto p = e.start(std::move(outputs));
  int64_t checksum = 0;
  for (;;) {
    Batch b;
    NextStatus s;
    while ((s = p->next(0, std::chrono::milliseconds(100), &b)) == NextStatus::Timeout) {
    }
    if (s != NextStatus::Ok) break;
    checksum += b.rows;
  }
  e.close();
  std::printf("%s: %lld batches, %lld rows\n", mode.c_str(), static_cast<long long>(batches),
              static_cast<long long>(checksum));
  return 0;
}
