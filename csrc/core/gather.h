// Row gathering: copies the rows named by sample ids from a column into a contiguous batch. A
// column is one strided array, or a table of shards (many files are one column), and its rows
// are fixed-size or ragged (a padded slot plus a length).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/lazy_mappings.h"

namespace fastload {

// One contiguous piece of a column. Fixed rows: row r is row_bytes at base + r * pitch. Ragged
// rows: row r is items [offsets[r], offsets[r + 1]) of the shard's values, item k at
// base + k * pitch; `items` bounds the offsets (they come from files and are checked per row).
// A lazily mapped shard (set_lazy_shards) has no base or offsets: they are where its files'
// data start once mapped.
struct Shard {
  const std::byte* base = nullptr;
  int64_t rows = 0;
  int64_t pitch = 0;
  const int64_t* offsets = nullptr;  // ragged only: rows + 1 entries
  int64_t items = 0;                 // ragged only
};

// A column as the core sees it. With no shard table, sample i is row_bytes bytes at
// base + i * pitch (a dataset column has pitch == row_bytes; a Windows source has
// pitch = stride * itemsize and overlapping rows). With one (set_shards), sample i is row
// i - starts[s] of the shard s with starts[s] <= i < starts[s + 1]: every collation thread reads
// the same table, and finds s from a bucket table of O(shards) entries (the shard of every
// 2^bucket_shift-th sample, then at most bucket_walk steps), or by a binary search when shard
// sizes are too uneven for that; never a per-sample index.
struct ArrayColumn {
  std::string name;
  DType dtype;                     // of one element (a ragged column: of one item's elements)
  std::vector<int64_t> row_shape;  // of one sample as the batch holds it
  const std::byte* base = nullptr;
  int64_t rows = 0;
  int64_t pitch = 0;
  int64_t row_bytes = 0;  // ragged: the padded slot, max_items * item_bytes
  std::vector<Shard> shards;
  std::vector<int64_t> starts;  // shards.size() + 1 entries; starts.back() == rows
  std::vector<int64_t> shard_index;  // each shard's place in the list given (empty ones are dropped)
  // Per shard given (shard_index's numbering; may be empty): where its data come from (a ragged
  // shard's offsets file), named in messages about them.
  std::vector<std::string> shard_labels;
  std::vector<uint32_t> buckets;     // empty: binary search
  int bucket_shift = 0, bucket_walk = 0;
  // Ragged: the batch gets the slot part and an int64 lengths part (items written per row).
  bool ragged = false;
  int64_t item_bytes = 0;
  std::vector<std::byte> pad;  // one element's bytes, repeated over a slot past the row's end
  // Lazily mapped shards (set_lazy_shards): shard s's rows are the data of file lazy_file[s] of
  // `lazy` (a ragged shard's offsets: of file lazy_offsets_file[s]), mapped by the collation
  // thread that needs them and pinned while it copies a block of rows.
  std::shared_ptr<LazyFiles> lazy;
  std::vector<int32_t> lazy_file, lazy_offsets_file;
  // A lazy ragged column: a row of more items than this, found when its shard's offsets are first
  // mapped, is an error naming the file, not a row cut to the slot; -1 when cuts were asked for.
  int64_t longest = -1;

  bool sharded() const { return !shards.empty(); }
  int64_t max_items() const { return ragged && item_bytes ? row_bytes / item_bytes : 0; }
  // Batch parts this column fills: its rows, and for a ragged column the lengths after them.
  int num_parts() const { return ragged ? 2 : 1; }
};

// Installs a shard table (rows becomes the sum of shard rows). A ragged column needs one, with
// item_bytes, pad (dividing item_bytes) and row_bytes a multiple of item_bytes set before.
// Throws std::invalid_argument naming the column on a bad table.
void set_shards(ArrayColumn& col, std::vector<Shard> shards);

// Installs a table of lazily mapped shards: shard s is file files[s] of `lazy` (a ragged one's
// offsets file offsets_files[s]), whose data must hold its rows (base and offsets are ignored).
// Throws std::invalid_argument naming the column on a bad table.
void set_lazy_shards(ArrayColumn& col, std::vector<Shard> shards, std::shared_ptr<LazyFiles> lazy,
                     std::vector<int32_t> files, std::vector<int32_t> offsets_files);

// Batch parts of at least this many bytes (of rows of 16 KiB or more) are copied with streaming
// stores (x86): half the last-level cache unless set. Tests set 0 to exercise that copy on small
// data; a negative value restores the default.
int64_t streaming_min_part_bytes();
void set_streaming_min_part_bytes(int64_t bytes);

// Rows of 128 B to 2 KiB are copied with AVX2 moves where the CPU has them (see gather.cpp).
// Tests pass false to exercise the baseline copy on such a CPU; true restores the default.
void set_wide_row_copies(bool allowed);

// Fills `bytes` bytes at p with `pattern` repeated (a pad value of one item); a one-byte pattern
// (or all bytes equal) is a memset.
void fill_pattern(std::byte* p, int64_t bytes, const std::vector<std::byte>& pattern);

// dst[i] = row ids[i] of col, for i < count. ids must be in [0, col.rows). Not for ragged columns.
void gather_rows(const ArrayColumn& col, const int64_t* ids, int64_t count, std::byte* dst);

// dst[i] = the row_bytes bytes at rows[i], for i < count: rows the caller resolved (a mixture
// of strided columns), copied as gather_rows copies a part of count rows.
void gather_addresses(const std::byte* const* rows, int64_t row_bytes, int64_t count, std::byte* dst);

// A ragged column: slot i of dst holds row ids[i]'s items, cut at max_items() and padded;
// lengths[i] the items written. Throws std::invalid_argument if a row's offsets fall outside its
// shard's values (a corrupt file), naming the column, shard and row.
// Both throw std::invalid_argument naming the file if a lazily mapped shard cannot be mapped or
// is not the file its source opened (see LazyFiles::pin).
void gather_ragged(const ArrayColumn& col, const int64_t* ids, int64_t count, std::byte* dst,
                   int64_t* lengths);

// Ragged rows read by item range (a packer reads pieces of rows; pack_documents.h).
// lengths[i] = items of row ids[i]. Throws as gather_ragged does for corrupt offsets or a lazily
// mapped shard that cannot be mapped.
void ragged_row_lengths(const ArrayColumn& col, const int64_t* ids, int64_t count, int64_t* lengths);

// Piece i: items [first, first + count) of row `id` to dst; the row must have `expect` items (else
// `mismatch(col, id, items, expect)` is called, which must throw).
struct RaggedPiece {
  int64_t id = 0;
  int64_t first = 0;
  int64_t count = 0;
  int64_t expect = 0;
  std::byte* dst = nullptr;
};
void gather_ragged_pieces(const ArrayColumn& col, const RaggedPiece* pieces, int64_t count,
                          void (*mismatch)(const ArrayColumn& col, int64_t id, int64_t items, int64_t expect));

}  // namespace fastload
