// Fork detection: threads do not survive fork(), so objects created before a fork must not wait
// on them, or take locks they might have held, in the child.
#pragma once
#include <cstdint>

namespace fastload {

// Incremented in every child process created by fork(); an object remembers the value it was
// created under and compares.
uint64_t fork_generation();

}  // namespace fastload
