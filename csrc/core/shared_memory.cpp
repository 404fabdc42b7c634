// Shared host memory; see shared_memory.h.
#include "core/shared_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <new>
#include <system_error>


namespace fastload {

SharedMemoryAllocator::~SharedMemoryAllocator() {
  // Buffers still held by users keep their pool, and the pool keeps this allocator: whatever
  // is left here was never handed back (a forked child's copy): leave it to the kernel.
}

void* SharedMemoryAllocator::allocate(size_t bytes) {
  const size_t size = bytes ? (bytes + 4095) / 4096 * 4096 : 4096;
  const int fd = static_cast<int>(memfd_create("fastload-batch", MFD_CLOEXEC));
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "memfd_create");
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    close(fd);
    if (err == ENOMEM || err == ENOSPC) throw std::bad_alloc();
    throw std::system_error(err, std::generic_category(), "ftruncate of a shared batch segment");
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    throw std::bad_alloc();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  segments_[reinterpret_cast<uintptr_t>(p)] = {next_id_++, fd, size};
  return p;
}

void SharedMemoryAllocator::deallocate(void* p, size_t) noexcept {
  Segment s{};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = segments_.find(reinterpret_cast<uintptr_t>(p));
    if (it == segments_.end()) return;
    s = it->second;
    segments_.erase(it);
    freed_.push_back(s.id);
  }
  munmap(p, s.size);
  close(s.fd);
}

bool SharedMemoryAllocator::locate(const void* p, SharedSegment* out) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = segments_.upper_bound(a);
  if (it == segments_.begin()) return false;
  --it;
  if (a >= it->first + it->second.size) return false;
  *out = {it->second.id, it->second.fd, it->second.size, a - it->first};
  return true;
}

}  // namespace fastload

namespace fastload {

void SharedMemoryAllocator::freed_since(size_t* cursor, std::vector<uint64_t>* out) const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (; *cursor < freed_.size(); ++*cursor) out->push_back(freed_[*cursor]);
}

}  // namespace fastload
