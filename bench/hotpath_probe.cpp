// Where the array hot path's CPU goes, without Python: the CPU time per row (all threads) of
// the core's pieces beside a plain copy loop, in interleaved rounds over one .npy file of rows.
//
//   g++ -std=c++17 -O3 -pthread -Icsrc bench/hotpath_probe.cpp csrc/core/*.cpp -o /tmp/hotpath_probe
//   /tmp/hotpath_probe bench/data/rows1k_1572864.npy 1024 256 1 5 ceil:16:4:1 gather:1 gather:34 engine:32
//     (FILE ROW_BYTES BATCH SECONDS ROUNDS MODE...)
//
// Modes, each on 2 threads:
//   ceil:AHEAD:LINES:BUFFERS  bench/ceiling.cpp's loop: xorshift ids, LINES cache lines of each row
//                             prefetched AHEAD rows ahead, BUFFERS batch buffers per thread in turn
//   gather:BUFFERS            the epoch's permutation ids and gather_rows (the loader's copy), into
//                             BUFFERS buffers per thread in turn: the copy without the pipeline
//   engine:PREFETCH           an Engine (2 collation threads, prefetch PREFETCH) and this thread
//                             taking its batches and dropping them: the pipeline without Python
// CPU time per row moves far less than throughput when other processes share the machine, so it
// is what this prints first; a buffer count shows what a destination outside the core's cache
// costs (bench/RESULTS.md, issue 22).
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/engine.h"
#include "core/gather.h"
#include "core/sampler.h"

using namespace fastload;

namespace {

const std::byte* g_base;
int64_t g_rows, g_row_bytes, g_batch;

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t xorshift(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

std::vector<std::byte*> buffers(int n) {
  std::vector<std::byte*> bufs(static_cast<size_t>(n));
  const size_t bytes = static_cast<size_t>(g_batch * g_row_bytes);
  for (auto& b : bufs) {
    b = static_cast<std::byte*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
    std::memset(b, 0, bytes);  // faulted in before timing
  }
  return bufs;
}

ArrayColumn column() {
  ArrayColumn c;
  c.name = "x";
  c.dtype = DType{kUInt, 8};
  c.row_shape = {g_row_bytes};
  c.base = g_base;
  c.rows = g_rows;
  c.pitch = c.row_bytes = g_row_bytes;
  return c;
}

SamplerConfig sampler() {
  SamplerConfig cfg;
  cfg.num_samples = g_rows;
  cfg.batch_size = g_batch;
  cfg.shuffle = true;
  cfg.drop_last = true;
  return cfg;
}

// Rows copied by two threads running `body(thread, deadline)`.
template <typename F>
int64_t on_two_threads(double seconds, F body) {
  std::atomic<int64_t> total{0};
  const double end = wall_seconds() + seconds;
  std::vector<std::thread> pool;
  for (int t = 0; t < 2; ++t) pool.emplace_back([&, t] { total += body(t, end); });
  for (auto& th : pool) th.join();
  return total;
}

int64_t ceiling(double seconds, int ahead, int lines, int nbuf) {
  return on_two_threads(seconds, [&](int t, double end) {
    std::vector<std::byte*> bufs = buffers(nbuf);
    std::vector<int64_t> off(static_cast<size_t>(g_batch));
    uint64_t s = (0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(t + 1)) | 1;
    int64_t n = 0;
    size_t k = 0;
    const char* base = reinterpret_cast<const char*>(g_base);
    do {
      for (auto& o : off)
        o = static_cast<int64_t>((static_cast<unsigned __int128>(xorshift(s)) * static_cast<uint64_t>(g_rows)) >> 64) *
            g_row_bytes;
      char* dst = reinterpret_cast<char*>(bufs[k]);
      k = (k + 1) % bufs.size();
      for (int64_t i = 0; i < std::min<int64_t>(ahead, g_batch); ++i)
        for (int l = 0; l < lines; ++l) __builtin_prefetch(base + off[i] + l * 64, 0, 0);
      for (int64_t i = 0; i < g_batch; ++i) {
        if (i + ahead < g_batch)
          for (int l = 0; l < lines; ++l) __builtin_prefetch(base + off[i + ahead] + l * 64, 0, 0);
        if (g_row_bytes == 1024)
          std::memcpy(dst + i * 1024, base + off[i], 1024);
        else
          std::memcpy(dst + i * g_row_bytes, base + off[i], static_cast<size_t>(g_row_bytes));
      }
      n += g_batch;
    } while (wall_seconds() < end);
    for (auto b : bufs) std::free(b);
    return n;
  });
}

int64_t gather(double seconds, int nbuf) {
  const ArrayColumn c = column();
  const EpochPlan plan(sampler(), 0, 0);
  std::atomic<int64_t> step{0};
  return on_two_threads(seconds, [&](int, double end) {
    std::vector<std::byte*> bufs = buffers(nbuf);
    std::vector<int64_t> ids(static_cast<size_t>(g_batch));
    int64_t n = 0;
    size_t k = 0;
    do {
      BatchRows rows;
      rows.ids = ids.data();
      plan.fill(step.fetch_add(1) % plan.num_batches(), rows);
      gather_rows(c, ids.data(), g_batch, bufs[k]);
      k = (k + 1) % bufs.size();
      n += g_batch;
    } while (wall_seconds() < end);
    for (auto b : bufs) std::free(b);
    return n;
  });
}

int64_t engine(double seconds, int prefetch) {
  EngineOptions o;
  o.num_threads = 2;
  o.prefetch = prefetch;
  o.batch_size = g_batch;
  Engine e(std::vector<ArrayColumn>{column()}, o);
  int64_t n = 0, epoch = 0;
  const double end = wall_seconds() + seconds;
  for (bool done = false; !done;) {
    auto p = e.start(std::vector<EpochPlan>{EpochPlan(sampler(), epoch++, 0)});
    for (;;) {
      Batch b;
      NextStatus s;
      while ((s = p->next(0, std::chrono::milliseconds(100), &b)) == NextStatus::Timeout) {
      }
      if (s != NextStatus::Ok) break;
      n += b.rows;
      if (wall_seconds() >= end) {
        done = true;
        break;
      }
    }
  }
  e.close();
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 7) {
    std::fprintf(stderr, "usage: %s FILE.npy ROW_BYTES BATCH SECONDS ROUNDS MODE...\n", argv[0]);
    return 2;
  }
  const int fd = open(argv[1], O_RDONLY);
  if (fd < 0) return std::perror(argv[1]), 1;
  const off_t size = lseek(fd, 0, SEEK_END);
  void* map = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (map == MAP_FAILED) return std::perror("mmap"), 1;
  constexpr int64_t kHeader = 128;  // a .npy header of the benchmark's files
  g_row_bytes = std::atoll(argv[2]);
  g_batch = std::atoll(argv[3]);
  g_base = static_cast<const std::byte*>(map) + kHeader;
  g_rows = (size - kHeader) / g_row_bytes;
  const double seconds = std::atof(argv[4]);
  const int rounds = std::atoi(argv[5]);
  std::vector<std::string> modes(argv + 6, argv + argc);
  std::vector<std::vector<double>> rate(modes.size()), cpu(modes.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t k = 0; k < modes.size(); ++k) {
      const size_t m = (k + static_cast<size_t>(r)) % modes.size();  // the order rotates each round
      const char* mode = modes[m].c_str();
      int a = 0, l = 0, b = 0;
      const double c0 = cpu_seconds(), w0 = wall_seconds();
      int64_t n = 0;
      if (std::sscanf(mode, "ceil:%d:%d:%d", &a, &l, &b) == 3) n = ceiling(seconds, a, l, b);
      else if (std::sscanf(mode, "gather:%d", &b) == 1) n = gather(seconds, b);
      else if (std::sscanf(mode, "engine:%d", &b) == 1) n = engine(seconds, b);
      else return std::fprintf(stderr, "unknown mode %s\n", mode), 2;
      rate[m].push_back(static_cast<double>(n) / (wall_seconds() - w0));
      cpu[m].push_back((cpu_seconds() - c0) / static_cast<double>(n) * 1e9);
    }
  for (size_t k = 0; k < modes.size(); ++k) {
    std::sort(rate[k].begin(), rate[k].end());
    std::sort(cpu[k].begin(), cpu[k].end());
    std::printf("%-16s CPU per row: median %.1f ns (min %.1f, max %.1f); rows/s median %.3g M\n", modes[k].c_str(),
                cpu[k][cpu[k].size() / 2], cpu[k].front(), cpu[k].back(), rate[k][rate[k].size() / 2] / 1e6);
  }
  return 0;
}
