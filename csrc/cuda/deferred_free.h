// Frees of device and page-locked memory, done later on a thread of fastload's own instead of on
// the caller's. Freeing (cuMemFree, cuMemFreeHost) may synchronise the whole device, and a device
// buffer may be freed only after its release events completed (a wait for the consumer's work):
// neither may happen on the user's thread, which may hold the GIL (a DLPack deleter runs the
// last batch's destructor there) or be capturing a CUDA graph, nor at an epoch start. The
// thread is made on first use, runs in relaxed capture mode, and lives until the process ends.
#pragma once
#include <functional>

namespace fastload::cuda {

// Runs `task` on the deferred-free thread, after the tasks queued before it. A task must not
// throw; it makes its own context current. In a forked child nothing runs (and nothing is freed:
// the parent's driver state is not this process's).
void defer_free(std::function<void()> task) noexcept;
// Waits until every task queued so far has run (close(), and tests that count memory).
void flush_deferred_frees();

}  // namespace fastload::cuda
