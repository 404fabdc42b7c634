// Where a packer reads documents: the list columns of a source, read by token range. Planning
// asks only for lengths (list offsets, no data); the gather copies pieces of documents straight
// into a batch's packed rows. Each kind of source has its own reader: ragged array columns
// (fl.Dataset with fl.Ragged, dataset directories, mapped eagerly or lazily), Arrow list columns
// in memory (fl.Arrow, through a Hugging Face indices mapping too) and Parquet row groups (their
// decoded cache; lengths read once when the reader is made, as Parquet keeps none outside its
// pages).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/arrow_source.h"
#include "core/dtype.h"
#include "core/gather.h"

namespace fastload {

class RowGroupSource;

// One packed column: its name and one token's type and shape (a token may be a vector).
struct PackColumn {
  std::string name;
  DType dtype;
  std::vector<int64_t> item_shape;
  int64_t item_bytes = 0;
};

// Copy tokens [start, start + count) of document `doc` to token `out` of a batch's flat column;
// the document must have `length` tokens in every column (else an error naming it).
struct DocumentPiece {
  int64_t doc = 0;
  int64_t start = 0;
  int64_t count = 0;
  int64_t length = 0;
  int64_t out = 0;
};

// Documents whose columns disagree on a document's length are refused.
[[noreturn]] void unequal_lengths(int64_t doc, const std::string& column, int64_t items, const std::string& first,
                                  int64_t first_items);

class DocumentReader {
 public:
  virtual ~DocumentReader() = default;
  int64_t size() const { return size_; }
  const std::vector<PackColumn>& columns() const { return columns_; }
  // out[i] = tokens of document docs[i] in column `column`. Called by many threads at once.
  virtual void lengths(size_t column, const int64_t* docs, int64_t n, int64_t* out) const = 0;
  // Column `column`'s pieces, written at dst + piece.out * item_bytes. Called by many threads.
  virtual void copy(size_t column, const DocumentPiece* pieces, int64_t n, std::byte* dst) const = 0;
  // Whether lengths() is cheap enough to check every column of every document when the packer is
  // made (false: the lengths are checked as the pieces are copied).
  virtual bool checks_ahead() const { return true; }
  // What keeps the memory the reader reads alive (the bindings: the Python arrays and tables),
  // held for as long as the reader is: whoever holds the reader (a packer, an epoch's plan, a
  // thread planning ahead) may read. Set once, before the reader is shared.
  void keep_alive(std::shared_ptr<const void> owner) { owner_ = std::move(owner); }

 protected:
  int64_t size_ = 0;
  std::vector<PackColumn> columns_;

 private:
  std::shared_ptr<const void> owner_;
};

// The ragged columns of an array source (their shard tables as the source has them).
class RaggedDocuments final : public DocumentReader {
 public:
  // Throws std::invalid_argument if a column is not ragged or the columns' rows differ.
  explicit RaggedDocuments(std::vector<ArrayColumn> columns);
  void lengths(size_t column, const int64_t* docs, int64_t n, int64_t* out) const override;
  void copy(size_t column, const DocumentPiece* pieces, int64_t n, std::byte* dst) const override;

 private:
  std::vector<ArrayColumn> cols_;
};

// List columns of Arrow data in memory; `indices` (or null) maps a document to a table row.
class ArrowDocuments final : public DocumentReader {
 public:
  // Throws std::invalid_argument for a column that is not a list of fixed-width items, or that
  // holds nulls, naming it.
  ArrowDocuments(std::shared_ptr<const ArrowTable> table, std::shared_ptr<const ArrowTable> indices,
                 std::vector<ArrowColumnPlan> plans);
  void lengths(size_t column, const int64_t* docs, int64_t n, int64_t* out) const override;
  void copy(size_t column, const DocumentPiece* pieces, int64_t n, std::byte* dst) const override;

 private:
  int64_t table_row(int64_t doc) const;
  std::shared_ptr<const ArrowTable> table_, indices_;
  std::vector<ArrowColumnPlan> plans_;
  std::vector<std::vector<ArrowChunkView>> views_;  // [column][chunk]
  std::vector<const std::byte*> index_data_;
  DType index_dtype_;
};

// List columns of Parquet row groups, decoded through the row-group source's cache. The first
// column's lengths are read once here (every row group decoded; `threads` decode side by side)
// and kept: 4 bytes per document, the one per-document array a packer holds.
class RowGroupDocuments final : public DocumentReader {
 public:
  // Throws std::invalid_argument as ArrowDocuments does, or for a row group whose columns
  // disagree on a row's length (naming the document).
  RowGroupDocuments(std::shared_ptr<RowGroupSource> source, std::vector<std::string> names, int threads);
  void lengths(size_t column, const int64_t* docs, int64_t n, int64_t* out) const override;
  void copy(size_t column, const DocumentPiece* pieces, int64_t n, std::byte* dst) const override;
  bool checks_ahead() const override { return false; }  // checked while the lengths were read

 private:
  std::shared_ptr<RowGroupSource> source_;
  std::vector<ArrowColumnPlan> plans_;
  std::vector<int32_t> lengths_;  // of the first column
};

// The columns' plans a packer reads from an Arrow table: each a list column, by name.
std::vector<ArrowColumnPlan> arrow_list_plans(const ArrowTable& table, const std::vector<std::string>& names);

}  // namespace fastload
