// Interpreter exit with a daemon thread still iterating. At exit Python ends daemon threads
// when they next take the GIL, by a forced unwind; PyTorch frees tensors with the GIL released
// and takes it back in a frame that cannot unwind, so a daemon thread that drops a batch at that
// moment aborts the process ("terminate called without an active exception"), with or without
// fastload. So at exit fastload parks its iterating threads: from then on, next() on any thread
// but the main one sleeps for good with the GIL released, and never returns to the training loop
// to free or compute anything. Everything here runs with the GIL held, except park().
#pragma once
#include <pthread.h>

#include <sys/syscall.h>
#include <unistd.h>

#include <map>
#include <set>

namespace fastload::exit_parking {

struct State {
  bool parking = false;
  pthread_t main_thread = pthread_self();  // the importing thread: Python's main thread
  std::map<long, bool> iterating;          // native thread id -> parked
};

inline State& state() {
  static State* s = new State();  // never destroyed: a parked thread may outlive static destructors
  return *s;
}

inline long thread_id() { return static_cast<long>(syscall(SYS_gettid)); }  // threading.get_native_id()

// Called by next() and iter() on entry: true if this thread must park now.
inline bool note_next() {
  State& s = state();
  if (pthread_equal(pthread_self(), s.main_thread)) return false;
  s.iterating.emplace(thread_id(), false);
  return s.parking;
}

inline void mark_parked() { state().iterating[thread_id()] = true; }

// Of the given live threads (native ids), those that have iterated and not parked yet.
inline int unparked(const std::set<long>& live) {
  int n = 0;
  for (const auto& [id, parked] : state().iterating) n += !parked && live.count(id);
  return n;
}

}  // namespace fastload::exit_parking
