// Mappings made on demand under a budget; see lazy_mappings.h.
#include "core/lazy_mappings.h"

#include "core/fork_guard.h"
#include "core/stage_times.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

namespace fastload {

struct MappingCache::Slot {
  enum State : uint8_t { kUnmapped, kMapping, kMapped };
  void* addr = nullptr;
  size_t length = 0;
  int32_t pins = 0;
  State state = kUnmapped;
  bool in_lru = false;
  int64_t rows_read = 0;  // under the cache's lock
  Slot* prev = nullptr;  // towards the head (more recently used)
  Slot* next = nullptr;
  std::atomic<bool> checked{false};
};

int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

namespace {

[[noreturn]] void fail(const LazyFile& f, const std::string& what) {
  throw std::invalid_argument(f.path + ": " + what);
}

std::string describe_change(const FileIdentity& then, const struct stat& now) {
  if (static_cast<int64_t>(now.st_dev) != then.device || static_cast<int64_t>(now.st_ino) != then.inode)
    return "the file was replaced by another file (a new inode) since it was opened";
  const int64_t size = static_cast<int64_t>(now.st_size);
  if (size < then.size)
    return "the file is " + std::to_string(size) + " bytes, but it was " + std::to_string(then.size) +
           " when it was opened: truncated";
  if (size > then.size)
    return "the file is " + std::to_string(size) + " bytes, but it was " + std::to_string(then.size) +
           " when it was opened: it was written to";
  return "the file was modified (same inode and size, another mtime) since it was opened";
}

// Maps the whole file (mmap offsets must be page-aligned; the data start after a header), after
// checking it is the file described. The descriptor is closed at once: a mapping needs none.
std::pair<void*, size_t> map_checked(const LazyFile& f, const FileIdentity& id) {
  // O_NONBLOCK: a FIFO put in the file's place must not block the collation thread.
  const int fd = ::open(f.path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) fail(f, "the file is missing (deleted or renamed since it was opened)");
    fail(f, std::string("cannot open the file (") + std::strerror(err) + ")");
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(f, std::string("cannot stat the file (") + std::strerror(err) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(f, "the file is no longer a regular file");
  }
  if (static_cast<int64_t>(st.st_dev) != id.device || static_cast<int64_t>(st.st_ino) != id.inode ||
      mtime_ns(st) != id.mtime_ns || static_cast<int64_t>(st.st_size) != id.size) {
    ::close(fd);
    fail(f, describe_change(id, st) + "; open it again and build a new Loader");
  }
  if (f.offset < 0 || f.bytes < 0 || f.offset + f.bytes > id.size) {
    ::close(fd);
    fail(f, "the file is " + std::to_string(id.size) + " bytes, too short for " + std::to_string(f.bytes) +
                " bytes of data at byte " + std::to_string(f.offset));
  }
  const size_t length = static_cast<size_t>(id.size);
  if (length == 0) {
    ::close(fd);
    return {nullptr, 0};
  }
  void* p = ::mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    if (err == ENOMEM)
      fail(f, std::string("cannot map the file (") + std::strerror(err) +
                  ": the process may hold as many memory mappings as the system allows, vm.max_map_count)");
    fail(f, std::string("cannot map the file (") + std::strerror(err) + ")");
  }
  return {p, length};
}

}  // namespace

// Mappings taken out of the cache under its lock, unmapped after it is released (a munmap under
// the lock would serialise the threads on it). A pin evicts at most one mapping and an unpin of
// n files at most n, so a small fixed buffer holds them; past it they are unmapped at once.
class MappingCache::Victims {
 public:
  Victims() = default;
  Victims(const Victims&) = delete;
  Victims& operator=(const Victims&) = delete;
  ~Victims() { flush(); }
  void add(void* addr, size_t length) noexcept {
    if (addr == nullptr) return;
    if (n_ == kCapacity) {
      ::munmap(addr, length);
      return;
    }
    held_[n_++] = {addr, length};
  }
  void flush() noexcept {
    for (int k = 0; k < n_; ++k) ::munmap(held_[k].first, held_[k].second);
    n_ = 0;
  }

 private:
  static constexpr int kCapacity = 64;
  std::pair<void*, size_t> held_[kCapacity];
  int n_ = 0;
};

MappingCache::MappingCache(int64_t budget) : budget_(budget) {
  if (budget < 1) throw std::invalid_argument("mapping budget must be at least 1, got " + std::to_string(budget));
  totals_.budget = budget;
}

MappingCache::Stats MappingCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  Stats s = totals_;
  s.live = live_;
  s.pinned = pinned_;
  return s;
}

void MappingCache::lru_push_front(Slot* s) {
  s->prev = nullptr;
  s->next = head_;
  if (head_) head_->prev = s;
  head_ = s;
  if (!tail_) tail_ = s;
  s->in_lru = true;
}

void MappingCache::lru_remove(Slot* s) {
  if (s->prev) s->prev->next = s->next; else head_ = s->next;
  if (s->next) s->next->prev = s->prev; else tail_ = s->prev;
  s->prev = s->next = nullptr;
  s->in_lru = false;
}

void MappingCache::evict_locked(Victims& victims) {
  while (live_ > budget_ && tail_ != nullptr) {
    Slot* s = tail_;
    lru_remove(s);
    victims.add(s->addr, s->length);
    s->addr = nullptr;
    s->length = 0;
    s->state = Slot::kUnmapped;
    --live_;
    ++totals_.evictions;
  }
}

void MappingCache::note_locked() {
  totals_.peak_live = std::max(totals_.peak_live, live_);
  totals_.peak_pinned = std::max(totals_.peak_pinned, pinned_);
  totals_.peak_excess = std::max(totals_.peak_excess, live_ - budget_ - pinned_);
}

LazyFiles::LazyFiles(std::shared_ptr<MappingCache> cache, std::vector<LazyFile> files)
    : cache_(std::move(cache)),
      files_(std::move(files)),
      slots_(new MappingCache::Slot[files_.size()]),
      fork_generation_(fork_generation()) {
  if (!cache_) throw std::invalid_argument("LazyFiles needs a MappingCache");
  if (files_.size() > static_cast<size_t>(INT32_MAX)) throw std::invalid_argument("too many files to map lazily");
}

LazyFiles::~LazyFiles() {
  // No pins can remain: the column holding this object is gone, and with it every gather.
  MappingCache::Victims victims;
  if (fork_generation() != fork_generation_) {  // a forked child: the lock may be held forever
    for (size_t i = 0; i < files_.size(); ++i)
      if (slots_[i].state == MappingCache::Slot::kMapped) victims.add(slots_[i].addr, slots_[i].length);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(cache_->mutex_);
    for (size_t i = 0; i < files_.size(); ++i) {
      MappingCache::Slot& s = slots_[i];
      if (s.state != MappingCache::Slot::kMapped) continue;
      if (s.in_lru) cache_->lru_remove(&s);
      victims.add(s.addr, s.length);
      --cache_->live_;
    }
  }
  victims.flush();
}

const std::byte* LazyFiles::pin_locked(std::unique_lock<std::mutex>& lock, int32_t i) {
  using Slot = MappingCache::Slot;
  MappingCache& c = *cache_;
  Slot& s = slots_[static_cast<size_t>(i)];
  const LazyFile& f = files_[static_cast<size_t>(i)];
  for (;;) {
    if (s.state == Slot::kMapped) {
      if (s.pins++ == 0) {
        if (s.in_lru) c.lru_remove(&s);
        ++c.pinned_;
        c.note_locked();
      }
      return static_cast<const std::byte*>(s.addr) + f.offset;
    }
    if (s.state == Slot::kMapping) {  // another thread maps it: use its mapping
      const auto t0 = std::chrono::steady_clock::now();
      c.mapped_cv_.wait(lock, [&] { return s.state != Slot::kMapping; });
      if (provider_) t_fetch_wait_ns += StageTimes::since(t0);  // that thread was fetching it
      continue;
    }
    // Not mapped: map it here, without the lock; the slot is live and pinned meanwhile.
    s.state = Slot::kMapping;
    s.pins = 1;
    ++c.pinned_;
    ++c.live_;
    MappingCache::Victims victims;
    c.evict_locked(victims);
    c.note_locked();
    lock.unlock();
    victims.flush();
    std::pair<void*, size_t> m{nullptr, 0};
    std::exception_ptr error;
    try {
      if (!provider_) {
        m = map_checked(f, f.identity);
      } else {
        // Another process sharing the cache may remove the file between the provider's answer
        // and the open here (it cannot see this process's pins): ask the provider again, which
        // fetches it back. What the provider throws is not retried.
        for (int attempt = 1;; ++attempt) {
          try {
            m = map_checked(f, fetched(i));
            break;
          } catch (const std::invalid_argument&) {
            if (attempt == 3) throw;
          }
        }
      }
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error) {
      s.state = Slot::kUnmapped;
      s.pins = 0;
      --c.pinned_;
      --c.live_;
      ++c.totals_.failures;
      c.mapped_cv_.notify_all();
      std::rethrow_exception(error);
    }
    s.addr = m.first;
    s.length = m.second;
    s.state = Slot::kMapped;
    ++c.totals_.maps;
    c.mapped_cv_.notify_all();
    return static_cast<const std::byte*>(s.addr) + f.offset;
  }
}

FileIdentity LazyFiles::fetched(int32_t i) {
  const auto t0 = std::chrono::steady_clock::now();
  struct Count {  // the time counts whether the provider returns or throws
    std::chrono::steady_clock::time_point t0;
    ~Count() { t_fetch_wait_ns += StageTimes::since(t0); }
  } count{t0};
  return provider_(i);
}

void LazyFiles::unpin_locked(int32_t i, MappingCache::Victims& victims) {
  MappingCache& c = *cache_;
  MappingCache::Slot& s = slots_[static_cast<size_t>(i)];
  if (--s.pins > 0) return;
  --c.pinned_;
  c.lru_push_front(&s);
  c.evict_locked(victims);
}

void LazyFiles::pin(const int32_t* ids, int n, const std::byte** data) {
  if (fork_generation() != fork_generation_)
    throw std::runtime_error("files mapped on demand by the parent process cannot be read in a forked child: "
                             "open the source again in the child");
  std::unique_lock<std::mutex> lock(cache_->mutex_);
  int done = 0;
  try {
    for (; done < n; ++done) data[done] = pin_locked(lock, ids[done]);
  } catch (...) {
    MappingCache::Victims victims;
    for (int k = 0; k < done; ++k) unpin_locked(ids[k], victims);
    cache_->note_locked();
    lock.unlock();
    victims.flush();
    throw;
  }
}

void LazyFiles::unpin(const int32_t* ids, int n, const int32_t* rows_read) noexcept {
  MappingCache::Victims victims;
  {
    std::lock_guard<std::mutex> lock(cache_->mutex_);
    if (rows_read)
      for (int k = 0; k < n; ++k) slots_[static_cast<size_t>(ids[k])].rows_read += rows_read[k];
    for (int k = 0; k < n; ++k) unpin_locked(ids[k], victims);
    cache_->note_locked();
  }
  victims.flush();
}

std::vector<int64_t> LazyFiles::rows_read(const std::vector<int32_t>& ids) const {
  for (int32_t i : ids)
    if (i < 0 || static_cast<size_t>(i) >= files_.size()) throw std::out_of_range("file index out of range");
  std::vector<int64_t> out(ids.size());
  std::lock_guard<std::mutex> lock(cache_->mutex_);
  for (size_t k = 0; k < ids.size(); ++k) out[k] = slots_[static_cast<size_t>(ids[k])].rows_read;
  return out;
}

bool LazyFiles::try_unmap(int32_t i) {
  using Slot = MappingCache::Slot;
  if (i < 0 || static_cast<size_t>(i) >= files_.size()) throw std::out_of_range("file index out of range");
  MappingCache::Victims victims;
  {
    std::lock_guard<std::mutex> lock(cache_->mutex_);
    Slot& s = slots_[static_cast<size_t>(i)];
    if (s.state == Slot::kMapping || s.pins > 0) return false;
    if (s.state == Slot::kMapped) {
      if (s.in_lru) cache_->lru_remove(&s);
      victims.add(s.addr, s.length);
      s.addr = nullptr;
      s.length = 0;
      s.state = Slot::kUnmapped;
      --cache_->live_;
    }
  }
  victims.flush();
  return true;
}

bool LazyFiles::checked(int32_t i) const {
  return slots_[static_cast<size_t>(i)].checked.load(std::memory_order_acquire);
}

void LazyFiles::set_checked(int32_t i) { slots_[static_cast<size_t>(i)].checked.store(true, std::memory_order_release); }

}  // namespace fastload
