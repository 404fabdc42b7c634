// The gather hot loop. Random rows miss the cache, so the loop prefetches rows a few ids ahead
// (memory-level parallelism), the batch's first rows before it starts, and copies common fixed
// sizes with inlined moves instead of calls. The loops take the row address as a function of
// the batch position: a strided column computes it inline (the single-array fast path), a
// sharded one reads it from a block of addresses resolved just before. A lazily mapped sharded
// column resolves the same block through pinned mappings (its own loop: the eager ones do not
// pay for it).
#include "core/gather.h"

#include "core/cpu_cache.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <stdexcept>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fastload {

namespace {
constexpr int64_t kPrefetchAhead = 16;
constexpr int64_t kLine = 64;

inline void prefetch_row(const std::byte* p, int64_t bytes) {
  // The first lines start the misses; the hardware prefetcher follows a row's later lines.
  const int64_t lines = bytes < 4 * kLine ? (bytes + kLine - 1) / kLine : 4;
  for (int64_t l = 0; l < lines; ++l) __builtin_prefetch(p + l * kLine, 0, 0);
}

// Row i of the batch in a strided column.
struct Strided {
  const std::byte* base;
  int64_t pitch;
  const int64_t* ids;
  const std::byte* operator()(int64_t i) const { return base + ids[i] * pitch; }
};

// Row i of the batch from addresses resolved ahead (a sharded column).
struct Resolved {
  const std::byte* const* rows;
  const std::byte* operator()(int64_t i) const { return rows[i]; }
};

template <int64_t kBytes, typename RowAt>
void gather_fixed(RowAt row, int64_t count, std::byte* dst) {
  for (int64_t i = 0; i < count && i < kPrefetchAhead; ++i) prefetch_row(row(i), kBytes);
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchAhead < count) prefetch_row(row(i + kPrefetchAhead), kBytes);
    std::memcpy(dst + i * kBytes, row(i), kBytes);
  }
}

std::atomic<bool> g_wide_copies{true};  // set_wide_row_copies (tests)

#if defined(__x86_64__)
// Rows of 128 B to 2 KiB with 32-byte moves. A portable build expands memcpy of these constant
// sizes into `rep movsq`, whose cost on a Xeon of 2026 (2 collation threads, 1 KiB rows, CPU
// time per row, bench/RESULTS.md) matched these moves when the batch buffer was in the core's
// L2 but was 12% higher when it was not (a recycled buffer the loader wrote a window ago: the
// usual case), and moved by 2x with where the linker put the loop in one test build; SSE2's
// 16-byte moves cost 30% more than either.
template <int64_t kBytes, typename RowAt>
__attribute__((target("avx2"))) void gather_fixed_avx2(RowAt row, int64_t count, std::byte* dst) {
  static_assert(kBytes % 64 == 0, "whole cache lines");
  for (int64_t i = 0; i < count && i < kPrefetchAhead; ++i) prefetch_row(row(i), kBytes);
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchAhead < count) prefetch_row(row(i + kPrefetchAhead), kBytes);
    const std::byte* src = row(i);
    std::byte* out = dst + i * kBytes;
    for (int64_t k = 0; k < kBytes; k += 64) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k + 32));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k), a);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + k + 32), b);
    }
  }
}
#endif

template <int64_t kBytes, typename RowAt>
void gather_wide(RowAt row, int64_t count, std::byte* dst) {
#if defined(__x86_64__)
  if (cpu_has_avx2() && g_wide_copies.load(std::memory_order_relaxed))
    return gather_fixed_avx2<kBytes>(row, count, dst);
#endif
  gather_fixed<kBytes>(row, count, dst);
}

#if defined(__x86_64__)
// Streaming stores write around the cache. They pay only when the destination cannot stay
// cached anyway: a batch part bigger than half the last-level cache (see
// streaming_min_part_bytes). Below that, ordinary stores win by far (0.9x against 0.65x of the
// ceiling for 16-150 KiB rows in 1-10 MB batches on a 32 MiB L3, bench/RESULTS.md): recycled
// buffers stay in the cache, so there is no read-for-ownership from DRAM and no write-back
// before the next batch reuses the lines. Above it (32-64 MiB parts) streaming is 1.1-1.4x faster.
// Rows must be long for streaming: per row it costs an unaligned head and tail.
constexpr int64_t kStreamingRowBytes = 16 * 1024;

void copy_streaming(std::byte* dst, const std::byte* src, int64_t bytes) {
  const int64_t head = static_cast<int64_t>((16 - (reinterpret_cast<uintptr_t>(dst) & 15)) & 15);
  std::memcpy(dst, src, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, static_cast<size_t>(bytes - i));
}

template <typename RowAt>
void gather_streaming(RowAt row, int64_t bytes, int64_t count, std::byte* dst) {
  for (int64_t i = 0; i < count; ++i) {
    if (i + 1 < count) prefetch_row(row(i + 1), bytes);
    copy_streaming(dst + i * bytes, row(i), bytes);
  }
  // Streaming stores are weakly ordered: make them visible before the batch is published.
  _mm_sfence();
}
#endif

template <typename RowAt>
void gather_any(RowAt row, int64_t bytes, int64_t count, std::byte* dst) {
  for (int64_t i = 0; i < count && i < kPrefetchAhead; ++i) prefetch_row(row(i), bytes);
  for (int64_t i = 0; i < count; ++i) {
    if (i + kPrefetchAhead < count) prefetch_row(row(i + kPrefetchAhead), bytes);
    std::memcpy(dst + i * bytes, row(i), static_cast<size_t>(bytes));
  }
}

template <typename RowAt>
void gather_with(RowAt row, int64_t bytes, int64_t count, std::byte* dst, bool streaming) {
  switch (bytes) {
    case 1: return gather_fixed<1>(row, count, dst);
    case 2: return gather_fixed<2>(row, count, dst);
    case 4: return gather_fixed<4>(row, count, dst);
    case 8: return gather_fixed<8>(row, count, dst);
    case 16: return gather_fixed<16>(row, count, dst);
    case 32: return gather_fixed<32>(row, count, dst);
    case 64: return gather_fixed<64>(row, count, dst);
    case 128: return gather_wide<128>(row, count, dst);
    case 256: return gather_wide<256>(row, count, dst);
    case 512: return gather_wide<512>(row, count, dst);
    case 1024: return gather_wide<1024>(row, count, dst);
    case 2048: return gather_wide<2048>(row, count, dst);
    default:
#if defined(__x86_64__)
      if (streaming && bytes >= kStreamingRowBytes) return gather_streaming(row, bytes, count, dst);
#endif
      (void)streaming;
      return gather_any(row, bytes, count, dst);
  }
}

// Sharded columns resolve this many ids to addresses at a time (on the stack), then copy them.
constexpr int64_t kBlock = 256;

// Buckets of 2^shift samples, each knowing the shard of its first sample; a lookup then steps
// over the shard ends inside its bucket (branch-free, a fixed count: the most any bucket has).
// The widest buckets whose walks are at most kMaxWalk, within a table of a few entries per shard.
void build_buckets(ArrayColumn& col) {
  constexpr int kMaxWalk = 2;
  const size_t n = col.shards.size();
  const int64_t rows = col.rows;
  if (rows <= 0 || n > std::numeric_limits<uint32_t>::max()) return;
  const size_t limit = 4 * n + 64;
  const int64_t* ends = col.starts.data() + 1;
  int shift = 62;
  while (shift > 0 && (int64_t{1} << shift) > rows / static_cast<int64_t>(n)) --shift;
  for (; shift >= 0; --shift) {
    const size_t count = static_cast<size_t>((rows - 1) >> shift) + 1;
    if (count > limit) return;  // too uneven: binary search
    std::vector<uint32_t> table(count);
    int walk = 0;
    size_t s = 0;
    for (size_t b = 0; b < count; ++b) {
      const int64_t first = static_cast<int64_t>(b) << shift;
      const int64_t last = std::min(rows, first + (int64_t{1} << shift)) - 1;
      while (ends[s] <= first) ++s;
      table[b] = static_cast<uint32_t>(s);
      size_t e = s;
      while (ends[e] <= last) ++e;
      walk = std::max(walk, static_cast<int>(e - s));
    }
    if (walk <= kMaxWalk) {
      col.buckets = std::move(table);
      col.bucket_shift = shift;
      col.bucket_walk = walk;
      return;
    }
  }
}

// The shard holding sample `id`: the number of shard ends at or before it. A branch-free binary
// search (conditional moves): shuffled ids would mispredict nearly every branch of std::upper_bound,
// which costs more than the few cache-resident loads of the search itself. Empty shards (equal
// ends) are stepped over.
inline size_t find_shard(const ArrayColumn& col, int64_t id) {
  const int64_t* ends = col.starts.data() + 1;
  if (!col.buckets.empty()) {
    size_t s = col.buckets[static_cast<size_t>(id >> col.bucket_shift)];
    for (int j = 0; j < col.bucket_walk; ++j) s += ends[s] <= id ? 1 : 0;
    return s;
  }
  const int64_t* base = ends;
  size_t n = col.shards.size();
  while (n > 1) {
    const size_t half = n / 2;
    base = base[half] <= id ? base + half : base;
    n -= half;
  }
  return static_cast<size_t>(base - ends) + (*base <= id ? 1 : 0);
}

void fill_pad(std::byte* p, int64_t bytes, const std::vector<std::byte>& pad) {
  if (bytes <= 0) return;
  const size_t n = pad.size();
  if (std::all_of(pad.begin(), pad.end(), [&](std::byte b) { return b == pad[0]; })) {
    std::memset(p, static_cast<int>(pad[0]), static_cast<size_t>(bytes));
    return;
  }
  for (int64_t k = 0; k < bytes; k += static_cast<int64_t>(n)) std::memcpy(p + k, pad.data(), n);
}

// The last pass of a ragged block (eager or lazy shards): each row's items into its slot, the
// rest of the slot padded, its length written. dst and lengths point at the block's first row.
void copy_padded_rows(const ArrayColumn& col, const std::byte* const* src, const int64_t* items, int64_t n,
                      std::byte* dst, int64_t* lengths) {
  const int64_t item = col.item_bytes, slot = col.row_bytes;
  for (int64_t i = 0; i < n; ++i) {
    std::byte* out = dst + i * slot;
    const int64_t bytes = items[i] * item;
    if (bytes) std::memcpy(out, src[i], static_cast<size_t>(bytes));
    fill_pad(out + bytes, slot - bytes, col.pad);
    lengths[i] = items[i];
  }
}

// Lazily mapped shards (set_lazy_shards). A block's distinct files are pinned together (one
// lock of the cache for the block, not one per row), copied from, and unpinned: a thread pins at
// most one block of one column at a time (kBlock files, twice that for a ragged column), and no
// more than the files' pin bound (LazyFiles::pin_bound): a block of more files is copied in runs
// of rows. Each file's rows copied are counted when it is unpinned (LazyFiles::rows_read).

// The distinct files of a run of a block's rows in first-seen order, the rows that read each, and
// per file wanted the index of its file among them: an open-addressed table of twice the block's
// rows (a power of two), cleared entry by entry after use. A sort, unique and binary search per
// row did the same in O(n log n) and were a fifth of the CPU of a cached remote dataset's epoch
// (256-row blocks over ~100 files).
class DistinctFiles {
 public:
  static constexpr int kMaxRows = 2 * kBlock;  // a ragged block asks for 2 files per row

  DistinctFiles() { std::fill(std::begin(key_), std::end(key_), -1); }

  // Rows of per_row (1 or 2) files each: want[r * per_row + j] is row r's j-th file. Takes rows from the
  // first while their files are at most `bound` distinct ones (the first row always), and returns
  // how many; ids[0, distinct) = those files, rows[k] = the rows taken that read ids[k], and
  // index[e] = where want[e] is in ids for the entries taken.
  int64_t collect(const int32_t* want, int64_t n, int per_row, int bound, int32_t* ids, int32_t* rows,
                  int16_t* index, int* distinct_out) {
    int distinct = 0;
    int used = 0;
    int64_t r = 0;
    for (; r < n; ++r) {
      const int32_t* files = want + r * per_row;
      // Of this row's files (one or two), those not seen in the run yet: one probe for the first,
      // whose slot stays valid until it is filled below.
      const uint32_t first = slot_of(files[0]);
      const int fresh = (key_[first] == -1) + (per_row == 2 && files[1] != files[0] && find(files[1]) < 0);
      if (r > 0 && distinct + fresh > bound) break;
      for (int j = 0; j < per_row; ++j) {
        const uint32_t h = j == 0 ? first : slot_of(files[j]);
        if (key_[h] == -1) {
          key_[h] = files[j];
          slot_[h] = static_cast<int16_t>(distinct);
          rows[distinct] = 0;
          ids[distinct++] = files[j];
          used_[used++] = static_cast<uint16_t>(h);
        }
        index[r * per_row + j] = slot_[h];
        if (j == 0 || files[j] != files[0]) ++rows[slot_[h]];
      }
    }
    for (int k = 0; k < used; ++k) key_[used_[k]] = -1;
    *distinct_out = distinct;
    return r;
  }

 private:
  static constexpr int kBits = 10;
  static constexpr int kSlots = 1 << kBits;  // at least twice kMaxRows: probes stay short
  static_assert(kSlots >= 2 * kMaxRows, "the table must stay at most half full");

  uint32_t slot_of(int32_t f) const {  // f's slot, or the empty one where it would go
    uint32_t h = (static_cast<uint32_t>(f) * 2654435761u) >> (32 - kBits);
    while (key_[h] != -1 && key_[h] != f) h = (h + 1) & (kSlots - 1);
    return h;
  }
  int find(int32_t f) const {
    const uint32_t h = slot_of(f);
    return key_[h] == -1 ? -1 : slot_[h];
  }

  int32_t key_[kSlots];
  int16_t slot_[kSlots];
  uint16_t used_[kMaxRows];
};

// Pins the files of the first rows of want[0, n * per_row) (per_row files per row; repeats
// allowed; n * per_row <= DistinctFiles::kMaxRows) that fit the files' pin bound, and returns how
// many rows that is: at[e] becomes where want[e]'s data start for their entries. ids, rows and
// data are scratch of n * per_row entries, held by the pins until release().
int64_t pin_rows(PinnedFiles& pins, LazyFiles& files, DistinctFiles& table, const int32_t* want, int64_t n,
                 int per_row, int32_t* ids, int32_t* rows, const std::byte** data, const std::byte** at) {
  int16_t index[DistinctFiles::kMaxRows];
  int distinct = 0;
  const int64_t taken = table.collect(want, n, per_row, files.pin_bound(), ids, rows, index, &distinct);
  pins.pin(ids, distinct, data, rows);
  for (int64_t e = 0; e < taken * per_row; ++e) at[e] = data[index[e]];
  return taken;
}

// The first thing wrong with a ragged shard's offsets o[0..rows] over `items` values (they must
// run non-decreasing from 0 to items), naming the row; empty if nothing is.
std::string offsets_problem(const int64_t* o, int64_t rows, int64_t items) {
  if (o[0] != 0) return "row 0 starts at offset " + std::to_string(o[0]) + ", not 0";
  for (int64_t r = 0; r < rows; ++r) {
    if (o[r + 1] < o[r] || o[r + 1] > items)
      return "row " + std::to_string(r) + " has offsets [" + std::to_string(o[r]) + ", " + std::to_string(o[r + 1]) +
             ")" + (o[r + 1] < o[r] ? ", decreasing" : ", past the shard's " + std::to_string(items) + " values");
  }
  if (o[rows] != items)
    return "its last row ends at offset " + std::to_string(o[rows]) + ", not at its " + std::to_string(items) + " values' end";
  return "";
}

// "ragged column r, shard 3 (file)": where a shard's problem is.
std::string ragged_shard_text(const ArrayColumn& col, size_t shard, const std::string& file) {
  const int64_t given = col.shard_index.empty() ? static_cast<int64_t>(shard) : col.shard_index[shard];
  std::string label = file;
  if (label.empty() && given < static_cast<int64_t>(col.shard_labels.size())) label = col.shard_labels[given];
  return "ragged column " + col.name + ", shard " + std::to_string(given) + (label.empty() ? "" : " (" + label + ")");
}

// A lazy ragged shard's offsets, checked the first time its file is mapped (from then on its
// identity is checked at every mapping): from 0 to its items, non-decreasing, and no row longer
// than col.longest (a longer row would be cut to the slot without a word).
void check_lazy_offsets(const ArrayColumn& col, size_t shard, const int64_t* o, const LazyFile& f) {
  const Shard& sh = col.shards[shard];
  const std::string problem = offsets_problem(o, sh.rows, sh.items);
  if (!problem.empty())
    throw std::invalid_argument(ragged_shard_text(col, shard, f.path) + ": offsets are not non-decreasing from 0 to " +
                                std::to_string(sh.items) + ": " + problem + " (found when the shard was mapped; a "
                                "corrupt offsets file?)");
  int64_t longest = 0, at = 0;
  for (int64_t r = 0; r < sh.rows; ++r) {
    const int64_t step = o[r + 1] - o[r];
    if (step > longest) longest = step, at = r;
  }
  if (col.longest >= 0 && longest > col.longest)
    throw std::invalid_argument(ragged_shard_text(col, shard, f.path) + ": row " + std::to_string(at) + " holds " +
                                std::to_string(longest) + " items, longer than the manifest's columns[].longest (" +
                                std::to_string(col.longest) + ") for column '" + col.name +
                                "': its rows would be cut without a word; fix the manifest or pass max_length");
}

[[noreturn]] void bad_offsets(const ArrayColumn& col, size_t shard, int64_t row, int64_t a, int64_t b, int64_t items) {
  throw std::invalid_argument(ragged_shard_text(col, shard, "") + ": row " + std::to_string(row) + " has offsets [" +
                              std::to_string(a) + ", " + std::to_string(b) + ") outside its " + std::to_string(items) +
                              " values (a corrupt offsets file?)");
}
}  // namespace

namespace {
constexpr int64_t kRaggedBlock = 64;

// Calls visit_block(b, n, values, items) for the rows ids[b..b+n) of each block: values[i] the
// address of row b+i's first item, items[i] its item count (offsets checked). Three passes per
// block so that the misses of each overlap: find the rows and prefetch their offsets, read (and
// check) the offsets, then the visitor (which prefetches the items it will read, then reads them).
// A lazily mapped column pins each block's files (values and offsets) while the block is visited;
// a block whose files exceed the pin bound is visited in several runs.
template <typename IdOf, typename VisitBlock>
void visit_ragged_blocks(const ArrayColumn& col, IdOf id_of, int64_t count, VisitBlock visit_block) {
  const int64_t item = col.item_bytes;
  size_t shard[kRaggedBlock];
  int64_t row[kRaggedBlock], items[kRaggedBlock];
  const std::byte* values[kRaggedBlock];
  auto read_offsets = [&](int64_t i, const int64_t* offsets, const std::byte* base) {
    const Shard& sh = col.shards[shard[i]];
    const int64_t first = offsets[row[i]], end = offsets[row[i] + 1];
    if (first < 0 || end < first || end > sh.items) bad_offsets(col, shard[i], row[i], first, end, sh.items);
    items[i] = end - first;
    values[i] = base + first * item;
  };
  if (!col.lazy) {
    for (int64_t b = 0; b < count; b += kRaggedBlock) {
      const int64_t n = std::min(kRaggedBlock, count - b);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t id = id_of(b + i);
        const size_t s = find_shard(col, id);
        shard[i] = s;
        row[i] = id - col.starts[s];
        __builtin_prefetch(col.shards[s].offsets + row[i], 0, 0);
      }
      for (int64_t i = 0; i < n; ++i) read_offsets(i, col.shards[shard[i]].offsets, col.shards[shard[i]].base);
      visit_block(b, n, values, items);
    }
    return;
  }
  LazyFiles& files = *col.lazy;
  PinnedFiles pins(files);
  DistinctFiles table;
  const int64_t* offsets[kRaggedBlock];
  // Per row: its values file, then its offsets file.
  int32_t want[2 * kRaggedBlock], distinct[2 * kRaggedBlock], reads[2 * kRaggedBlock];
  const std::byte* data[2 * kRaggedBlock];
  const std::byte* at[2 * kRaggedBlock];
  for (int64_t b = 0; b < count; b += kRaggedBlock) {
    const int64_t n = std::min(kRaggedBlock, count - b);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = id_of(b + i);
      const size_t s = find_shard(col, id);
      shard[i] = s;
      row[i] = id - col.starts[s];
      want[2 * i] = col.lazy_file[s];
      want[2 * i + 1] = col.lazy_offsets_file[s];
    }
    for (int64_t r = 0; r < n;) {  // one run of rows when the block's files fit the pin bound
      const int64_t taken = pin_rows(pins, files, table, want + 2 * r, n - r, 2, distinct, reads, data, at);
      for (int64_t i = r; i < r + taken; ++i) {
        offsets[i] = reinterpret_cast<const int64_t*>(at[2 * (i - r) + 1]);
        const int32_t f = want[2 * i + 1];
        if (!files.checked(f)) {
          check_lazy_offsets(col, shard[i], offsets[i], files.file(f));
          files.set_checked(f);
        }
        __builtin_prefetch(offsets[i] + row[i], 0, 0);
      }
      for (int64_t i = r; i < r + taken; ++i) read_offsets(i, offsets[i], at[2 * (i - r)]);
      visit_block(b + r, taken, values + r, items + r);
      pins.release();
      r += taken;
    }
  }
}
}  // namespace

namespace {
void gather_rows_lazy(const ArrayColumn& col, const int64_t* ids, int64_t count, std::byte* dst, bool streaming) {
  PinnedFiles pins(*col.lazy);
  DistinctFiles table;
  const std::byte* rows[kBlock];
  const std::byte* data[kBlock];
  int32_t want[kBlock], distinct[kBlock], reads[kBlock];
  int64_t within[kBlock];
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t n = std::min(kBlock, count - b);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[b + i];
      const size_t s = find_shard(col, id);
      want[i] = col.lazy_file[s];
      within[i] = (id - col.starts[s]) * col.shards[s].pitch;
    }
    for (int64_t r = 0; r < n;) {  // one run of rows when the block's files fit the pin bound
      const int64_t taken = pin_rows(pins, *col.lazy, table, want + r, n - r, 1, distinct, reads, data, rows + r);
      for (int64_t i = r; i < r + taken; ++i) rows[i] += within[i];
      gather_with(Resolved{rows + r}, col.row_bytes, taken, dst + (b + r) * col.row_bytes, streaming);
      pins.release();
      r += taken;
    }
  }
}

// set_shards and set_lazy_shards: checks the table and installs it. files/offsets_files are
// empty for mapped shards, else one entry per shard.
void install_shards(ArrayColumn& col, std::vector<Shard> shards, std::shared_ptr<LazyFiles> lazy,
                    std::vector<int32_t> files, std::vector<int32_t> offsets_files) {
  const std::string what = "column " + col.name + ": ";
  if (col.row_bytes < 0) throw std::invalid_argument(what + "negative row bytes");
  if (col.ragged) {
    if (col.item_bytes <= 0 || col.row_bytes % col.item_bytes != 0)
      throw std::invalid_argument(what + "ragged slot of " + std::to_string(col.row_bytes) +
                                  " bytes is not a whole number of " + std::to_string(col.item_bytes) + "-byte items");
    if (col.pad.empty() || col.item_bytes % static_cast<int64_t>(col.pad.size()) != 0)
      throw std::invalid_argument(what + "pad value of " + std::to_string(col.pad.size()) +
                                  " bytes does not divide an item of " + std::to_string(col.item_bytes));
  }
  const bool is_lazy = lazy != nullptr;
  if (is_lazy && (files.size() != shards.size() || (col.ragged && offsets_files.size() != shards.size())))
    throw std::invalid_argument(what + "lazily mapped shards need a file per shard");
  std::vector<int64_t> starts{0};
  for (size_t s = 0; s < shards.size(); ++s) {
    const Shard& sh = shards[s];
    const std::string which = what + "shard " + std::to_string(s) + " ";
    if (sh.rows < 0 || sh.pitch < 0) throw std::invalid_argument(which + "has negative rows or pitch");
    if (sh.rows > std::numeric_limits<int64_t>::max() - starts.back())
      throw std::invalid_argument(what + "the shards' rows overflow");
    if (col.ragged) {
      if (sh.pitch != col.item_bytes)
        throw std::invalid_argument(which + "values are not contiguous items of " + std::to_string(col.item_bytes) + " bytes");
      if (sh.items < 0 || (!is_lazy && sh.rows > 0 && !sh.offsets)) throw std::invalid_argument(which + "has no offsets");
    }
    if (is_lazy) {
      // The mapped data must hold what the rows read: the file's size is checked when mapped.
      auto file_of = [&](int32_t id) -> const LazyFile& {
        if (id < 0 || static_cast<size_t>(id) >= lazy->size())
          throw std::invalid_argument(which + "names file " + std::to_string(id) + " of " + std::to_string(lazy->size()));
        return lazy->file(id);
      };
      const LazyFile& f = file_of(files[s]);
      const int64_t need = col.ragged ? sh.items * col.item_bytes
                                      : (sh.rows > 0 ? (sh.rows - 1) * sh.pitch + col.row_bytes : 0);
      if (f.bytes < need)
        throw std::invalid_argument(which + "needs " + std::to_string(need) + " bytes of " + f.path + ", which holds " +
                                    std::to_string(f.bytes));
      if (col.ragged) {
        const LazyFile& o = file_of(offsets_files[s]);
        if (o.bytes < (sh.rows + 1) * static_cast<int64_t>(sizeof(int64_t)))
          throw std::invalid_argument(which + "needs " + std::to_string(sh.rows + 1) + " offsets in " + o.path);
      }
    } else if (sh.rows > 0 && !sh.base && (col.ragged ? sh.items > 0 : col.row_bytes > 0)) {
      throw std::invalid_argument(which + "has no data");
    }
    starts.push_back(starts.back() + sh.rows);
  }
  if (shards.empty() && col.ragged) throw std::invalid_argument(what + "a ragged column needs a shard");
  col.rows = starts.back();
  // Shards without samples are never looked up: dropping them keeps the buckets' walks short.
  std::vector<Shard> kept;
  std::vector<int64_t> index;
  std::vector<int32_t> kept_files, kept_offsets;
  for (size_t s = 0; s < shards.size(); ++s)
    if (shards[s].rows > 0) {
      kept.push_back(shards[s]);
      index.push_back(static_cast<int64_t>(s));
      if (is_lazy) kept_files.push_back(files[s]);
      if (is_lazy && col.ragged) kept_offsets.push_back(offsets_files[s]);
    }
  if (kept.empty()) {  // no samples at all: keep the first shard so the column stays well-formed
    kept.push_back(shards.empty() ? Shard{} : shards[0]);
    index.push_back(0);
    if (is_lazy && !files.empty()) kept_files.push_back(files[0]);
    if (is_lazy && col.ragged && !offsets_files.empty()) kept_offsets.push_back(offsets_files[0]);
  }
  col.shards.clear();
  col.starts.clear();
  col.shard_index.clear();
  col.buckets.clear();
  col.lazy.reset();
  col.lazy_file.clear();
  col.lazy_offsets_file.clear();
  if (kept.size() == 1 && !col.ragged && !is_lazy) {
    // One shard is a strided column: keep the fast path.
    col.base = kept[0].base;
    col.pitch = kept[0].pitch;
    return;
  }
  col.starts.assign(1, 0);
  for (const Shard& sh : kept) col.starts.push_back(col.starts.back() + sh.rows);
  col.shards = std::move(kept);
  col.shard_index = std::move(index);
  if (is_lazy) {
    for (Shard& sh : col.shards) sh.base = nullptr, sh.offsets = nullptr;
    col.lazy = std::move(lazy);
    col.lazy_file = std::move(kept_files);
    col.lazy_offsets_file = std::move(kept_offsets);
  }
  build_buckets(col);
}
}  // namespace

void set_shards(ArrayColumn& col, std::vector<Shard> shards) {
  install_shards(col, std::move(shards), nullptr, {}, {});
}

void set_lazy_shards(ArrayColumn& col, std::vector<Shard> shards, std::shared_ptr<LazyFiles> lazy,
                     std::vector<int32_t> files, std::vector<int32_t> offsets_files) {
  if (!lazy) throw std::invalid_argument("column " + col.name + ": lazily mapped shards need their files");
  install_shards(col, std::move(shards), std::move(lazy), std::move(files), std::move(offsets_files));
}

namespace {
std::atomic<int64_t> g_streaming_min_part{-1};  // -1: half the last-level cache
}  // namespace

int64_t streaming_min_part_bytes() {
  const int64_t set = g_streaming_min_part.load(std::memory_order_relaxed);
  return set >= 0 ? set : last_level_cache_bytes() / 2;
}

void set_streaming_min_part_bytes(int64_t bytes) {
  g_streaming_min_part.store(bytes < 0 ? -1 : bytes, std::memory_order_relaxed);
}

void set_wide_row_copies(bool allowed) { g_wide_copies.store(allowed, std::memory_order_relaxed); }

void gather_rows(const ArrayColumn& col, const int64_t* ids, int64_t count, std::byte* dst) {
  // Decided on the whole part, not per block: a sharded column copies it in blocks.
  const bool streaming = count * col.row_bytes >= streaming_min_part_bytes();
  if (!col.sharded()) return gather_with(Strided{col.base, col.pitch, ids}, col.row_bytes, count, dst, streaming);
  if (col.lazy) return gather_rows_lazy(col, ids, count, dst, streaming);
  const std::byte* rows[kBlock];
  for (int64_t b = 0; b < count; b += kBlock) {
    const int64_t n = std::min(kBlock, count - b);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[b + i];
      const size_t s = find_shard(col, id);
      const Shard& sh = col.shards[s];
      rows[i] = sh.base + (id - col.starts[s]) * sh.pitch;
    }
    gather_with(Resolved{rows}, col.row_bytes, n, dst + b * col.row_bytes, streaming);
  }
}

void gather_addresses(const std::byte* const* rows, int64_t row_bytes, int64_t count, std::byte* dst) {
  const bool streaming = count * row_bytes >= streaming_min_part_bytes();
  gather_with(Resolved{rows}, row_bytes, count, dst, streaming);
}

void gather_ragged(const ArrayColumn& col, const int64_t* ids, int64_t count, std::byte* dst,
                   int64_t* lengths) {
  const int64_t item = col.item_bytes, slot = col.row_bytes, cap = col.max_items();
  visit_ragged_blocks(col, [ids](int64_t i) { return ids[i]; }, count,
                      [&](int64_t b, int64_t n, const std::byte* const* values, const int64_t* items) {
                        int64_t kept[kRaggedBlock];  // rows longer than the slot are cut to it
                        for (int64_t i = 0; i < n; ++i) {
                          kept[i] = std::min(items[i], cap);
                          prefetch_row(values[i], kept[i] * item);
                        }
                        copy_padded_rows(col, values, kept, n, dst + b * slot, lengths + b);
                      });
}

void ragged_row_lengths(const ArrayColumn& col, const int64_t* ids, int64_t count, int64_t* lengths) {
  visit_ragged_blocks(col, [ids](int64_t i) { return ids[i]; }, count,
                      [lengths](int64_t b, int64_t n, const std::byte* const*, const int64_t* items) {
                        std::copy(items, items + n, lengths + b);
                      });
}

void gather_ragged_pieces(const ArrayColumn& col, const RaggedPiece* pieces, int64_t count,
                          void (*mismatch)(const ArrayColumn& col, int64_t id, int64_t items, int64_t expect)) {
  const int64_t item = col.item_bytes;
  visit_ragged_blocks(col, [pieces](int64_t i) { return pieces[i].id; }, count,
                      [&](int64_t b, int64_t n, const std::byte* const* values, const int64_t* items) {
                        for (int64_t i = 0; i < n; ++i) {
                          const RaggedPiece& p = pieces[b + i];
                          if (items[i] != p.expect) mismatch(col, p.id, items[i], p.expect);
                          if (p.count > 0)
                            std::memcpy(p.dst, values[i] + p.first * item, static_cast<size_t>(p.count * item));
                        }
                      });
}

}  // namespace fastload

namespace fastload {

void fill_pattern(std::byte* p, int64_t bytes, const std::vector<std::byte>& pattern) {
  if (bytes <= 0) return;
  const int64_t n = static_cast<int64_t>(pattern.size());
  if (std::all_of(pattern.begin(), pattern.end(), [&](std::byte b) { return b == pattern[0]; })) {
    std::memset(p, static_cast<int>(pattern[0]), static_cast<size_t>(bytes));
    return;
  }
  for (int64_t k = 0; k < bytes; k += n) std::memcpy(p + k, pattern.data(), static_cast<size_t>(std::min(n, bytes - k)));
}

}  // namespace fastload
