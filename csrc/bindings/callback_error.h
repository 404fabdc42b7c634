// A Python exception raised by a callback the core runs on its own threads (a Parquet row group's
// decode, a remote file's provider), carried through the core to the Python caller. A missing
// file or object (FileNotFoundError) and refused access (PermissionError) keep their type there:
// `except FileNotFoundError` sees an object deleted from the bucket mid-epoch as it sees one
// missing at open. Other exceptions keep what their call site made of them (ValueError,
// RuntimeError), as before.
#pragma once
#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "bindings/python_ref.h"

namespace fastload {

class CallbackError : public std::runtime_error {
 public:
  CallbackError(const std::string& message, std::shared_ptr<PyRef> exception)
      : std::runtime_error(message), exception_(std::move(exception)) {}
  const std::shared_ptr<PyRef>& exception() const { return exception_; }

 private:
  std::shared_ptr<PyRef> exception_;
};

// Whether the exception being handled keeps its type through the core (GIL held).
bool keeps_type(const pybind11::error_already_set& e);

// A CallbackError holding e's exception, its message e's (GIL held).
CallbackError callback_error(const pybind11::error_already_set& e);

// Sets the Python error: the original's type with `message` (which says where it happened),
// chained (__cause__) to the original with its traceback. GIL held.
void set_callback_error(const CallbackError& error, const std::string& message);

}  // namespace fastload
