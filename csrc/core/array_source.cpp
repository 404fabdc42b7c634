// Arrays as a batch source; see array_source.h.
#include "core/array_source.h"

#include <stdexcept>

namespace fastload {

std::string ragged_lengths_name(const std::string& column) { return column + "_lengths"; }

ArraySource::ArraySource(std::vector<ArrayColumn> columns) : columns_(std::move(columns)) {
  size_ = columns_.empty() ? 0 : columns_[0].rows;  // no columns: a loader of "index" alone
  for (const ArrayColumn& c : columns_) {
    if (c.rows != size_)
      throw std::invalid_argument("column " + c.name + " has " + std::to_string(c.rows) + " rows, column " +
                                  columns_[0].name + " " + std::to_string(size_));
    if (c.row_bytes < 0) throw std::invalid_argument("column " + c.name + " has negative row bytes");
    schema_.push_back({c.name, c.dtype, c.row_shape, static_cast<size_t>(c.row_bytes)});
    if (c.ragged) schema_.push_back({ragged_lengths_name(c.name), kInt64, {}, sizeof(int64_t)});
  }
}

void ArraySource::fill(const FillRequest& r) {
  size_t p = 0;
  for (const ArrayColumn& col : columns_) {
    if (col.ragged) {
      gather_ragged(col, r.ids, r.count, r.parts[p], reinterpret_cast<int64_t*>(r.parts[p + 1]));
      p += 2;
    } else {
      gather_rows(col, r.ids, r.count, r.parts[p]);
      p += 1;
    }
  }
}

}  // namespace fastload
