// Arrow record batches held through the C data interface (arrow_c_data.h): the owner of the
// exported arrays (released when it goes), and the description of every column a batch can hold
// (arrow_types.h), read from the schema and each chunk's array headers only, never from the data
// (validity bitmaps and offsets of columns that report nulls excepted: a null is looked for
// only in the rows a chunk holds, below rows that are not null themselves).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/arrow_c_data.h"
#include "core/arrow_types.h"

namespace fastload {

// Record batches and their schema, owned: moved in from their producer, released at destruction.
class ArrowTable {
 public:
  // Takes ownership of `schema` and `batches` (their release callbacks are called here from now
  // on; the callers' structs are marked released). The schema must be a struct (a record batch).
  // Throws std::invalid_argument on a schema that is not a struct or batches that do not match it.
  ArrowTable(ArrowSchema* schema, std::vector<ArrowArray*> batches);
  ~ArrowTable();
  ArrowTable(const ArrowTable&) = delete;
  ArrowTable& operator=(const ArrowTable&) = delete;

  const std::vector<ArrowColumnInfo>& columns() const { return columns_; }
  int64_t rows() const { return starts_.back(); }
  const std::vector<int64_t>& starts() const { return starts_; }  // chunk c: rows [starts[c], starts[c + 1])
  size_t num_chunks() const { return batches_.size(); }
  const ArrowArray& chunk(size_t c) const { return *batches_[c]; }
  const ArrowSchema& schema() const { return *schema_; }
  // The schema's key-value metadata (e.g. Hugging Face's "huggingface" features).
  std::vector<std::pair<std::string, std::string>> metadata() const { return arrow_metadata(schema_->metadata); }
  // The schema of a column (a dictionary column's: of its indices).
  const ArrowSchema& column_schema(const ArrowColumnInfo& c) const;
  // Column `column`'s longest row in items (list) or bytes (string): reads every offset.
  int64_t longest(size_t column) const;
  const ArrowColumnInfo& column(const std::string& name) const;  // throws std::invalid_argument
  size_t column_index(const std::string& name) const;

 private:
  ArrowSchema* schema_ = nullptr;
  std::vector<ArrowArray*> batches_;  // non-empty chunks only
  std::vector<int64_t> starts_{0};
  std::vector<ArrowColumnInfo> columns_;
};

// Where a column sits in one chunk: its array, the physical index in it of the chunk's row 0, and
// the validity bitmaps on the way (struct parents, then the column; only those that may hold
// nulls) with the bit of the chunk's row 0 in each.
struct ArrowLeafAt {
  const ArrowArray* array = nullptr;
  int64_t first = 0;
  std::vector<std::pair<const uint8_t*, int64_t>> validity;
};
// Throws std::invalid_argument if the chunk's arrays do not have the children the path names.
ArrowLeafAt leaf_at(const ArrowArray& batch, const std::vector<int>& path, const std::string& name);

// An indices mapping (a Hugging Face dataset's `_indices`): one integer column without nulls.
// Returns each chunk's first value (the chunk's slice offset applied) and sets *dtype to their
// integer type; throws std::invalid_argument for anything else.
std::vector<const std::byte*> arrow_indices_data(const ArrowTable& indices, DType* dtype);

// The first chunk row in [0, rows) that is not null itself (its validity on the way is `validity`)
// but holds a null below it (a list item, a fixed-size list element, at any depth), or -1. `leaf`
// is the column's array (schema `s`) with the chunk's row 0 at physical index `first`; the values
// of a null row are not looked at (a producer may leave anything there).
int64_t first_nested_null(const ArrowArray& leaf, const ArrowSchema& s, int64_t first, int64_t rows,
                          const std::vector<std::pair<const uint8_t*, int64_t>>& validity);
// The first chunk row in [0, rows) not null itself whose dictionary value is null, or -1.
int64_t first_null_dictionary_value(const ArrowArray& leaf, DType index_type, int64_t first, int64_t rows,
                                    const std::vector<std::pair<const uint8_t*, int64_t>>& validity);

// Element i of an integer array of type t, as int64 (uint64 past int64's range reads negative).
int64_t read_arrow_index(const std::byte* p, DType t, int64_t i);

// Whether array elements [offset, offset + length) hold a null (reads the bitmap only when the
// producer did not count them).
bool has_nulls(const ArrowArray& a, int64_t offset, int64_t length);

// The index of the first 0 bit in bits [offset, offset + length) of a validity bitmap, or -1.
int64_t first_zero_bit(const uint8_t* bitmap, int64_t offset, int64_t length);

}  // namespace fastload
