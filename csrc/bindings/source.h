// A batch source as Python holds it (fastload._C.BatchSource): the native source, and the Python
// objects whose memory it reads, kept alive for as long as a Loader holds the handle.
#pragma once
#include <pybind11/pybind11.h>

#include <memory>

#include "core/batch_source.h"

namespace fastload {

struct SourceHandle {
  std::shared_ptr<BatchSource> source;
  pybind11::object keepalive;
  // Visits the Python objects `source` itself holds (a PythonSource: the dataset and its
  // functions), for the cycle collector; null for a source that holds none. The handle is the
  // one Python object that visits them: the engine and the runtime that share `source` hold the
  // handle object itself.
  int (*traverse_source)(const BatchSource& source, visitproc visit, void* arg) = nullptr;

  int traverse(visitproc visit, void* arg) const {
    Py_VISIT(keepalive.ptr());
    return traverse_source ? traverse_source(*source, visit, arg) : 0;
  }
};

}  // namespace fastload
