// Arrow columns as a batch source: the collation threads gather rows straight from the Arrow
// buffers of an ArrowTable (chunks are shards) into the batch, decoding what Arrow packs (bits,
// dictionaries, list offsets) on the way. An optional indices table (a Hugging Face dataset's
// `select`/`shuffle` mapping) is one more indirection before the gather.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/arrow_table.h"
#include "core/batch_source.h"

namespace fastload {

// How one column is read into the batch.
struct ArrowColumnRequest {
  std::string name;
  int64_t max_items = 0;            // list / string: the padded slot (items or bytes); rows are cut to it
  std::vector<std::byte> pad;       // list / string: one element's bytes, repeated past a row's end
  bool fill = false;                // null rows become `fill_value` (an empty row for list / string)
  std::vector<std::byte> fill_value;  // fixed / bool: one row's bytes
  bool with_valid = false;          // add "<name>_valid" (bool): false where the row was null
};

std::string arrow_valid_name(const std::string& column);

class ArrowSource final : public BatchSource {
 public:
  // Throws std::invalid_argument naming the column for an unknown or unsupported column, a column
  // with nulls and no fill, or an indices table that is not one integer column.
  ArrowSource(std::shared_ptr<const ArrowTable> table, std::vector<ArrowColumnRequest> columns,
              std::shared_ptr<const ArrowTable> indices = nullptr);
  const std::vector<PartSchema>& schema() const override { return schema_; }
  int64_t size() const override { return size_; }
  void fill(const FillRequest& request) override;

  // Where one column's rows are in one chunk (see arrow_source.cpp).
  struct ChunkView {
    std::vector<std::pair<const uint8_t*, int64_t>> validity;
    const std::byte* indices = nullptr;  // dictionary: the chunk's row r has value row indices[r]
    int64_t dict_rows = 0;
    const std::byte* data = nullptr;
    int64_t bit0 = 0;
    const void* offsets = nullptr;
    int64_t items = -1;
  };
  struct Column {
    ArrowColumnRequest request;
    ArrowColumnInfo info;
    int64_t row_bytes = 0;   // fixed / bool: a row; list / string: the slot
    int64_t item_bytes = 0;  // list / string: one item
    bool wide_offsets = false;
    DType index_type;
    bool plain = true;  // no chunk has validity or a dictionary: the fast path
    std::vector<ChunkView> chunks;
  };

 private:
  std::shared_ptr<const ArrowTable> table_, indices_;
  std::vector<Column> columns_;
  std::vector<PartSchema> schema_;
  std::vector<const std::byte*> index_data_;  // the indices table's values per chunk
  DType index_dtype_;
  int64_t size_ = 0;
};

}  // namespace fastload
