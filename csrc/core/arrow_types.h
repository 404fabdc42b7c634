// What an Arrow column is, read from its schema alone (arrow_c_data.h): the kind of rows the gather
// makes of it, its element type and shape, why it cannot be read when it cannot, and the metadata
// a caller needs to interpret it further (extension types, the schema's key-value pairs).
#pragma once
#include <cstdint>
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
  kList,   // list / large_list / list_view of fixed-width or bool items: padded rows plus lengths
  kBytes,  // string / binary (their large and view forms): bytes padded as uint8 plus lengths, or a list
};

// One column of the batch. Unsupported columns are listed too (with `unsupported` saying why), so
// that a caller refuses them only when they are asked for.
struct ArrowColumnInfo {
  std::string name;        // "parent.child" for a struct's fields
  std::vector<std::string> field_path;  // the field names from the record batch down to the column
  std::string type;        // the Arrow type, for messages
  std::string unsupported; // empty when the gather can read it
  ArrowKind kind = ArrowKind::kFixed;
  DType dtype;                      // of one element
  std::vector<int64_t> item_shape;  // fixed/bool: a row's shape; list: one item's shape (fixed-size dims)
  int64_t elements = 1;             // elements per row (fixed/bool) or per item (list)
  // kList: variable-size list levels inside the row's list (list<list<T>>: 1). Their sizes are not
  // in the type: such a column is read only with a declared shape (ArrowColumnRequest::list_shape).
  int inner_lists = 0;
  bool views = false;               // kBytes: string_view / binary_view; kList: a list_view row level
  bool dictionary = false;          // dictionary-encoded (decoded by the gather)
  int64_t first_null = -1;          // the first row that is null (a struct parent's null counts)
  std::vector<int> path;            // child indices from the record batch down to the column
  std::string extension;            // the column's ARROW:extension:name ("" for none)
  std::string extension_metadata;   // its ARROW:extension:metadata
  // A struct<bytes, path> (a Hugging Face Image / Audio feature): unsupported as a column, read
  // only as an image column (decode=), its fields kept together.
  bool media = false;
};

// The key-value pairs of a schema's `metadata` (the C data interface's binary encoding); empty
// for none. Throws std::invalid_argument if the encoding runs past its own lengths.
std::vector<std::pair<std::string, std::string>> arrow_metadata(const char* metadata);

// A readable name for the type of schema `s` (the C data interface's format otherwise).
std::string arrow_type_name(const ArrowSchema* s);

// Fixed-width numbers (dates, times, timestamps and durations as their integers).
bool arrow_fixed_dtype(const char* format, DType* out);

// The leaf columns of a struct schema's fields (struct fields flattened to "parent.child").
std::vector<ArrowColumnInfo> describe_arrow_columns(const ArrowSchema& record_batch);

bool arrow_wide_offsets(const ArrowSchema& s);  // large_list, large_string, large_binary (and list views)
bool arrow_is_list(const ArrowSchema& s);        // list / large_list (not views)
bool arrow_is_list_view(const ArrowSchema& s);   // list_view / large_list_view

}  // namespace fastload
