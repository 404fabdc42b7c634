// Interpreter exit with a daemon thread still iterating. At exit Python ends daemon threads
// when they next take the GIL, by a forced unwind; PyTorch frees tensors with the GIL released
// and takes it back in a frame that cannot unwind, so a daemon thread that drops a batch at that
// moment aborts the process ("terminate called without an active exception"), with or without
// fastload. So at exit fastload parks its iterating threads: from then on, next() on any thread
// but the main one sleeps for good with the GIL released, and never returns to the training loop
// to free or compute anything. Everything here runs with the GIL held, except park().
#pragma once
#include <pthread.h>

#include <chrono>
#include <map>

namespace fastload::exit_parking {

struct State {
  bool parking = false;
  int parked = 0;
  pthread_t main_thread = pthread_self();  // the importing thread: Python's main thread
  std::map<pthread_t, std::chrono::steady_clock::time_point> iterating;  // last next() per thread
};

inline State& state() {
  static State* s = new State();  // never destroyed: a parked thread may outlive static destructors
  return *s;
}

// Called by next() on entry: true if this thread must park now.
inline bool note_next() {
  State& s = state();
  const pthread_t me = pthread_self();
  if (pthread_equal(me, s.main_thread)) return false;
  if (s.parking) return true;
  s.iterating[me] = std::chrono::steady_clock::now();
  return false;
}

// Iterating threads seen in the last second that have not parked yet.
inline int unparked() {
  State& s = state();
  const auto recent = std::chrono::steady_clock::now() - std::chrono::seconds(1);
  int n = 0;
  for (const auto& [thread, last] : s.iterating) n += last > recent;
  return n > s.parked ? n - s.parked : 0;
}

}  // namespace fastload::exit_parking
