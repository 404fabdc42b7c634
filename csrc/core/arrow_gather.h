// How one Arrow column is gathered into a batch: the plan of a column checked against the table's
// schema (ArrowColumnPlan), where its rows are in one chunk (ArrowChunkView), and the gather of a
// block of rows into the batch's parts. Shared by ArrowSource and RowGroupSource.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/arrow_rows.h"
#include "core/arrow_table.h"
#include "core/batch_source.h"
#include "core/value_decoder.h"

namespace fastload {

// How one column is read into the batch.
struct ArrowColumnRequest {
  std::string name;
  int64_t max_items = 0;            // list / string: the padded slot (items or bytes); rows are cut to it
  std::vector<std::byte> pad;       // list / string: one element's bytes, repeated past a row's end
  bool fill = false;                // null rows become `fill_value`
  // fixed / bool: one row's bytes. list / string: a null row's items (whole items, cut to the
  // slot; empty: an empty row). A string asked for as a list: the value's bytes, unless fill_none.
  std::vector<std::byte> fill_value;
  bool fill_none = false;           // a string asked for as a list: a null row stays None
  bool with_valid = false;          // add "<name>_valid" (bool): false where the row was null
  bool as_list = false;             // string / binary: the batch's values as a list (extras), not a part
  // fixed / bool: the shape a row is read as (the same number of elements; an extension type's
  // shape, e.g. arrow.fixed_shape_tensor). Empty: the type's own.
  std::vector<int64_t> shape;
  // list: the declared sizes of its variable-size list levels (a Hugging Face Array2D/Array3D
  // stored as lists of lists): one per level, the row's level first; -1 for the row's level
  // means any length (padded, with lengths). Each row is checked against it as it is read.
  std::vector<int64_t> list_shape;
  // A binary column decoded per row into a fixed-size part (an image column: decode=). The part
  // is named `decoded_name`; a null value reads the file named by the string column
  // `path_column` of the same row (a Hugging Face Image feature's struct<bytes, path>), if given.
  std::shared_ptr<const ValueDecoder> decoder;
  std::string decoded_name;
  std::string path_column;
};

// What a batch carries for string columns asked for as lists (FillRequest::extras): per column,
// the batch's values back to back and where each row's start (count + 1 offsets); a null row
// (filled with None) has valid 0. The bindings turn them into Python lists of str (bytes for binary).
struct ArrowStringLists {
  std::vector<std::string> names;
  std::vector<bool> utf8;
  std::vector<std::vector<char>> bytes;
  std::vector<std::vector<int64_t>> offsets;
  std::vector<std::vector<uint8_t>> valid;
  // Per column, when not empty: its values are JSON texts, parsed by the bindings (tar shards'
  // .json members, tar_source.h). Arrow columns leave it empty.
  std::vector<bool> json;
};

std::string arrow_valid_name(const std::string& column);

// Where one column's rows are in one chunk.
struct ArrowChunkView {
  int64_t row0 = 0;  // the row number of the chunk's row 0 in the data (messages)
  std::vector<std::pair<const uint8_t*, int64_t>> validity;  // (bitmap, bit of the chunk's row 0)
  const std::byte* indices = nullptr;  // dictionary: the chunk's row r has value row indices[r]
  int64_t dict_rows = 0;
  const uint8_t* dict_valid = nullptr;  // dictionary: its values' validity (when some are null)
  int64_t dict_bit0 = 0;
  const std::byte* data = nullptr;     // fixed: value row v at data + v * row_bytes; list: items (bits for bool)
  int64_t bit0 = 0;                    // bool: element j of value row v at bit bit0 + v * elements + j
  ArrowListOffsets list;               // list: value row v's items in the list's child
  std::vector<ArrowListOffsets> inner; // list: the inner variable-size list levels, outermost first
  int64_t leaf_items = -1;             // list: the items below the last level (bounds)
  ArrowStrings strings;                // string / binary
  std::shared_ptr<const ArrowChunkView> path;  // decoded: the path column's view in this chunk
  bool plain() const { return validity.empty() && !indices; }
};

// How one column is gathered, checked against the table's schema.
struct ArrowColumnPlan {
  ArrowColumnRequest request;
  ArrowColumnInfo info;
  std::vector<int64_t> item_shape;  // fixed / bool: a row's shape; list: one item's shape (declared too)
  int64_t row_bytes = 0;   // fixed / bool: a row; list / string: the slot
  int64_t item_bytes = 0;  // list / string: one item
  int64_t leaf_bytes = 0;  // list: one item of the values below the last list level
  bool exact = false;      // list: every row has max_items items (a declared size): no lengths part
  DType index_type;
  bool utf8 = false;  // a string (not binary) column
  std::shared_ptr<const ArrowColumnPlan> path;  // decoded: the plan of its path column, if any
  bool decoded() const { return request.decoder != nullptr; }
  bool is_list() const {
    return (info.kind == ArrowKind::kList || info.kind == ArrowKind::kBytes) && !request.as_list && !decoded();
  }
  bool has_lengths() const { return is_list() && !exact; }
};

// Throws std::invalid_argument naming the column for an unknown or unsupported column, nulls
// without a fill (when `check_nulls`), or a bad pad, fill value or shape.
ArrowColumnPlan plan_arrow_column(const ArrowTable& table, ArrowColumnRequest request, bool check_nulls = true);
// The batch parts a column fills: its rows, then lengths (list / string), then valid.
void add_arrow_parts(const ArrowColumnPlan& plan, std::vector<PartSchema>& parts);
// The column in one chunk of `table` (whose schema must give the column the plan's type); the
// chunk's row 0 is row `row0` of the data.
ArrowChunkView arrow_chunk_view(const ArrowTable& table, size_t chunk, const ArrowColumnPlan& plan, int64_t row0);
// Rows [0, n) of a block: row i is chunk row rows[i] of views[i]; slot i at dst + i * row_bytes;
// lengths and valid may be null. `plain`: every view is plain().
void gather_arrow_column(const ArrowColumnPlan& plan, const ArrowChunkView* const* views, const int64_t* rows,
                         int64_t n, bool plain, std::byte* dst, int64_t* lengths, bool* valid);

// A string column asked for as a list: appends rows [0, n) of a block to column k of `lists`
// (and writes valid[i] when not null).
void collect_arrow_strings(const ArrowColumnPlan& plan, const ArrowChunkView* const* views, const int64_t* rows,
                           int64_t n, ArrowStringLists& lists, size_t k, bool* valid);
// Appends `from`'s rows after `into`'s (a mixture's batch, run by run); `into` without columns
// takes `from`'s. Throws std::invalid_argument if both have columns and they differ.
void append_arrow_string_lists(ArrowStringLists& into, const ArrowStringLists& from);
// A decoded column: rows [0, n) of a block (row i is chunk row rows[i] of views[i]; its sample id
// ids[i], its epoch epochs[i], or `epoch` for all when epochs is null) decoded into
// dst + i * row_bytes.
void decode_arrow_values(const ArrowColumnPlan& plan, const ArrowChunkView* const* views, const int64_t* rows,
                         const int64_t* ids, const int64_t* epochs, int64_t n, uint64_t seed, int64_t epoch,
                         std::byte* dst);
// A list of the plans' string columns asked for as lists (names, types), ready to collect into.
std::shared_ptr<ArrowStringLists> arrow_string_lists(const std::vector<const ArrowColumnPlan*>& plans, int64_t rows);

// Blocks of this many rows are resolved at a time (on the stack).
inline constexpr int64_t kArrowBlock = 256;

// The string lists a batch of `r` carries for the string columns asked for as lists (`plans`),
// attached to its extras; null when there are none.
std::shared_ptr<ArrowStringLists> attach_arrow_string_lists(const std::vector<const ArrowColumnPlan*>& plans,
                                                            const FillRequest& r);

// One block of a batch: rows [b, b + n) of `r` for every column plans[c], row i being row rows[i]
// of the chunk view view_of(c, i). Strings asked for as lists go to `lists`, the rest into the
// request's parts (in schema order).
template <typename ViewOf>
void gather_arrow_block(const std::vector<const ArrowColumnPlan*>& plans, const FillRequest& r, int64_t b, int64_t n,
                        const int64_t* rows, const ViewOf& view_of, ArrowStringLists* lists) {
  const ArrowChunkView* views[kArrowBlock];
  size_t p = 0, k = 0;
  for (size_t c = 0; c < plans.size(); ++c) {
    const ArrowColumnPlan& col = *plans[c];
    bool plain = true;
    for (int64_t i = 0; i < n; ++i) {
      views[i] = view_of(c, i);
      plain = plain && views[i]->plain();
    }
    if (col.request.as_list) {
      bool* valid = col.request.with_valid ? reinterpret_cast<bool*>(r.parts[p++]) + b : nullptr;
      collect_arrow_strings(col, views, rows, n, *lists, k++, valid);
      continue;
    }
    std::byte* dst = r.parts[p++] + b * col.row_bytes;
    if (col.decoded()) {
      decode_arrow_values(col, views, rows, r.ids + b, r.source_epochs ? r.source_epochs + b : nullptr, n, r.seed,
                          r.epoch, dst);
      continue;
    }
    int64_t* lengths = col.has_lengths() ? reinterpret_cast<int64_t*>(r.parts[p++]) + b : nullptr;
    bool* valid = col.request.with_valid ? reinterpret_cast<bool*>(r.parts[p++]) + b : nullptr;
    gather_arrow_column(col, views, rows, n, plain, dst, lengths, valid);
  }
}

}  // namespace fastload
