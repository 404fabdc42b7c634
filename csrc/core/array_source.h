// The array source: samples are rows of arrays in memory or memory-mapped files (numpy arrays,
// memmaps, token windows, shards of a dataset directory, ragged values and offsets), gathered by
// the collation threads with no Python involved (gather.h).
#pragma once
#include <string>
#include <vector>

#include "core/batch_source.h"
#include "core/gather.h"

namespace fastload {

// The name of the int64 part that follows a ragged column's padded rows: items per row.
std::string ragged_lengths_name(const std::string& column);

class ArraySource final : public BatchSource {
 public:
  // Throws std::invalid_argument if the columns disagree on their number of samples or a
  // column's row bytes do not match its dtype and row shape.
  explicit ArraySource(std::vector<ArrayColumn> columns);
  const std::vector<PartSchema>& schema() const override { return schema_; }
  int64_t size() const override { return size_; }
  void fill(const FillRequest& request) override;
  const std::vector<ArrayColumn>& columns() const { return columns_; }

 private:
  std::vector<ArrayColumn> columns_;
  std::vector<PartSchema> schema_;
  int64_t size_ = 0;
};

}  // namespace fastload
