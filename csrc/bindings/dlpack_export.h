// Hands a part of a batch buffer to Python as a DLPack capsule. The capsule (and the tensor made
// from it) holds a reference to the buffer, which returns to the pool when the last one dies.
#pragma once
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "core/buffer_pool.h"

namespace fastload {

struct DTypeCode {
  uint8_t code;  // DLDataTypeCode
  uint8_t bits;
};

pybind11::capsule export_host_tensor(const std::shared_ptr<HostBuffer>& buffer, size_t offset,
                                     DTypeCode dtype, int64_t rows,
                                     const std::vector<int64_t>& row_shape);

}  // namespace fastload
