// Read-only file mappings that hold no file descriptor, and a batched stat of many files.
#pragma once
#include <pybind11/pybind11.h>

namespace fastload {

// Registers fastload._C.FileMapping and fastload._C.FileSet (see file_mapping.cpp).
void register_file_mapping(pybind11::module_& m);

}  // namespace fastload
