// Runs a blocking call with the GIL released. Unlike pybind11's gil_scoped_release, the GIL is
// taken back in ordinary code, not in a destructor: at interpreter exit a daemon thread that
// tries to take it is ended by a forced unwind, which a (noexcept) destructor would turn into
// std::terminate ("terminate called without an active exception").
#pragma once
#include <Python.h>

#include <optional>
#include <type_traits>

namespace fastload {

template <typename F>
auto without_gil(F&& f) -> decltype(f()) {
  PyThreadState* state = PyEval_SaveThread();
  if constexpr (std::is_void_v<decltype(f())>) {
    try {
      f();
    } catch (...) {
      PyEval_RestoreThread(state);
      throw;
    }
    PyEval_RestoreThread(state);
  } else {
    std::optional<decltype(f())> result;
    try {
      result.emplace(f());
    } catch (...) {
      PyEval_RestoreThread(state);
      throw;
    }
    PyEval_RestoreThread(state);  // outside the try: a forced unwind from here passes through
    return std::move(*result);
  }
}

}  // namespace fastload
