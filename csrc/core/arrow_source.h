// Arrow columns as a batch source: the collation threads gather rows straight from the Arrow
// buffers of an ArrowTable (chunks are shards) into the batch, decoding what Arrow packs (bits,
// dictionaries, list offsets, string views) on the way (arrow_gather.h). An optional indices
// table (a Hugging Face dataset's `select`/`shuffle` mapping) is one more indirection before the
// gather.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/arrow_gather.h"
#include "core/arrow_table.h"
#include "core/batch_source.h"

namespace fastload {

class ArrowSource final : public BatchSource {
 public:
  // Throws std::invalid_argument as plan_arrow_column does, or for an indices table that is not
  // one integer column.
  ArrowSource(std::shared_ptr<const ArrowTable> table, std::vector<ArrowColumnRequest> columns,
              std::shared_ptr<const ArrowTable> indices = nullptr);
  const std::vector<PartSchema>& schema() const override { return schema_; }
  int64_t size() const override { return size_; }
  void fill(const FillRequest& request) override;
  bool has_string_lists() const override { return !string_plans_.empty(); }
  bool wants_source_epochs() const override { return decoded_; }  // an image column keys crops by them
  // For readers other than fill() (a packer reads list columns by token range).
  const std::shared_ptr<const ArrowTable>& table() const { return table_; }
  const std::shared_ptr<const ArrowTable>& indices() const { return indices_; }

 private:
  std::vector<const ArrowColumnPlan*> plans_, string_plans_;  // into columns_
  bool decoded_ = false;  // some column is decoded per row (decode=)
  struct Column {
    ArrowColumnPlan plan;
    std::vector<ArrowChunkView> chunks;
  };
  std::shared_ptr<const ArrowTable> table_, indices_;
  std::vector<Column> columns_;
  std::vector<PartSchema> schema_;
  std::vector<const std::byte*> index_data_;  // the indices table's values per chunk
  DType index_dtype_;
  int64_t size_ = 0;
};

// The chunk holding row `id` of a table whose chunk c holds rows [starts[c], starts[c + 1]).
size_t arrow_chunk_of(const std::vector<int64_t>& starts, int64_t id);

}  // namespace fastload
