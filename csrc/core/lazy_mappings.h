// Files mapped on demand, with a bounded number of live mappings: for sources of more files than
// the process may map at once (Linux allows vm.max_map_count mappings, 65,530 by default, and
// every mapped file is one). The core knows POSIX files here, not Python.
#pragma once
#include <sys/stat.h>

#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fastload {

// What a file was when its source was opened: a mapping must find the same file, so that a file
// swapped, rewritten or truncated since is an error naming it, never other data.
struct FileIdentity {
  int64_t device = 0, inode = 0, mtime_ns = 0, size = 0;
};

// A stat's modification time in nanoseconds, as FileIdentity and Python's st_mtime_ns hold it.
int64_t mtime_ns(const struct stat& st);

// One file to map on demand: its data are `bytes` bytes at byte `offset` (after a header).
struct LazyFile {
  std::string path;
  int64_t offset = 0;
  int64_t bytes = 0;
  FileIdentity identity;
};

class LazyFiles;

// The budget and the least-recently-used order of live mappings, shared by every LazyFiles made
// with it (one per process, so that the budget bounds them all). A mapping is pinned while a
// collation thread copies from it; only unpinned ones are evicted. When every live mapping is
// pinned, a new one goes over budget rather than wait (a wait could deadlock: the pins are held
// by threads that wait for the same thing): the most live mappings are then
// max(budget, files pinned at once), and a thread pins at most one block of rows of one column at
// a time (gather.cpp), so at worst budget + threads x 256 x 2 (a ragged shard is two files).
class MappingCache {
 public:
  explicit MappingCache(int64_t budget);  // budget >= 1, else std::invalid_argument
  MappingCache(const MappingCache&) = delete;
  MappingCache& operator=(const MappingCache&) = delete;

  int64_t budget() const { return budget_; }

  // Counters for tests and reports. live: mappings made and not yet evicted or released;
  // pinned: files pinned (or being mapped) now; peak_excess: the most that live ever exceeded
  // budget + pinned (0 unless the bound is broken).
  struct Stats {
    int64_t budget = 0, live = 0, pinned = 0, peak_live = 0, peak_pinned = 0, peak_excess = 0;
    int64_t maps = 0, evictions = 0, failures = 0;
  };
  Stats stats() const;

 private:
  friend class LazyFiles;
  struct Slot;
  class Victims;
  // Under mutex_: unpinned mapped slots, most recent at the head.
  void lru_push_front(Slot* s);
  void lru_remove(Slot* s);
  // Takes unpinned mappings off the tail until live_ <= budget_ (their munmap comes after
  // mutex_ is released).
  void evict_locked(Victims& victims);
  void note_locked();  // updates the peaks

  const int64_t budget_;
  mutable std::mutex mutex_;
  std::condition_variable mapped_cv_;  // a slot left the "mapping" state
  Slot* head_ = nullptr;
  Slot* tail_ = nullptr;
  int64_t live_ = 0, pinned_ = 0;
  Stats totals_;  // the counters not kept above
};

// A fixed list of files mapped through one MappingCache. Pins are counted per file; pin() maps a
// file not mapped (on the calling thread, without the cache's lock), after checking that it is
// the file described. Every file is unmapped by the time the object dies. In a child made by
// fork() the cache's lock may be held by a thread that did not survive: pin() then refuses
// (std::runtime_error) before taking it, and the destructor unmaps without it; the Python layer
// makes a new LazyFiles in the child.
class LazyFiles {
 public:
  LazyFiles(std::shared_ptr<MappingCache> cache, std::vector<LazyFile> files);
  ~LazyFiles();
  LazyFiles(const LazyFiles&) = delete;
  LazyFiles& operator=(const LazyFiles&) = delete;

  size_t size() const { return files_.size(); }
  const LazyFile& file(int32_t i) const { return files_[static_cast<size_t>(i)]; }
  const std::shared_ptr<MappingCache>& cache() const { return cache_; }

  // Pins the distinct files ids[0, n) and sets data[k] to where file ids[k]'s data start. Throws
  // std::invalid_argument naming the file if one cannot be mapped or is not the file described
  // (missing, replaced, rewritten, truncated); none of them stays pinned then.
  void pin(const int32_t* ids, int n, const std::byte** data);
  // rows_read (may be null): rows copied from each file since it was pinned, added to its count.
  void unpin(const int32_t* ids, int n, const int32_t* rows_read = nullptr) noexcept;

  // Rows copied from each file so far (counted at unpin): the fetcher of a remote source tells from
  // them which of the plan's reads of a file are done, so that it evicts a file no batch still
  // needs rather than one a collation thread is about to read (see _storage/fetcher.py).
  std::vector<int64_t> rows_read(const std::vector<int32_t>& ids) const;

  // The most files one pin() of a gather holds (a block of rows is copied in runs of rows whose
  // files are at most this many; a row's own files are always pinned together). The fetcher of a
  // remote source sets it so that every collation thread's pins fit the cache together: a batch
  // that straddles two windows of order="block" then never needs both windows cached at once.
  void set_pin_bound(int files) { pin_bound_.store(files < 1 ? 1 : files, std::memory_order_relaxed); }
  int pin_bound() const { return pin_bound_.load(std::memory_order_relaxed); }

  // A flag per file for checks of its contents that need doing once (a ragged shard's offsets):
  // set after the first check passed. Two threads may both check; the result is the same.
  bool checked(int32_t i) const;
  void set_checked(int32_t i);

  // Files fetched on demand (object storage): the provider is called on the pinning thread,
  // without the cache's lock, before file i is mapped; it makes the file present and returns the
  // identity the mapping must find (the file's own, which a new download changes). What it throws
  // fails the batch. Set once, before the first pin.
  using Provider = std::function<FileIdentity(int32_t)>;
  void set_provider(Provider provider) { provider_ = std::move(provider); }
  // For the fetcher's eviction: unmaps file i unless a thread pins it or is mapping it. True if it
  // is unmapped now, so that its file may be removed (a later pin calls the provider again).
  bool try_unmap(int32_t i);

 private:
  const std::byte* pin_locked(std::unique_lock<std::mutex>& lock, int32_t i);
  FileIdentity fetched(int32_t i);  // provider_(i), its time added to t_fetch_wait_ns (stage_times.h)
  void unpin_locked(int32_t i, MappingCache::Victims& victims);

  std::shared_ptr<MappingCache> cache_;
  std::vector<LazyFile> files_;
  std::unique_ptr<MappingCache::Slot[]> slots_;
  uint64_t fork_generation_;
  Provider provider_;
  std::atomic<int> pin_bound_{INT32_MAX};
};

// RAII pins of up to `capacity` files of one LazyFiles: unpinned when it goes out of scope, so an
// exception thrown while copying never leaves a mapping pinned.
class PinnedFiles {
 public:
  explicit PinnedFiles(LazyFiles& files) : files_(files) {}
  ~PinnedFiles() { release(); }
  PinnedFiles(const PinnedFiles&) = delete;
  PinnedFiles& operator=(const PinnedFiles&) = delete;
  // Holds nothing else: release() the previous pins first. ids (and rows_read, the rows to be
  // copied from each, counted when released; may be null) must stay unchanged until then.
  void pin(const int32_t* ids, int n, const std::byte** data, const int32_t* rows_read = nullptr) {
    files_.pin(ids, n, data);
    ids_ = ids;
    rows_read_ = rows_read;
    n_ = n;
  }
  void release() noexcept {
    if (n_ > 0) files_.unpin(ids_, n_, rows_read_);
    n_ = 0;
  }

 private:
  LazyFiles& files_;
  const int32_t* ids_ = nullptr;
  const int32_t* rows_read_ = nullptr;
  int n_ = 0;
};

}  // namespace fastload
