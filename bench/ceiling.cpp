// The "ceiling" for bench/bench_loader.py: the plainest fast random-row gather we know how to
// write, i.e. what a loader could reach on this machine if it did nothing but copy rows.
//
// Built at run time by bench_loader.py (g++ -O3 -shared -fPIC -pthread, no -march so the figure
// is what a portable build gets) and called through ctypes, which releases the GIL for the call.
//
// Each thread repeatedly: draws one batch of random row ids (xorshift, no division), then copies
// those rows into its own batch buffer, prefetching rows a few ids ahead. The buffer is allocated
// and touched once per thread, so no page faults happen in the timed loop. Rows are drawn with
// replacement (not a permutation): the ceiling must not pay for anything but the copy.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kLine = 64;

// xorshift64: three shifts and xors per id; quality is ample for picking rows.
struct XorShift64 {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// Uniform-enough id in [0, n) by a multiply-high (Lemire's reduction): no division per id.
inline uint64_t below(uint64_t r, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(r) * n) >> 64);
}

struct Params {
  const char* base;
  int64_t rows, pitch, row_bytes, batch;
  int64_t ahead;         // rows prefetched ahead of the copy
  int64_t prefetch_lines;  // cache lines prefetched per row (the hardware follows the rest)
  std::chrono::steady_clock::time_point deadline;
};

inline void prefetch_row(const char* p, int64_t lines) {
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(p + l * kLine, 0, 0);
}

// The copy loop; kBytes > 0 makes the row size a compile-time constant (inlined moves, as a
// real loader specialises its hot sizes), kBytes == 0 uses p.row_bytes through memcpy.
template <int64_t kBytes>
void copy_batch(const Params& p, const int64_t* offsets, char* dst) {
  const int64_t bytes = kBytes > 0 ? kBytes : p.row_bytes;
  const int64_t ahead = std::min(p.ahead, p.batch);
  // Start the first misses before the first copy, so every row of the batch is prefetched.
  for (int64_t i = 0; i < ahead; ++i) prefetch_row(p.base + offsets[i], p.prefetch_lines);
  for (int64_t i = 0; i < p.batch; ++i) {
    if (i + ahead < p.batch) prefetch_row(p.base + offsets[i + ahead], p.prefetch_lines);
    std::memcpy(dst + i * bytes, p.base + offsets[i], static_cast<size_t>(bytes));
  }
}

int64_t worker(const Params& p, uint64_t seed, std::atomic<uint64_t>* sink) {
  XorShift64 rng{seed * 0x9e3779b97f4a7c15ULL + 0x2545f4914f6cdd1dULL};
  std::vector<int64_t> offsets(static_cast<size_t>(p.batch));
  const size_t buf_bytes = static_cast<size_t>(p.batch * p.row_bytes);
  char* buf = static_cast<char*>(std::aligned_alloc(4096, (buf_bytes + 4095) / 4096 * 4096));
  if (!buf) return -1;
  std::memset(buf, 0, buf_bytes);  // fault the reused buffer in before timing starts
  uint64_t checksum = 0;
  int64_t copied = 0;
  for (;;) {
    // The ids of one batch, as byte offsets, drawn before the copy (as a loader's sampler would).
    for (int64_t i = 0; i < p.batch; ++i)
      offsets[i] = static_cast<int64_t>(below(rng.next(), static_cast<uint64_t>(p.rows))) * p.pitch;
    switch (p.row_bytes) {
      case 64: copy_batch<64>(p, offsets.data(), buf); break;
      case 1024: copy_batch<1024>(p, offsets.data(), buf); break;
      default: copy_batch<0>(p, offsets.data(), buf); break;
    }
    checksum += static_cast<unsigned char>(buf[buf_bytes - 1]);  // keeps the copies observable
    copied += p.batch;
    if (std::chrono::steady_clock::now() >= p.deadline) break;  // whole batches only
  }
  sink->fetch_add(checksum, std::memory_order_relaxed);
  std::free(buf);
  return copied;
}

std::atomic<uint64_t> g_sink{0};

}  // namespace

extern "C" {

// Copies random rows for `seconds` on `threads` threads; returns the rows copied (whole batches),
// or -1 on bad arguments / allocation failure. Row i is row_bytes bytes at base + i * pitch.
int64_t ceiling_gather(const void* base, int64_t rows, int64_t pitch, int64_t row_bytes,
                       int64_t batch, int32_t threads, double seconds, int64_t ahead,
                       int64_t prefetch_lines) {
  if (!base || rows <= 0 || pitch <= 0 || row_bytes <= 0 || batch <= 0 || threads <= 0 ||
      ahead < 0 || prefetch_lines < 0)
    return -1;
  Params p{static_cast<const char*>(base), rows, pitch, row_bytes, batch, ahead, prefetch_lines,
           std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(seconds))};
  std::vector<int64_t> counts(static_cast<size_t>(threads), 0);
  std::vector<std::thread> pool;
  for (int32_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { counts[t] = worker(p, static_cast<uint64_t>(t) + 1, &g_sink); });
  for (auto& th : pool) th.join();
  int64_t total = 0;
  for (int64_t c : counts) {
    if (c < 0) return -1;
    total += c;
  }
  return total;
}

}  // extern "C"
