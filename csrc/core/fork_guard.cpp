// Counts forks with a pthread_atfork child handler registered once per process.
#include "core/fork_guard.h"

#include <pthread.h>

#include <atomic>

namespace fastload {

namespace {
std::atomic<uint64_t> g_generation{0};
void on_fork_child() { g_generation.fetch_add(1, std::memory_order_relaxed); }
const int g_registered = pthread_atfork(nullptr, nullptr, on_fork_child);
}  // namespace

uint64_t fork_generation() {
  (void)g_registered;
  return g_generation.load(std::memory_order_relaxed);
}

}  // namespace fastload
