// Holding Python objects from native code that may run on any thread, with or without the GIL:
// a reference that takes the GIL to let go (the last reference to a native object that holds
// Python objects may die on a collation thread), and a scope that takes the GIL on a native
// thread. After the interpreter has finalized, references are leaked rather than touched.
#pragma once
#include <Python.h>

#include <utility>

namespace fastload {

class GilScope {
 public:
  GilScope() : state_(PyGILState_Ensure()) {}
  ~GilScope() { PyGILState_Release(state_); }
  GilScope(const GilScope&) = delete;
  GilScope& operator=(const GilScope&) = delete;

 private:
  PyGILState_STATE state_;
};

class PyRef {
 public:
  PyRef() = default;
  // Takes a new reference to `p` (the GIL must be held).
  static PyRef borrow(PyObject* p) {
    Py_XINCREF(p);
    return PyRef(p);
  }
  // Steals `p` (a new reference the caller owns).
  static PyRef steal(PyObject* p) { return PyRef(p); }
  PyRef(PyRef&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  PyRef& operator=(PyRef&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = std::exchange(o.p_, nullptr);
    }
    return *this;
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  ~PyRef() { reset(); }

  PyObject* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  PyObject* release() { return std::exchange(p_, nullptr); }
  void reset() {
    PyObject* p = std::exchange(p_, nullptr);
    if (!p || !Py_IsInitialized()) return;
    if (PyGILState_Check()) {
      Py_DECREF(p);
      return;
    }
    GilScope gil;
    Py_DECREF(p);
  }

 private:
  explicit PyRef(PyObject* p) : p_(p) {}
  PyObject* p_ = nullptr;
};

}  // namespace fastload
