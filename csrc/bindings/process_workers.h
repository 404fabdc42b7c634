// The main process's side of worker processes (workers="processes"): collation thread k sends
// each batch it builds to worker process k over a Unix socket (the sample ids and where each part
// of the batch lives in shared memory), and waits for the reply with no GIL held; the worker runs
// the dataset and writes the samples straight into the batch (fastload._workers.process). A
// segment's descriptor is sent to a worker once, with the first batch that uses it.
//
// Wire format (host byte order; both ends are on one machine):
//   request  u64 length | u32 kind (1 = batch) | u32 parts | u64 seed | i64 epoch | i64 step |
//            i64 count | u32 new segments | u32 freed segments | count x i64 ids |
//            parts x (u64 segment, u64 offset) | new x (u64 segment, u64 size) | freed x u64 segment
//            + the new segments' descriptors (SCM_RIGHTS); the worker unmaps the freed ones
//   reply    u64 length | u32 status (0 ok, 1 error) | u32 message bytes | message | payload
//            (ok: pickled extras, or nothing; error: pickled (exception or None, traceback text))
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "bindings/py_source.h"
#include "core/batch_source.h"
#include "core/shared_memory.h"

namespace fastload {

// A worker's failure as the main process sees it: the worker's message, and its pickled
// (exception, traceback) when the dataset raised.
class WorkerError : public SampleError {
 public:
  WorkerError(const std::string& message, std::string pickled)
      : SampleError(message, nullptr), pickled_(std::move(pickled)) {}
  const std::string& pickled() const { return pickled_; }

 private:
  std::string pickled_;
};

class WorkerPool {
 public:
  // fds[k]: the main process's end of worker k's socket (owned by the Python side); pids[k]: its
  // process id, for the message when it dies.
  WorkerPool(std::vector<int> fds, std::vector<int64_t> pids, std::shared_ptr<SharedMemoryAllocator> memory);
  // Has worker `request.thread` build the batch into `request.parts`; returns the reply's payload
  // (pickled extras, or empty). Throws WorkerError when the dataset failed in the worker, and
  // std::runtime_error when the worker died or its socket broke.
  std::string run(const FillRequest& request, size_t num_parts);
  size_t size() const { return workers_.size(); }

 private:
  struct Worker {
    int fd;
    int64_t pid;
    std::set<uint64_t> sent;  // segments whose descriptor this worker has
    size_t freed_cursor = 0;  // its position in the allocator's log of freed segments
  };
  [[noreturn]] void died(const Worker& w, size_t index, const FillRequest& r, const std::string& how) const;

  std::vector<Worker> workers_;  // worker k is used by collation thread k only: no lock needed
  std::shared_ptr<SharedMemoryAllocator> memory_;
};

}  // namespace fastload
