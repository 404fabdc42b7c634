// Tests of row gathering (core/gather.h) and of the cache-size reading that picks its copy
// (core/cpu_cache.h).
// Built and run under ThreadSanitizer and AddressSanitizer + UBSan by tests/cpp/run_sanitizers.sh.
#include "core/cpu_cache.h"
#include "core/gather.h"
#include "core_fixtures.h"

// ================================================================ gather

namespace {
// Gathers ids[0..count) from `src` (rows of row_bytes every pitch bytes) and compares each row
// with its source; also checks nothing is written past the batch.
bool gathers_exactly(const std::vector<uint8_t>& src, int64_t rows, int64_t pitch, int64_t row_bytes,
                     const int64_t* ids, int64_t count) {
  ArrayColumn c;
  c.name = "c";
  c.base = reinterpret_cast<const std::byte*>(src.data());
  c.rows = rows;
  c.pitch = pitch;
  c.row_bytes = row_bytes;
  std::vector<uint8_t> dst(static_cast<size_t>(count * row_bytes) + 1, 0xEE);
  gather_rows(c, ids, count, reinterpret_cast<std::byte*>(dst.data()));
  bool ok = dst.back() == 0xEE;
  for (int64_t i = 0; i < count; ++i)
    ok &= std::memcmp(dst.data() + i * row_bytes, src.data() + ids[i] * pitch, static_cast<size_t>(row_bytes)) == 0;
  return ok;
}
}  // namespace

TEST_CASE(gather_rows_every_size_and_overlapping_windows) {
  // Every size the copy specialises (128 B to 2 KiB: AVX2 moves where the CPU has them, and the
  // baseline copy) and sizes between them.
  std::mt19937_64 rng(7);
  for (bool wide : {true, false}) {
    set_wide_row_copies(wide);
    for (int64_t row_bytes : {1, 2, 3, 4, 8, 16, 24, 32, 64, 100, 128, 256, 300, 512, 1000, 1024, 2048, 2050}) {
      for (int64_t pitch : {row_bytes, row_bytes + 5, std::max<int64_t>(1, row_bytes / 2)}) {
        const int64_t rows = 97;
        std::vector<uint8_t> src(static_cast<size_t>((rows - 1) * pitch + row_bytes));
        for (auto& x : src) x = static_cast<uint8_t>(rng());
        std::vector<int64_t> ids(300);
        for (auto& id : ids) id = static_cast<int64_t>(rng() % rows);
        ids[0] = rows - 1;  // the last row ends at the end of the source
        for (int64_t count : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{300}})
          CHECK_MSG(gathers_exactly(src, rows, pitch, row_bytes, ids.data(), count),
                    "wide=" << wide << " row_bytes=" << row_bytes << " pitch=" << pitch << " count=" << count);
      }
    }
  }
  set_wide_row_copies(true);
}

TEST_CASE(gather_rows_large_rows_with_and_without_streaming_stores) {
  // Both copies of long rows, with odd sizes and pitches (unaligned heads and tails), and the
  // threshold that picks between them.
  std::mt19937_64 rng(11);
  for (int64_t threshold : {int64_t{0}, int64_t{1} << 40}) {
    set_streaming_min_part_bytes(threshold);
    for (int64_t row_bytes : {int64_t{16384}, int64_t{16391}, int64_t{40001}}) {
      const int64_t rows = 9, pitch = row_bytes + 3;
      std::vector<uint8_t> src(static_cast<size_t>(rows * pitch));
      for (auto& x : src) x = static_cast<uint8_t>(rng());
      const std::vector<int64_t> ids = {8, 0, 3, 3, 7, 1};
      CHECK_MSG(gathers_exactly(src, rows, pitch, row_bytes, ids.data(), static_cast<int64_t>(ids.size())),
                "threshold=" << threshold << " row_bytes=" << row_bytes);
    }
  }
  set_streaming_min_part_bytes(-1);
  CHECK(streaming_min_part_bytes() == last_level_cache_bytes() / 2);
}

TEST_CASE(cache_sizes_parse_as_sysfs_writes_them) {
  CHECK(parse_cache_size("32768K\n") == int64_t{32} << 20);
  CHECK(parse_cache_size("1M") == int64_t{1} << 20);
  CHECK(parse_cache_size("2G") == int64_t{2} << 30);
  CHECK(parse_cache_size("512") == 512);
  CHECK(parse_cache_size("") == 0);
  CHECK(parse_cache_size("K") == 0);
  CHECK(parse_cache_size(nullptr) == 0);
  CHECK(last_level_cache_bytes() > 0);
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_gather"); }
