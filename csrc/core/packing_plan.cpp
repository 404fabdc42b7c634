// Best-fit decreasing over one window; see packing_plan.h for the rule. Rows waiting for more
// pieces sit in stacks by their room (0..length), and a two-level bitset over the rooms finds the
// least room >= a piece in a few word scans: O(log length) per piece with no allocation, instead
// of an ordered set's node per insertion (NeMo's first-fit went quadratic for want of such an
// index; a window here is small, but an epoch packs every window once to count its rows).
#include "core/packing_plan.h"

#include <algorithm>
#include <stdexcept>

namespace fastload {

PackSplit parse_pack_split(const std::string& s) {
  for (int i = 0; i < 3; ++i)
    if (s == kPackSplitNames[i]) return static_cast<PackSplit>(i);
  throw std::invalid_argument("split must be 'truncate', 'split' or 'error', got '" + s + "'");
}

void PackOptions::validate() const {
  if (length <= 0) throw std::invalid_argument("length must be positive, got " + std::to_string(length));
  if (length > (int64_t{1} << 31) - 1)
    throw std::invalid_argument("length must be below 2**31 (cu_seqlens is int32), got " + std::to_string(length));
  if (max_segments < 0)
    throw std::invalid_argument("max_segments must be at least 1, got " + std::to_string(max_segments));
}

namespace {

// The rooms' stacks: push a row at its room, pop the last row pushed at the least room >= want.
class RoomIndex {
 public:
  RoomIndex(PackScratch& s, int64_t length) : s_(s), length_(length) {
    const size_t rooms = static_cast<size_t>(length) + 1;
    if (s_.head.size() != rooms) {  // a new length: sized once, then cleared row by row (reset)
      s_.head.assign(rooms, -1);
      s_.bits.assign((rooms + 63) / 64, 0);
      s_.summary.assign((s_.bits.size() + 63) / 64, 0);
    }
  }

  void push(int32_t row, int64_t room) {
    const size_t r = static_cast<size_t>(room);
    s_.next[static_cast<size_t>(row)] = s_.head[r];
    s_.head[r] = row;
    s_.bits[r >> 6] |= uint64_t{1} << (r & 63);
    s_.summary[r >> 12] |= uint64_t{1} << ((r >> 6) & 63);
  }

  // The last row pushed at the least room >= want, taken off its stack; -1 if none.
  int32_t pop_fitting(int64_t want) {
    const int64_t room = find(want);
    if (room < 0) return -1;
    const size_t r = static_cast<size_t>(room);
    const int32_t row = s_.head[r];
    s_.head[r] = s_.next[static_cast<size_t>(row)];
    if (s_.head[r] < 0) {
      s_.bits[r >> 6] &= ~(uint64_t{1} << (r & 63));
      if (s_.bits[r >> 6] == 0) s_.summary[r >> 12] &= ~(uint64_t{1} << ((r >> 6) & 63));
    }
    return row;
  }

  // Empties every stack a row is still in (rooms[row] for the rows flagged open).
  void reset(const std::vector<int64_t>& rooms, const std::vector<int32_t>& open_rows) {
    for (int32_t row : open_rows) {
      const size_t r = static_cast<size_t>(rooms[static_cast<size_t>(row)]);
      s_.head[r] = -1;
      s_.bits[r >> 6] = 0;
      s_.summary[r >> 12] = 0;
    }
  }

 private:
  int64_t find(int64_t want) const {
    if (want > length_) return -1;
    const size_t w = static_cast<size_t>(want) >> 6;
    const uint64_t here = s_.bits[w] & (~uint64_t{0} << (static_cast<size_t>(want) & 63));
    if (here) return static_cast<int64_t>(w * 64 + static_cast<size_t>(__builtin_ctzll(here)));
    // The next non-empty word after w: first in w's summary word, then in the summary words after.
    size_t sw = (w + 1) >> 6;
    if (sw >= s_.summary.size()) return -1;
    uint64_t m = (w + 1) & 63 ? s_.summary[sw] & (~uint64_t{0} << ((w + 1) & 63)) : s_.summary[sw];
    while (!m) {
      if (++sw >= s_.summary.size()) return -1;
      m = s_.summary[sw];
    }
    const size_t word = sw * 64 + static_cast<size_t>(__builtin_ctzll(m));
    return static_cast<int64_t>(word * 64 + static_cast<size_t>(__builtin_ctzll(s_.bits[word])));
  }

  PackScratch& s_;
  int64_t length_;
};

}  // namespace

void pack_window(const int64_t* docs, const int64_t* lengths, int64_t n, const PackOptions& o, bool count_only,
                 PackScratch& s, PackedWindow& out) {
  out.rows = 0;
  out.row_start.clear();
  out.segments.clear();
  out.tokens = out.truncated = out.empty = out.longest = 0;
  const int64_t length = o.length;
  const int64_t bound = o.segment_bound();
  // 1. The pieces to place; whole rows of a split document's first pieces (kept as items too,
  //    each alone in a row of its own, row_of set now).
  s.items.clear();
  for (int64_t j = 0; j < n; ++j) {
    const int64_t len = lengths[j];
    if (len < 0) throw std::invalid_argument("document " + std::to_string(docs[j]) + " has a negative length");
    if (len == 0) {
      ++out.empty;
      continue;
    }
    int64_t rest = len;
    if (len > length) {
      if (o.split == PackSplit::Error)
        throw std::invalid_argument("document " + std::to_string(docs[j]) + " has " + std::to_string(len) +
                                    " tokens, more than length=" + std::to_string(length) +
                                    " (split='error'; split='truncate' keeps its first tokens, split='split' "
                                    "carries the rest into further rows)");
      if (o.split == PackSplit::Truncate) {
        out.truncated += len - length;
        rest = length;
      } else {
        const int64_t whole = len / length;
        for (int64_t k = 0; k < whole; ++k) s.items.push_back({-1, static_cast<int32_t>(j), k * length});
        rest = len - whole * length;
      }
    }
    if (rest > 0) s.items.push_back({rest, static_cast<int32_t>(j), len > length && o.split == PackSplit::Split
                                                                        ? len - rest : 0});
    out.tokens += std::min(len, o.split == PackSplit::Truncate ? length : len);
  }
  const size_t m = s.items.size();
  // 2. Best fit, longest first. Whole rows (count -1 above) come first in the sort and open a row
  //    each, closed at once; they are given their count back here.
  // One 64-bit key per item: the room it leaves unused (length - count; a whole row of a split
  // document sorts first), then its index (window order): a plain integer sort, no indirection.
  s.order.resize(m);
  for (size_t i = 0; i < m; ++i) {
    const int64_t count = s.items[i].count < 0 ? length + 1 : s.items[i].count;
    s.order[i] = (static_cast<uint64_t>(length + 1 - count) << 32) | static_cast<uint64_t>(i);
  }
  std::sort(s.order.begin(), s.order.end());
  s.row_of.assign(m, -1);
  s.room.clear();
  s.pieces.clear();
  s.next.clear();
  RoomIndex index(s, length);
  int32_t rows = 0;
  for (size_t k = 0; k < m; ++k) {
    const size_t at = static_cast<size_t>(s.order[k] & 0xffffffffu);
    PackScratch::Item& item = s.items[at];
    if (item.count < 0) {  // a whole row of a split document
      item.count = length;
      s.row_of[at] = rows++;
      s.room.push_back(0);
      s.pieces.push_back(1);
      s.next.push_back(-1);
      continue;
    }
    int32_t row = index.pop_fitting(item.count);
    if (row < 0) {
      row = rows++;
      s.room.push_back(length);
      s.pieces.push_back(0);
      s.next.push_back(-1);
    }
    const size_t r = static_cast<size_t>(row);
    s.row_of[at] = row;
    s.room[r] -= item.count;
    ++s.pieces[r];
    if (s.room[r] > 0 && s.pieces[r] < bound) index.push(row, s.room[r]);
  }
  // Rows still waiting for pieces are still in their rooms' stacks: empty those for the next window.
  s.waiting.clear();
  for (int32_t r = 0; r < rows; ++r)
    if (s.room[static_cast<size_t>(r)] > 0 && s.pieces[static_cast<size_t>(r)] < bound) s.waiting.push_back(r);
  index.reset(s.room, s.waiting);
  out.rows = rows;
  for (const PackScratch::Item& item : s.items) out.longest = std::max(out.longest, item.count);
  if (count_only) return;

  // 3. Lay out: each row's segments in window order, rows in the order of their first segment.
  std::vector<int64_t>& start = out.row_start;
  start.assign(static_cast<size_t>(rows) + 1, 0);
  for (size_t i = 0; i < m; ++i) ++start[static_cast<size_t>(s.row_of[i]) + 1];
  for (int32_t r = 0; r < rows; ++r) start[static_cast<size_t>(r) + 1] += start[static_cast<size_t>(r)];
  // Items are in window order already (pos, then start): a stable pass keeps that within rows.
  std::vector<int32_t> by_row(m);
  {
    std::vector<int64_t> at(start.begin(), start.end() - 1);
    for (size_t i = 0; i < m; ++i) by_row[static_cast<size_t>(at[static_cast<size_t>(s.row_of[i])]++)] =
        static_cast<int32_t>(i);
  }
  // Rows by their first segment's place in the window (item index order is window order).
  s.keys.resize(static_cast<size_t>(rows));
  for (int32_t r = 0; r < rows; ++r)
    s.keys[static_cast<size_t>(r)] = {by_row[static_cast<size_t>(start[static_cast<size_t>(r)])], r};
  std::sort(s.keys.begin(), s.keys.end());
  out.segments.reserve(m);
  std::vector<int64_t> laid{0};
  laid.reserve(static_cast<size_t>(rows) + 1);
  for (const auto& key : s.keys) {
    const size_t r = static_cast<size_t>(key.second);
    for (int64_t k = start[r]; k < start[r + 1]; ++k) {
      const PackScratch::Item& item = s.items[static_cast<size_t>(by_row[static_cast<size_t>(k)])];
      const size_t j = static_cast<size_t>(item.pos);
      out.segments.push_back({docs[j], item.start, item.count, lengths[j]});
    }
    laid.push_back(static_cast<int64_t>(out.segments.size()));
  }
  start.swap(laid);
}

}  // namespace fastload
