// Host buffers other processes can map: each allocation is its own memfd segment (Linux), mapped
// shared. Worker processes receive a segment's descriptor once (SCM_RIGHTS) and write samples
// straight into the batch slots the pipeline owns, so a sample crosses the process boundary once,
// with no pickling of arrays. The descriptor stays open while the segment lives; nothing has a
// name in /dev/shm, so nothing is left behind when the processes die.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "core/buffer_pool.h"

namespace fastload {

struct SharedSegment {
  uint64_t id = 0;  // unique for the allocator's lifetime (descriptor numbers are reused)
  int fd = -1;
  size_t size = 0;
  size_t offset = 0;  // of the address asked about, within the segment
};

class SharedMemoryAllocator final : public HostAllocator {
 public:
  ~SharedMemoryAllocator() override;
  void* allocate(size_t bytes) override;  // throws std::bad_alloc / std::system_error
  void deallocate(void* p, size_t bytes) noexcept override;
  // The segment holding `p`; false if `p` is not inside one of this allocator's segments.
  bool locate(const void* p, SharedSegment* out) const;
  // Segments freed since *cursor (a reader's position in the log of frees), appended to `out`;
  // moves the cursor. Workers unmap them so that freed memory really goes back.
  void freed_since(size_t* cursor, std::vector<uint64_t>* out) const;

 private:
  struct Segment {
    uint64_t id;
    int fd;
    size_t size;
  };
  mutable std::mutex mutex_;
  std::map<uintptr_t, Segment> segments_;  // by base address
  std::vector<uint64_t> freed_;             // ids, in the order they were freed
  uint64_t next_id_ = 1;
};

}  // namespace fastload
