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
};

}  // namespace fastload
