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
  bool as_list = false;             // string / binary: the batch's values as a list (extras), not a part
};

// What a batch carries for string columns asked for as lists (FillRequest::extras): per column,
// the batch's values back to back and where each row's start (count + 1 offsets); a null row
// (filled) has valid 0. The bindings turn them into Python lists of str (bytes for binary).
struct ArrowStringLists {
  std::vector<std::string> names;
  std::vector<bool> utf8;
  std::vector<std::vector<char>> bytes;
  std::vector<std::vector<int64_t>> offsets;
  std::vector<std::vector<uint8_t>> valid;
};

std::string arrow_valid_name(const std::string& column);

// Where one column's rows are in one chunk (see arrow_source.cpp).
struct ArrowChunkView {
  std::vector<std::pair<const uint8_t*, int64_t>> validity;  // (bitmap, bit of the chunk's row 0)
  const std::byte* indices = nullptr;  // dictionary: the chunk's row r has value row indices[r]
  int64_t dict_rows = 0;
  const std::byte* data = nullptr;     // fixed: value row v at data + v * row_bytes; list: items
  int64_t bit0 = 0;                    // bool: element j of value row v at bit bit0 + v * elements + j
  const void* offsets = nullptr;       // list / string: value row v is [offsets[v], offsets[v + 1])
  int64_t items = -1;                  // list: the items there are (bounds check)
  bool plain() const { return validity.empty() && !indices; }
};

// How one column is gathered, checked against the table's schema.
struct ArrowColumnPlan {
  ArrowColumnRequest request;
  ArrowColumnInfo info;
  int64_t row_bytes = 0;   // fixed / bool: a row; list / string: the slot
  int64_t item_bytes = 0;  // list / string: one item
  bool wide_offsets = false;
  DType index_type;
  bool utf8 = false;  // a string (not binary) column
  bool is_list() const { return (info.kind == ArrowKind::kList || info.kind == ArrowKind::kBytes) && !request.as_list; }
};

// Throws std::invalid_argument naming the column for an unknown or unsupported column, nulls
// without a fill (when `check_nulls`), or a bad pad or fill value.
ArrowColumnPlan plan_arrow_column(const ArrowTable& table, ArrowColumnRequest request, bool check_nulls = true);
// The batch parts a column fills: its rows, then lengths (list / string), then valid.
void add_arrow_parts(const ArrowColumnPlan& plan, std::vector<PartSchema>& parts);
// The column in one chunk of `table` (whose schema must give the column the plan's type).
ArrowChunkView arrow_chunk_view(const ArrowTable& table, size_t chunk, const ArrowColumnPlan& plan);
// Rows [0, n) of a block: row i is chunk row rows[i] of views[i]; slot i at dst + i * row_bytes;
// lengths and valid may be null. `plain`: every view is plain().
void gather_arrow_column(const ArrowColumnPlan& plan, const ArrowChunkView* const* views, const int64_t* rows,
                         int64_t n, bool plain, std::byte* dst, int64_t* lengths, bool* valid);

// A string column asked for as a list: appends rows [0, n) of a block to column k of `lists`.
void collect_arrow_strings(const ArrowColumnPlan& plan, const ArrowChunkView* const* views, const int64_t* rows,
                           int64_t n, ArrowStringLists& lists, size_t k);
// Appends `from`'s rows after `into`'s (a mixture's batch, run by run); `into` without columns
// takes `from`'s. Throws std::invalid_argument if both have columns and they differ.
void append_arrow_string_lists(ArrowStringLists& into, const ArrowStringLists& from);
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
      collect_arrow_strings(col, views, rows, n, *lists, k++);
      continue;
    }
    std::byte* dst = r.parts[p++] + b * col.row_bytes;
    int64_t* lengths = col.is_list() ? reinterpret_cast<int64_t*>(r.parts[p++]) + b : nullptr;
    bool* valid = col.request.with_valid ? reinterpret_cast<bool*>(r.parts[p++]) + b : nullptr;
    gather_arrow_column(col, views, rows, n, plain, dst, lengths, valid);
  }
}

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
  // For readers other than fill() (a packer reads list columns by token range).
  const std::shared_ptr<const ArrowTable>& table() const { return table_; }
  const std::shared_ptr<const ArrowTable>& indices() const { return indices_; }

 private:
  std::vector<const ArrowColumnPlan*> plans_, string_plans_;  // into columns_
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
// Element i of an integer array of type t, as int64 (uint64 past int64's range reads negative).
int64_t read_arrow_index(const std::byte* p, DType t, int64_t i);

}  // namespace fastload
