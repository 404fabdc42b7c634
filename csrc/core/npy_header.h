// The header of a .npy file (NumPy's format, versions 1-3) read without Python: the element
// type's descriptor, the axis order and the shape, and where the data starts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

struct NpyHeader {
  std::string descr;            // numpy's dtype.str, e.g. "<f4", "|u1"
  bool fortran_order = false;
  std::vector<int64_t> shape;
  size_t data_offset = 0;       // from the start of the file
};

// Parses the header of `data` (`size` bytes). False, with the reason in `why`, for anything that
// is not a well-formed .npy header.
bool parse_npy_header(const uint8_t* data, size_t size, NpyHeader* out, std::string* why);

// "(3, 4)" for a shape, as numpy prints it.
std::string npy_shape_text(const std::vector<int64_t>& shape);

}  // namespace fastload
