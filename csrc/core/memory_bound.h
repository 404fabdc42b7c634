// How many batches of memory a loader holds per output for a given prefetch: the one owner of
// that count. The engine's host pools, the transfer engine's device buffers, the Python-side
// memory checks and `tune`'s grid (through fastload._C.batches_in_use / batches_held) ask here.
#pragma once
#include <cstdint>

namespace fastload {

// Batches one output has in use at once: the prefetch window (batches being built, copied or
// ready) and the one the consumer holds. What must fit in memory for the loader to run at all.
constexpr int64_t batches_in_use(int64_t prefetch) { return prefetch + 1; }

// The most a loop that drops each batch makes one output hold: the batches in use and, while
// next() hands over the following batch, the one the loop variable still holds. The documented
// memory bound (host memory on the CPU path, device memory per GPU).
constexpr int64_t batches_held(int64_t prefetch) { return batches_in_use(prefetch) + 1; }

}  // namespace fastload
