// The "ceiling" for bench/bench_loader.py: the plainest fast random-row gather we know how to
// write, i.e. what a loader could reach on this machine if it did nothing but copy rows.
//
// Built at run time by bench_loader.py (g++ -O3 -shared -fPIC -pthread, no -march, so the figure
// is what a portable build gets) and called through ctypes, which releases the GIL for the call.
//
// Each thread repeatedly draws one batch of random row ids (xorshift, no division), then copies
// those rows into the next of its own batch buffers (`buffers` of them, in rotation: 1 keeps the
// destination in the core's cache, which no loader that hands batches out can do), prefetching
// rows a few ids ahead. Rows are drawn with replacement (not a permutation): the ceiling pays for
// nothing but ids and the copy. Buffers live across calls, so the caller's warm-up call faults
// them in and a timed call faults nothing.
#include <algorithm>
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
  int64_t ahead;           // rows prefetched ahead of the copy
  int64_t prefetch_lines;  // most cache lines started per row (the hardware follows the rest)
  int64_t buffers;         // batch buffers per thread, written in rotation
  std::chrono::steady_clock::time_point deadline;
};

// One thread's reused memory: its batch buffers and the batch's row offsets.
struct Scratch {
  std::vector<char*> bufs;
  size_t bytes = 0;  // of each buffer
  std::vector<int64_t> offsets;
};
std::vector<Scratch> g_scratch;  // one per thread slot; calls must not overlap (ctypes: one caller)

// The copy loop. kBytes > 0 makes the row size a compile-time constant (inlined moves, as a
// loader specialises its hot sizes); kBytes == 0 takes p.row_bytes and calls memcpy.
template <int64_t kBytes>
void copy_batch(const Params& p, const int64_t* offsets, char* dst) {
  const int64_t bytes = kBytes > 0 ? kBytes : p.row_bytes;
  const int64_t ahead = std::min(p.ahead, p.batch);
  const int64_t lines = std::min(p.prefetch_lines, (bytes + kLine - 1) / kLine);  // never past the row
  const char* base = p.base;
  // Start the first rows' misses before the first copy, so every row of the batch is prefetched.
  for (int64_t i = 0; i < ahead; ++i)
    for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(base + offsets[i] + l * kLine, 0, 0);
  for (int64_t i = 0; i < p.batch; ++i) {
    if (i + ahead < p.batch) {
      const char* next = base + offsets[i + ahead];
      for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(next + l * kLine, 0, 0);
    }
    std::memcpy(dst + i * bytes, base + offsets[i], static_cast<size_t>(bytes));
  }
}

int64_t worker(const Params& p, int slot, uint64_t* checksum_out) {
  Scratch& s = g_scratch[static_cast<size_t>(slot)];
  const size_t buf_bytes = static_cast<size_t>(p.batch * p.row_bytes);
  if (s.bytes < buf_bytes || s.bufs.size() != static_cast<size_t>(p.buffers)) {
    for (char* b : s.bufs) std::free(b);
    s.bufs.assign(static_cast<size_t>(p.buffers), nullptr);
    s.bytes = buf_bytes;
    for (char*& b : s.bufs) {
      b = static_cast<char*>(std::aligned_alloc(4096, (buf_bytes + 4095) / 4096 * 4096));
      if (!b) {
        s.bytes = 0;
        return -1;
      }
      std::memset(b, 0, buf_bytes);  // fault the buffer in now, not while copying
    }
  }
  s.offsets.resize(static_cast<size_t>(p.batch));
  // Each call draws new ids: seeded from the clock so repeated calls do not replay one sequence.
  XorShift64 rng{(static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) +
                  static_cast<uint64_t>(slot + 1) * 0x9e3779b97f4a7c15ULL) | 1};
  int64_t* offsets = s.offsets.data();
  uint64_t checksum = 0;
  int64_t copied = 0;
  size_t next_buf = 0;
  for (;;) {
    char* buf = s.bufs[next_buf];
    next_buf = (next_buf + 1) % s.bufs.size();
    // The batch's ids, as byte offsets, drawn before the copy (as a loader's sampler would).
    for (int64_t i = 0; i < p.batch; ++i)
      offsets[i] = static_cast<int64_t>(below(rng.next(), static_cast<uint64_t>(p.rows))) * p.pitch;
    switch (p.row_bytes) {
      case 64: copy_batch<64>(p, offsets, buf); break;
      case 1024: copy_batch<1024>(p, offsets, buf); break;
      default: copy_batch<0>(p, offsets, buf); break;
    }
    checksum += static_cast<unsigned char>(buf[buf_bytes - 1]);  // keeps the copies observable
    copied += p.batch;
    if (std::chrono::steady_clock::now() >= p.deadline) break;  // whole batches only
  }
  *checksum_out = checksum;
  return copied;
}

}  // namespace

extern "C" {

// Copies random rows for `seconds` on `threads` threads, each into `buffers` batch buffers in
// rotation; returns the rows copied (whole batches), or -1 on bad arguments or a failed
// allocation. Row i is row_bytes bytes at base + i * pitch.
// Not reentrant: one call at a time (its per-thread buffers are kept for the next call).
int64_t ceiling_gather(const void* base, int64_t rows, int64_t pitch, int64_t row_bytes,
                       int64_t batch, int32_t threads, double seconds, int64_t ahead,
                       int64_t prefetch_lines, int64_t buffers) {
  if (!base || rows <= 0 || pitch <= 0 || row_bytes <= 0 || batch <= 0 || threads <= 0 ||
      ahead < 0 || prefetch_lines < 0 || buffers <= 0)
    return -1;
  Params p{static_cast<const char*>(base), rows, pitch, row_bytes, batch, ahead, prefetch_lines, buffers,
           std::chrono::steady_clock::now() +
               std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                   std::chrono::duration<double>(seconds))};
  if (g_scratch.size() < static_cast<size_t>(threads)) g_scratch.resize(static_cast<size_t>(threads));
  std::vector<int64_t> counts(static_cast<size_t>(threads), 0);
  std::vector<uint64_t> checksums(static_cast<size_t>(threads), 0);
  std::vector<std::thread> pool;
  for (int32_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] { counts[t] = worker(p, t, &checksums[t]); });
  for (auto& th : pool) th.join();
  int64_t total = 0;
  for (int64_t c : counts) {
    if (c < 0) return -1;
    total += c;
  }
  static volatile uint64_t sink;
  for (uint64_t c : checksums) sink = sink + c;
  return total;
}

}  // extern "C"
