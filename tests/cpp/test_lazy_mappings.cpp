// Lazily mapped files (core/lazy_mappings.h) and the gather through them (core/gather.h), under
// ThreadSanitizer and AddressSanitizer (tests/cpp/run_sanitizers.sh): concurrent pin, unpin and
// eviction against a small budget, identity checks, and gathers compared with the same rows read
// from memory.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <set>
#include <stdexcept>

#include "core/gather.h"
#include "core/lazy_mappings.h"
#include "harness.h"

using namespace fastload;

namespace {

// A scratch directory, removed with its files.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/fastload-lazy-XXXXXX";
    const char* d = ::mkdtemp(tmpl);
    if (!d) throw std::runtime_error("mkdtemp failed");
    path_ = d;
  }
  ~TempDir() {
    for (const std::string& f : files_) ::unlink(f.c_str());
    ::rmdir(path_.c_str());
  }
  std::string file(const std::string& name) {
    files_.insert(path_ + "/" + name);
    return path_ + "/" + name;
  }

 private:
  std::string path_;
  std::set<std::string> files_;
};

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

LazyFile describe(const std::string& path, int64_t offset, int64_t bytes) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw std::runtime_error("cannot stat " + path);
  LazyFile f;
  f.path = path;
  f.offset = offset;
  f.bytes = bytes;
  f.identity = {static_cast<int64_t>(st.st_dev), static_cast<int64_t>(st.st_ino),
                static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                static_cast<int64_t>(st.st_size)};
  return f;
}

// File k: a 16-byte header, then `rows` rows of 8 bytes, byte j of row r = k * 31 + r * 7 + j.
constexpr int64_t kHeader = 16;
uint8_t byte_of(int64_t file, int64_t row, int64_t j) { return static_cast<uint8_t>(file * 31 + row * 7 + j); }

std::vector<LazyFile> make_files(TempDir& dir, int n, int64_t rows) {
  std::vector<LazyFile> files;
  for (int k = 0; k < n; ++k) {
    std::vector<uint8_t> bytes(static_cast<size_t>(kHeader + rows * 8), 0xAB);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < 8; ++j) bytes[static_cast<size_t>(kHeader + r * 8 + j)] = byte_of(k, r, j);
    const std::string path = dir.file("f" + std::to_string(k) + ".bin");
    write_file(path, bytes);
    files.push_back(describe(path, kHeader, rows * 8));
  }
  return files;
}

// Column "x": the 8-byte rows of make_files' `files` files of `rows` rows each, one shard a file,
// mapped on demand through `lazy`.
ArrayColumn lazy_column(const std::shared_ptr<LazyFiles>& lazy, int files, int64_t rows) {
  ArrayColumn col;
  col.name = "x";
  col.dtype = {1, 8};
  col.row_shape = {8};
  col.row_bytes = 8;
  std::vector<Shard> shards(static_cast<size_t>(files), Shard{nullptr, rows, 8, nullptr, 0});
  std::vector<int32_t> ids(static_cast<size_t>(files));
  for (int k = 0; k < files; ++k) ids[static_cast<size_t>(k)] = k;
  set_lazy_shards(col, shards, lazy, ids, {});
  return col;
}

// How many bytes of `out` (the 8-byte rows gathered for `sample` from lazy_column) differ from
// what make_files wrote for them.
int64_t wrong_bytes(const std::vector<int64_t>& sample, const std::vector<uint8_t>& out, int64_t rows) {
  int64_t wrong = 0;
  for (size_t i = 0; i < sample.size(); ++i)
    for (int64_t j = 0; j < 8; ++j)
      if (out[i * 8 + static_cast<size_t>(j)] != byte_of(sample[i] / rows, sample[i] % rows, j)) ++wrong;
  return wrong;
}

// Ragged: shard k (of 12) has 3 rows of k % 4 items (one byte each, item v of the shard is
// k * 10 + v), its values and its offsets in two files.
struct RaggedFiles {
  std::vector<LazyFile> files;
  std::vector<Shard> shards;
  std::vector<int32_t> values_ids, offsets_ids;
};

RaggedFiles ragged_files(TempDir& dir) {
  RaggedFiles out;
  for (int k = 0; k < 12; ++k) {
    const int64_t rows = 3, len = k % 4, items = rows * len;
    std::vector<uint8_t> values(static_cast<size_t>(items));
    for (int64_t v = 0; v < items; ++v) values[static_cast<size_t>(v)] = static_cast<uint8_t>(k * 10 + v);
    std::vector<uint8_t> offsets((rows + 1) * 8);
    for (int64_t r = 0; r <= rows; ++r) {
      const int64_t o = r * len;
      std::memcpy(offsets.data() + r * 8, &o, 8);
    }
    const std::string vp = dir.file("v" + std::to_string(k)), op = dir.file("o" + std::to_string(k));
    write_file(vp, values);
    write_file(op, offsets);
    out.values_ids.push_back(static_cast<int32_t>(out.files.size()));
    out.files.push_back(describe(vp, 0, items));
    out.offsets_ids.push_back(static_cast<int32_t>(out.files.size()));
    out.files.push_back(describe(op, 0, (rows + 1) * 8));
    out.shards.push_back({nullptr, rows, 1, nullptr, items});
  }
  return out;
}

// Column "r" over ragged_files, slots of 3 items padded with 0xFF, rows up to `longest` items.
ArrayColumn ragged_column(const RaggedFiles& rf, const std::shared_ptr<LazyFiles>& lazy, int64_t longest) {
  ArrayColumn r;
  r.name = "r";
  r.dtype = {1, 8};
  r.row_shape = {3};
  r.row_bytes = 3;
  r.ragged = true;
  r.item_bytes = 1;
  r.pad = {std::byte{0xFF}};
  r.longest = longest;
  set_lazy_shards(r, rf.shards, lazy, rf.values_ids, rf.offsets_ids);
  return r;
}

// Rows of ragged_column gathered for `rs` (ids: shard * 3 + row) that differ from what was written.
int64_t ragged_rows_wrong(const std::vector<int64_t>& rs, const std::vector<uint8_t>& slots,
                          const std::vector<int64_t>& lengths) {
  int64_t wrong = 0;
  for (size_t i = 0; i < rs.size(); ++i) {
    const int64_t k = rs[i] / 3, row = rs[i] % 3, len = k % 4;
    bool same = lengths[i] == len;
    for (int64_t j = 0; j < 3; ++j)
      same &= slots[i * 3 + static_cast<size_t>(j)] == (j < len ? static_cast<uint8_t>(k * 10 + row * len + j) : 0xFF);
    wrong += !same;
  }
  return wrong;
}

}  // namespace

TEST_CASE(lazy_mappings_concurrent_pin_unpin_and_eviction_stay_within_budget_plus_pins) {
  TempDir dir;
  constexpr int kFiles = 48, kThreads = 4;
  constexpr int64_t kRows = 64;
  auto cache = std::make_shared<MappingCache>(8);
  auto files = std::make_shared<LazyFiles>(cache, make_files(dir, kFiles, kRows));
  std::atomic<int64_t> bad{0};
  std::atomic<int64_t> over{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) + 1);
      for (int round = 0; round < 400; ++round) {
        // A block's distinct files, as gather pins them.
        std::set<int32_t> pick;
        const int want = 1 + static_cast<int>(rng() % 6);
        while (static_cast<int>(pick.size()) < want) pick.insert(static_cast<int32_t>(rng() % kFiles));
        std::vector<int32_t> ids(pick.begin(), pick.end());
        std::vector<const std::byte*> data(ids.size());
        PinnedFiles pins(*files);
        pins.pin(ids.data(), static_cast<int>(ids.size()), data.data());
        for (size_t k = 0; k < ids.size(); ++k) {
          const int64_t r = static_cast<int64_t>(rng() % kRows);
          for (int64_t j = 0; j < 8; ++j)
            if (static_cast<uint8_t>(data[k][r * 8 + j]) != byte_of(ids[k], r, j)) ++bad;
        }
        const MappingCache::Stats s = cache->stats();
        if (s.live > s.budget + s.pinned) ++over;
        if (rng() % 4 == 0) std::this_thread::yield();
      }  // unpinned here
    });
  }
  for (auto& th : threads) th.join();
  const MappingCache::Stats s = cache->stats();
  CHECK(bad.load() == 0);
  CHECK(over.load() == 0);
  CHECK_MSG(s.peak_excess <= 0, "peak_excess " << s.peak_excess);
  CHECK(s.pinned == 0);
  CHECK_MSG(s.live <= 8, "live " << s.live);
  CHECK_MSG(s.evictions > 0 && s.maps > kFiles, "maps " << s.maps << " evictions " << s.evictions);
  CHECK(s.maps - s.evictions == s.live);
  CHECK(s.failures == 0);
  files.reset();  // unmaps what is still mapped
  CHECK(cache->stats().live == 0);
}

TEST_CASE(lazy_mappings_all_pinned_go_over_budget_instead_of_waiting) {
  TempDir dir;
  auto cache = std::make_shared<MappingCache>(2);
  LazyFiles files(cache, make_files(dir, 5, 4));
  const int32_t ids[5] = {0, 1, 2, 3, 4};
  const std::byte* data[5];
  files.pin(ids, 5, data);
  CHECK(cache->stats().live == 5);
  CHECK(cache->stats().pinned == 5);
  for (int k = 0; k < 5; ++k) CHECK(static_cast<uint8_t>(data[k][3]) == byte_of(k, 0, 3));
  files.pin(ids + 1, 1, data);  // pins are counted: file 1 stays until both are released
  files.unpin(ids, 5);
  MappingCache::Stats s = cache->stats();
  CHECK_MSG(s.live == 2 && s.pinned == 1, "live " << s.live << " pinned " << s.pinned);
  files.unpin(ids + 1, 1);
  s = cache->stats();
  CHECK(s.live == 2 && s.pinned == 0 && s.evictions == 3 && s.peak_excess <= 0);
}

TEST_CASE(lazy_mappings_a_file_changed_since_open_is_named_and_nothing_stays_pinned) {
  TempDir dir;
  auto cache = std::make_shared<MappingCache>(4);
  std::vector<LazyFile> described = make_files(dir, 4, 8);
  const std::string other = dir.file("other.bin");
  write_file(other, std::vector<uint8_t>(kHeader + 64, 1));
  LazyFiles files(cache, described);
  const int32_t ids[3] = {0, 1, 2};
  const std::byte* data[3];
  // Replaced by another file of the same size (a rename over it): a new inode.
  if (::rename(other.c_str(), described[1].path.c_str()) != 0) throw std::runtime_error("rename failed");
  CHECK_THROWS(files.pin(ids, 3, data), std::invalid_argument, described[1].path + ": the file was replaced");
  CHECK(cache->stats().pinned == 0);  // file 0, pinned before file 1 failed, was released
  CHECK(cache->stats().failures == 1);
  // Truncated, deleted: named too.
  if (::truncate(described[2].path.c_str(), kHeader) != 0) throw std::runtime_error("truncate failed");
  CHECK_THROWS(files.pin(ids + 2, 1, data), std::invalid_argument, "truncated");
  ::unlink(described[3].path.c_str());
  const int32_t three = 3;
  CHECK_THROWS(files.pin(&three, 1, data), std::invalid_argument, described[3].path + ": the file is missing");
  // The others still map.
  files.pin(ids, 1, data);
  CHECK(static_cast<uint8_t>(data[0][9]) == byte_of(0, 1, 1));
  files.unpin(ids, 1);
  CHECK(cache->stats().pinned == 0);
}

TEST_CASE(lazy_gather_matches_the_rows_in_memory_fixed_and_ragged) {
  TempDir dir;
  constexpr int kFiles = 40;
  constexpr int64_t kRows = 5;
  auto cache = std::make_shared<MappingCache>(3);
  auto lazy = std::make_shared<LazyFiles>(cache, make_files(dir, kFiles, kRows));
  const ArrayColumn col = lazy_column(lazy, kFiles, kRows);
  CHECK(col.rows == kFiles * kRows);
  std::mt19937_64 rng(3);
  std::vector<int64_t> sample(700);
  for (auto& s : sample) s = static_cast<int64_t>(rng() % static_cast<uint64_t>(col.rows));
  std::vector<uint8_t> out(sample.size() * 8);
  gather_rows(col, sample.data(), static_cast<int64_t>(sample.size()), reinterpret_cast<std::byte*>(out.data()));
  CHECK(wrong_bytes(sample, out, kRows) == 0);
  CHECK(cache->stats().pinned == 0 && cache->stats().live <= 3);

  const RaggedFiles rf = ragged_files(dir);
  auto rlazy = std::make_shared<LazyFiles>(cache, rf.files);
  ArrayColumn r = ragged_column(rf, rlazy, 3);
  std::vector<int64_t> rs(200);
  for (auto& s : rs) s = static_cast<int64_t>(rng() % 36);
  std::vector<uint8_t> slots(rs.size() * 3);
  std::vector<int64_t> lengths(rs.size());
  gather_ragged(r, rs.data(), static_cast<int64_t>(rs.size()), reinterpret_cast<std::byte*>(slots.data()),
                lengths.data());
  CHECK(ragged_rows_wrong(rs, slots, lengths) == 0);
  CHECK(cache->stats().pinned == 0);

  // A row longer than the declared longest is named when its shard's offsets are first mapped.
  // (Shard 3 was checked at longest 3 already: a fresh LazyFiles checks again.)
  r.longest = 2;
  auto fresh = std::make_shared<LazyFiles>(cache, rf.files);
  ArrayColumn r2 = r;
  set_lazy_shards(r2, rf.shards, fresh, rf.values_ids, rf.offsets_ids);
  const int64_t row_of_shard_3 = 3 * 3;
  CHECK_THROWS(gather_ragged(r2, &row_of_shard_3, 1, reinterpret_cast<std::byte*>(slots.data()), lengths.data()),
               std::invalid_argument, "holds 3 items, longer than the manifest's columns[].longest (2)");
  // The message names the column, the shard, the file and the row.
  CHECK_THROWS(gather_ragged(r2, &row_of_shard_3, 1, reinterpret_cast<std::byte*>(slots.data()), lengths.data()),
               std::invalid_argument, "ragged column r, shard 3 (");
  CHECK_THROWS(gather_ragged(r2, &row_of_shard_3, 1, reinterpret_cast<std::byte*>(slots.data()), lengths.data()),
               std::invalid_argument, "/o3): row 0 holds 3 items");
  CHECK(cache->stats().pinned == 0);
}

TEST_CASE(lazy_gather_blocks_of_all_distinct_and_all_repeated_files) {
  // A block's distinct files are collected in a table of twice the block's rows: a block whose
  // 256 rows are 256 different files (the fullest the table gets for a fixed column), one of one
  // file repeated, and a mix, against the bytes written. Every file is pinned at most once per
  // block: with a budget of 1 nothing is over budget once the block is released.
  TempDir dir;
  constexpr int kFiles = 600;
  auto cache = std::make_shared<MappingCache>(1);
  auto lazy = std::make_shared<LazyFiles>(cache, make_files(dir, kFiles, 1));
  const ArrayColumn col = lazy_column(lazy, kFiles, 1);
  std::vector<int64_t> sample(600);
  for (size_t i = 0; i < sample.size(); ++i) sample[i] = static_cast<int64_t>((i * 7919) % kFiles);  // all distinct
  std::vector<int64_t> repeated(300, 17);
  std::mt19937_64 rng(5);
  std::vector<int64_t> mixed(1000);
  for (auto& s : mixed) s = static_cast<int64_t>(rng() % 3 == 0 ? rng() % kFiles : rng() % 4);
  for (const auto* ids : {&sample, &repeated, &mixed}) {
    std::vector<uint8_t> out(ids->size() * 8);
    gather_rows(col, ids->data(), static_cast<int64_t>(ids->size()), reinterpret_cast<std::byte*>(out.data()));
    CHECK(wrong_bytes(*ids, out, 1) == 0);
    CHECK(cache->stats().pinned == 0 && cache->stats().live <= 1);
    CHECK(cache->stats().peak_pinned <= 256);  // one block of one column at a time
  }
}

TEST_CASE(lazy_gather_under_a_pin_bound_copies_in_runs_and_counts_the_rows_read) {
  // A pin bound below a block's distinct files: the block is copied in runs of rows whose files
  // fit it (a ragged row's two files always together), the same bytes as without a bound, never
  // more files pinned at once than the bound, and each file's rows read counted exactly.
  TempDir dir;
  constexpr int kFiles = 40;
  constexpr int64_t kRows = 5;
  std::mt19937_64 rng(11);
  std::vector<int64_t> sample(700);
  for (auto& s : sample) s = static_cast<int64_t>(rng() % (kFiles * kRows));
  std::vector<int32_t> all(kFiles);
  for (int k = 0; k < kFiles; ++k) all[static_cast<size_t>(k)] = k;
  const std::vector<LazyFile> files = make_files(dir, kFiles, kRows);
  for (int bound : {1, 2, 3, 7, 1000}) {
    auto cache = std::make_shared<MappingCache>(4);
    auto lazy = std::make_shared<LazyFiles>(cache, files);
    lazy->set_pin_bound(bound);
    const ArrayColumn col = lazy_column(lazy, kFiles, kRows);
    std::vector<uint8_t> out(sample.size() * 8);
    for (int twice = 0; twice < 2; ++twice)
      gather_rows(col, sample.data(), static_cast<int64_t>(sample.size()), reinterpret_cast<std::byte*>(out.data()));
    CHECK(wrong_bytes(sample, out, kRows) == 0);
    const MappingCache::Stats st = cache->stats();
    CHECK_MSG(st.pinned == 0 && st.peak_pinned <= bound, "bound " << bound << " peak_pinned " << st.peak_pinned);
    if (bound >= 40) CHECK(st.peak_pinned > 7);  // without a bound a block pins all its files at once
    std::vector<int64_t> expected(kFiles, 0);
    for (int64_t id : sample) expected[static_cast<size_t>(id / kRows)] += 2;
    CHECK(lazy->rows_read(all) == expected);
  }

  const RaggedFiles rf = ragged_files(dir);
  std::vector<int64_t> rs(200);
  for (auto& s : rs) s = static_cast<int64_t>(rng() % 36);
  std::vector<int32_t> rall(rf.files.size());
  for (size_t k = 0; k < rall.size(); ++k) rall[k] = static_cast<int32_t>(k);
  for (int bound : {1, 2, 3, 5, 1000}) {
    auto cache = std::make_shared<MappingCache>(2);
    auto rlazy = std::make_shared<LazyFiles>(cache, rf.files);
    rlazy->set_pin_bound(bound);
    const ArrayColumn r = ragged_column(rf, rlazy, 3);
    std::vector<uint8_t> slots(rs.size() * 3);
    std::vector<int64_t> lengths(rs.size());
    gather_ragged(r, rs.data(), static_cast<int64_t>(rs.size()), reinterpret_cast<std::byte*>(slots.data()),
                  lengths.data());
    CHECK(ragged_rows_wrong(rs, slots, lengths) == 0);
    const MappingCache::Stats st = cache->stats();
    CHECK_MSG(st.pinned == 0 && st.peak_pinned <= std::max(bound, 2), "bound " << bound << " peak " << st.peak_pinned);
    std::vector<int64_t> expected(rf.files.size(), 0);
    for (int64_t id : rs) {
      const size_t k = static_cast<size_t>(id / 3);
      ++expected[static_cast<size_t>(rf.values_ids[k])];
      ++expected[static_cast<size_t>(rf.offsets_ids[k])];
    }
    CHECK(rlazy->rows_read(rall) == expected);
  }
}

TEST_CASE(lazy_gather_from_threads_sharing_one_cache) {
  // Collation threads gather shuffled blocks of one column while the cache evicts under them.
  TempDir dir;
  constexpr int kFiles = 64;
  constexpr int64_t kRows = 3;
  auto cache = std::make_shared<MappingCache>(4);
  auto lazy = std::make_shared<LazyFiles>(cache, make_files(dir, kFiles, kRows));
  const ArrayColumn col = lazy_column(lazy, kFiles, kRows);
  std::atomic<int64_t> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) + 100);
      std::vector<int64_t> sample(16);
      std::vector<uint8_t> out(sample.size() * 8);
      for (int round = 0; round < 300; ++round) {
        for (auto& s : sample) s = static_cast<int64_t>(rng() % static_cast<uint64_t>(col.rows));
        gather_rows(col, sample.data(), static_cast<int64_t>(sample.size()), reinterpret_cast<std::byte*>(out.data()));
        bad += wrong_bytes(sample, out, kRows);
      }
    });
  for (auto& th : threads) th.join();
  const MappingCache::Stats s = cache->stats();
  CHECK(bad.load() == 0);
  CHECK_MSG(s.peak_excess <= 0 && s.pinned == 0 && s.live <= 4 && s.evictions > 0,
            "peak_excess " << s.peak_excess << " live " << s.live << " evictions " << s.evictions);
}

TEST_CASE(lazy_mappings_refuse_a_forked_child_instead_of_taking_a_lock_it_may_never_get) {
  TempDir dir;
  auto cache = std::make_shared<MappingCache>(4);
  auto files = std::make_shared<LazyFiles>(cache, make_files(dir, 3, 2));
  const int32_t ids[2] = {0, 1};
  const std::byte* data[2];
  files->pin(ids, 2, data);  // held across the fork, as by a collation thread of the parent
  const pid_t pid = ::fork();
  if (pid == 0) {
    int status = 0;
    try {
      files->pin(ids, 1, data);
      status = 1;  // should have thrown
    } catch (const std::runtime_error& e) {
      status = std::string(e.what()).find("forked child") == std::string::npos ? 2 : 0;
    }
    files.reset();  // unmaps without the lock
    ::_exit(status);
  }
  int status = -1;
  ::waitpid(pid, &status, 0);
  CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status " << status);
  files->unpin(ids, 2);
  CHECK(cache->stats().pinned == 0);
}

// Files fetched on demand (object storage): a provider makes each file present before it is
// mapped and returns the identity it then has; an evictor removes files it may (try_unmap).
// Readers always see the right bytes, files a reader pins are never removed, and a removed file
// comes back through the provider with a new inode.
TEST_CASE(lazy_mappings_provider_and_try_unmap_never_remove_a_pinned_file) {
  TempDir dir;
  constexpr int kFiles = 12, kThreads = 3;
  constexpr int64_t kRows = 32;
  std::vector<LazyFile> described = make_files(dir, kFiles, kRows);
  std::vector<std::vector<uint8_t>> contents(kFiles);
  for (int k = 0; k < kFiles; ++k) {
    contents[k].assign(static_cast<size_t>(kHeader + kRows * 8), 0xAB);
    for (int64_t r = 0; r < kRows; ++r)
      for (int64_t j = 0; j < 8; ++j) contents[k][static_cast<size_t>(kHeader + r * 8 + j)] = byte_of(k, r, j);
    described[k].identity = {};  // unknown until provided
  }
  auto cache = std::make_shared<MappingCache>(64);
  LazyFiles files(cache, described);
  std::mutex store;  // the fetcher's lock: presence and removal decided under it
  std::atomic<int64_t> provided{0}, removed{0}, bad{0};
  files.set_provider([&](int32_t i) {
    std::lock_guard<std::mutex> lock(store);
    const std::string& path = described[static_cast<size_t>(i)].path;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {  // evicted: "download" it again
      const std::string tmp = path + ".part";
      write_file(tmp, contents[static_cast<size_t>(i)]);
      if (::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("rename failed");
      ::stat(path.c_str(), &st);
    }
    ++provided;
    return FileIdentity{static_cast<int64_t>(st.st_dev), static_cast<int64_t>(st.st_ino), mtime_ns(st),
                        static_cast<int64_t>(st.st_size)};
  });
  std::atomic<bool> done{false};
  std::thread evictor([&] {
    std::mt19937_64 rng(99);
    while (!done.load()) {
      const int32_t i = static_cast<int32_t>(rng() % kFiles);
      std::lock_guard<std::mutex> lock(store);
      if (files.try_unmap(i)) {
        ::unlink(described[static_cast<size_t>(i)].path.c_str());
        ++removed;
      }
    }
  });
  std::vector<std::thread> readers;
  for (int t = 0; t < kThreads; ++t) {
    readers.emplace_back([&, t] {
      std::mt19937_64 rng(static_cast<uint64_t>(t) + 7);
      // 300 rounds, and on until files were evicted and provided again (on a loaded machine the
      // readers may finish before the evictor first runs).
      for (int round = 0; round < 300 || (provided.load() <= 2 * kFiles && round < 1000000); ++round) {
        std::set<int32_t> pick;
        const int want = 1 + static_cast<int>(rng() % 4);
        while (static_cast<int>(pick.size()) < want) pick.insert(static_cast<int32_t>(rng() % kFiles));
        std::vector<int32_t> ids(pick.begin(), pick.end());
        std::vector<const std::byte*> data(ids.size());
        PinnedFiles pins(files);
        pins.pin(ids.data(), static_cast<int>(ids.size()), data.data());
        std::this_thread::yield();  // the evictor runs while these are pinned
        for (size_t k = 0; k < ids.size(); ++k)
          for (int64_t r = 0; r < kRows; r += 5)
            for (int64_t j = 0; j < 8; ++j)
              if (static_cast<uint8_t>(data[k][r * 8 + j]) != byte_of(ids[k], r, j)) ++bad;
      }
    });
  }
  for (auto& th : readers) th.join();
  done = true;
  evictor.join();
  CHECK(bad.load() == 0);
  CHECK_MSG(removed.load() > 0 && provided.load() > kFiles, "removed " << removed.load() << " provided "
                                                                        << provided.load());
  CHECK(cache->stats().pinned == 0);
  CHECK(cache->stats().failures == 0);
  CHECK_THROWS(files.try_unmap(kFiles), std::out_of_range, "out of range");
}

// Another process evicts a file between the provider's answer and the mapping: the pin asks the
// provider again (it fetches the file back) instead of failing the batch; a provider's own error
// is not retried.
TEST_CASE(lazy_mappings_provider_is_asked_again_when_the_file_went_away_meanwhile) {
  TempDir dir;
  std::vector<LazyFile> described = make_files(dir, 1, 4);
  const LazyFile original = described[0];
  auto cache = std::make_shared<MappingCache>(4);
  LazyFiles files(cache, described);
  int calls = 0;
  files.set_provider([&](int32_t) {
    ++calls;
    if (calls == 1) return FileIdentity{1, 2, 3, original.identity.size};  // then "removed": stale
    return original.identity;
  });
  const int32_t id = 0;
  const std::byte* data = nullptr;
  files.pin(&id, 1, &data);
  CHECK(calls == 2);
  CHECK(static_cast<uint8_t>(data[8]) == byte_of(0, 1, 0));
  files.unpin(&id, 1);
  CHECK(files.try_unmap(0));
  files.set_provider([&](int32_t) -> FileIdentity { throw std::runtime_error("GET s3://b/k failed after 6 attempts"); });
  CHECK_THROWS(files.pin(&id, 1, &data), std::runtime_error, "failed after 6 attempts");
  CHECK(cache->stats().pinned == 0);
}

int main(int argc, char** argv) { return harness::run_cases(argc, argv, "test_lazy_mappings"); }
