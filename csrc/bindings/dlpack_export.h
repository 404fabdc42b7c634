// Hands a part of a batch to Python as a DLPack capsule, on the host or on a GPU. The capsule
// (and the tensor made from it) holds a reference to the part's owner, which returns the memory
// to its pool when the last reference dies.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"

namespace fastload {

// device_type: kDLCPU (1) or kDLCUDA (2); device_id the GPU's index.
pybind11::capsule export_tensor(std::shared_ptr<void> owner, void* data, int device_type, int device_id,
                                DType dtype, int64_t rows, const std::vector<int64_t>& row_shape);

}  // namespace fastload
