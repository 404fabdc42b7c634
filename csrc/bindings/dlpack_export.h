// Hands a part of a batch to Python as a DLPack capsule, on the host or on a GPU. The capsule
// (and the tensor made from it) holds a reference to the part's owner, which returns the memory
// to its pool when the last reference dies.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace fastload {

struct DTypeCode {
  uint8_t code;  // DLDataTypeCode
  uint8_t bits;
};

// device_type: kDLCPU (1) or kDLCUDA (2); device_id the GPU's index.
pybind11::capsule export_tensor(std::shared_ptr<void> owner, void* data, int device_type, int device_id,
                                DTypeCode dtype, int64_t rows, const std::vector<int64_t>& row_shape);

}  // namespace fastload
