// Arrow record batches held through the C data interface (arrow_c_data.h): the owner of the
// exported arrays (released when it goes), and the description of every column a batch can hold
// (struct columns flattened to "parent.child"), read from the schema and each chunk's array
// headers only, never from the data (validity bitmaps of columns that report nulls excepted).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/arrow_c_data.h"
#include "core/dtype.h"

namespace fastload {

// What a leaf column's rows are, as the gather reads them.
enum class ArrowKind : uint8_t {
  kFixed,  // fixed-width numbers, fixed-size lists of them (nested), fixed-size binary
  kBool,   // bit-packed booleans (and fixed-size lists of them): unpacked to one byte each
  kList,   // list / large_list of fixed-width items: padded rows plus lengths
  kBytes,  // string / binary (and their large forms): UTF-8 bytes padded as uint8 plus lengths
};

// One column of the batch. Unsupported columns are listed too (with `unsupported` saying why), so
// that a caller refuses them only when they are asked for.
struct ArrowColumnInfo {
  std::string name;        // "parent.child" for a struct's fields
  std::string type;        // the Arrow type, for messages
  std::string unsupported; // empty when the gather can read it
  ArrowKind kind = ArrowKind::kFixed;
  DType dtype;                      // of one element
  std::vector<int64_t> item_shape;  // fixed/bool: a row's shape; list: one item's shape
  int64_t elements = 1;             // elements per row (fixed/bool) or per item (list)
  bool dictionary = false;          // dictionary-encoded (decoded by the gather)
  int64_t first_null = -1;          // the first row that is null (a struct parent's null counts)
  std::vector<int> path;            // child indices from the record batch down to the column
};

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

// Whether array elements [offset, offset + length) hold a null (reads the bitmap only when the
// producer did not count them).
bool has_nulls(const ArrowArray& a, int64_t offset, int64_t length);

// The index of the first 0 bit in bits [offset, offset + length) of a validity bitmap, or -1.
int64_t first_zero_bit(const uint8_t* bitmap, int64_t offset, int64_t length);

}  // namespace fastload
