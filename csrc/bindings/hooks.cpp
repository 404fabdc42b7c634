// _C._register_hooks: see hooks.h.
#include "bindings/hooks.h"

#include <stdexcept>
#include <string>

#include "bindings/register.h"

namespace py = pybind11;

namespace fastload {
namespace {

// Strong references, replaced by a later registration and never released: the objects live as
// long as the interpreter, and a destructor at exit must not touch Python.
PyObject* g_sample_error = nullptr;
PyObject* g_release_cache = nullptr;
PyObject* g_stall_warning = nullptr;

py::handle registered(PyObject* object, const char* name) {
  if (object == nullptr) {
    throw std::runtime_error(std::string("fastload._C: hook '") + name +
                             "' is not registered (fastload/__init__.py registers it; import fastload, not fastload._C alone)");
  }
  return py::handle(object);
}

void replace(PyObject** slot, const py::object& object) {
  PyObject* old = *slot;
  *slot = py::object(object).release().ptr();
  Py_XDECREF(old);
}

}  // namespace

namespace hooks {
py::handle sample_error() { return registered(g_sample_error, "sample_error"); }
py::handle release_cache() { return registered(g_release_cache, "release_cache"); }
py::handle stall_warning() { return registered(g_stall_warning, "stall_warning"); }
}  // namespace hooks

void register_hooks(py::module_& m) {
  m.def(
      "_register_hooks",
      [](const py::object& sample_error, const py::object& release_cache, const py::object& stall_warning) {
        if (!PyType_Check(sample_error.ptr()) ||
            !PyObject_IsSubclass(sample_error.ptr(), PyExc_Exception)) {
          throw std::invalid_argument("sample_error must be an exception class, got " +
                                      py::repr(sample_error).cast<std::string>());
        }
        for (const auto& [name, f] : {std::pair{"release_cache", &release_cache}, std::pair{"stall_warning", &stall_warning}})
          if (!PyCallable_Check(f->ptr()))
            throw std::invalid_argument(std::string(name) + " must be callable, got " + py::repr(*f).cast<std::string>());
        replace(&g_sample_error, sample_error);
        replace(&g_release_cache, release_cache);
        replace(&g_stall_warning, stall_warning);
      },
      py::kw_only(), py::arg("sample_error"), py::arg("release_cache"), py::arg("stall_warning"),
      "Hands the bindings the Python objects they call: the class a failing sample raises, the "
      "function that empties torch's CUDA cache for one device, and the one that logs the stall "
      "hint from its figures. fastload/__init__.py calls it once.");
}

}  // namespace fastload
