// Row gathering: copies the rows named by sample ids from a column into a contiguous batch.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace fastload {

// A column as the core sees it: sample i is row_bytes bytes at base + i * pitch. A dataset column
// has pitch == row_bytes; a Windows source has pitch = stride * itemsize and overlapping rows.
struct ColumnSpec {
  std::string name;
  const std::byte* base = nullptr;
  int64_t rows = 0;
  int64_t pitch = 0;
  int64_t row_bytes = 0;
};

// dst[i] = row ids[i] of col, for i < count. ids must be in [0, col.rows).
void gather_rows(const ColumnSpec& col, const int64_t* ids, int64_t count, std::byte* dst);

}  // namespace fastload
