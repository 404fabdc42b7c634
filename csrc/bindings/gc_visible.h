// Making a pybind11 class visible to Python's cycle collector. Native objects that hold Python
// objects (the Loader's engine holds its source, the source holds the dataset, collate_fn and
// worker_init_fn, an iterator holds its Loader) hide those references from the collector unless
// their type traverses them: a cycle through one (a dataset that keeps its Loader) then lives
// forever, with the Loader's threads. T::traverse(visit, arg) visits every Python object an
// instance owns a reference to, once; T::clear() (when Clears) drops what can be dropped.
#pragma once
#include <pybind11/pybind11.h>

namespace fastload {

template <typename T, bool Clears = false>
pybind11::custom_type_setup gc_visible() {
  return pybind11::custom_type_setup([](PyHeapTypeObject* heap_type) {
    auto* type = &heap_type->ht_type;
    type->tp_flags |= Py_TPFLAGS_HAVE_GC;
    type->tp_traverse = [](PyObject* self, visitproc visit, void* arg) {
      Py_VISIT(Py_TYPE(self));  // an instance of a heap type holds its type
      if (!pybind11::detail::is_holder_constructed(self)) return 0;
      return pybind11::cast<const T&>(pybind11::handle(self)).traverse(visit, arg);
    };
    // Without Clears, the collector breaks a cycle at one of its Python objects (the Loader, the
    // dataset, a closure, an Iterator): every cycle through these types passes through one.
    type->tp_clear = [](PyObject* self) {
      if constexpr (Clears) {
        if (pybind11::detail::is_holder_constructed(self)) pybind11::cast<T&>(pybind11::handle(self)).clear();
      }
      (void)self;
      return 0;
    };
  });
}

}  // namespace fastload
