// Packing one window of documents into rows of `length` tokens, from their lengths alone:
// best-fit decreasing. The rule, which tests/pack_reference.py states again in Python:
//   1. Documents are taken in window order; an empty one is skipped (counted). One longer than
//      `length` is cut to its first `length` tokens (truncate), or split into pieces of
//      `length` tokens from its start, each a row of its own, plus the remainder (split), or
//      refused (error).
//   2. The pieces to place (one per document, the remainder for a split one) go in order of
//      decreasing length (ties: earlier in the window first) each into the open row with the
//      least room that still fits it; among rows with that room, the one that reached it last.
//      No row fits: a new row. A row is closed when full or when it holds max_segments pieces.
//   3. A row's segments are in window order; rows are in the window order of their first segment.
// Nothing here reads data: the caller gives lengths (list offsets) and reads tokens later.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

enum class PackSplit { Truncate, Split, Error };
inline const char* const kPackSplitNames[] = {"truncate", "split", "error"};
PackSplit parse_pack_split(const std::string& s);  // throws std::invalid_argument naming split=

struct PackOptions {
  int64_t length = 0;        // tokens per row
  int64_t max_segments = 0;  // segments per row at most; 0: no bound but the row's length
  PackSplit split = PackSplit::Truncate;
  void validate() const;     // throws std::invalid_argument naming the option and value
  // Segments a row can hold (min(length, max_segments)).
  int64_t segment_bound() const { return max_segments > 0 && max_segments < length ? max_segments : length; }
};

// Tokens [start, start + count) of document `doc` (of doc_length tokens) in a row.
struct PackSegment {
  int64_t doc = 0;
  int64_t start = 0;
  int64_t count = 0;
  int64_t doc_length = 0;
};

// A window's rows: row r is segments[row_start[r], row_start[r + 1]) (laid out), or only counted.
struct PackedWindow {
  int64_t rows = 0;
  std::vector<int64_t> row_start;  // rows + 1 entries when laid out, else empty
  std::vector<PackSegment> segments;
  int64_t tokens = 0;     // placed
  int64_t truncated = 0;  // cut away (split="truncate")
  int64_t empty = 0;      // empty documents skipped
  int64_t longest = 0;    // the longest segment
};

// One thread's reusable memory for pack_window (sized by the first window, kept for the next).
class PackScratch {
 public:
  struct Item {
    int64_t count;
    int32_t pos;    // in the window
    int64_t start;  // in the document
  };
  std::vector<Item> items;
  std::vector<int32_t> row_of;  // per item
  std::vector<int64_t> room;    // per row
  std::vector<int32_t> pieces;  // per row
  std::vector<int32_t> next;    // per row: the next row of its room's stack
  std::vector<int32_t> head;    // per room (0..length): the last row to reach it, or -1
  std::vector<uint64_t> bits, summary;  // rooms with a row: a two-level bitset over head
  std::vector<uint64_t> order;  // sort keys: (room left unused, item index)
  std::vector<int32_t> waiting; // rows still open after the window
  std::vector<std::pair<int64_t, int32_t>> keys;
};

// Packs the documents docs[0, n) (lengths[i] tokens each, in window order) into `out` (cleared
// first). With count_only the rows are counted, not laid out (row_start and segments stay empty). Throws std::invalid_argument for a document longer than length with split="error",
// naming the document.
void pack_window(const int64_t* docs, const int64_t* lengths, int64_t n, const PackOptions& options,
                 bool count_only, PackScratch& scratch, PackedWindow& out);

}  // namespace fastload
