// Python exceptions of the core's callbacks, carried to the caller; see callback_error.h.
#include "bindings/callback_error.h"

namespace py = pybind11;

namespace fastload {

bool keeps_type(const py::error_already_set& e) {
  return e.matches(PyExc_FileNotFoundError) || e.matches(PyExc_PermissionError);
}

CallbackError callback_error(const py::error_already_set& e) {
  return CallbackError(py::str(e.value()), std::make_shared<PyRef>(PyRef::borrow(e.value().ptr())));
}

void set_callback_error(const CallbackError& error, const std::string& message) {
  PyObject* original = error.exception() ? error.exception()->get() : nullptr;
  if (!original) {
    PyErr_SetString(PyExc_RuntimeError, message.c_str());
    return;
  }
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(original));
  PyObject* raised = PyObject_CallFunction(type, "s", message.c_str());
  if (!raised) {  // a type that takes other arguments: the message as a RuntimeError, chained
    PyErr_Clear();
    raised = PyObject_CallFunction(PyExc_RuntimeError, "s", message.c_str());
    if (!raised) return;  // the interpreter's own error (memory) is set
  }
  Py_INCREF(original);
  PyException_SetCause(raised, original);  // steals the reference
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(raised)), raised);
  Py_DECREF(raised);
}

}  // namespace fastload
