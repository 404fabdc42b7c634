// The batch layout; see batch_layout.h.
#include "core/batch_layout.h"

#include <limits>
#include <set>
#include <stdexcept>

namespace fastload {

BatchLayout::BatchLayout(const std::vector<PartSchema>& source_schema, bool index, bool valid, int64_t rows,
                         bool source)
    : parts(source_schema), source_parts(source_schema.size()), with_index(index), with_valid(valid),
      with_source(source), max_rows(rows) {
  if (rows <= 0) throw std::invalid_argument("batch rows must be positive, got " + std::to_string(rows));
  std::set<std::string> seen;
  for (const PartSchema& p : parts) {
    if (p.name == kIndexPartName || p.name == kValidPartName)
      throw std::invalid_argument("column name '" + p.name + "' is reserved by the loader (reserved: " +
                                  kIndexPartName + ", " + kValidPartName + ")");
    if (with_source && p.name == kSourcePartName)
      throw std::invalid_argument(std::string("column name '") + kSourcePartName +
                                  "' is reserved by a mixture that adds the source of each row (with_source=True)");
    if (!seen.insert(p.name).second)
      throw std::invalid_argument("the batch would have two parts named '" + p.name +
                                  "' (a column clashes with a ragged column's <name>_lengths?)");
  }
  if (with_index) {
    index_part = static_cast<int>(parts.size());
    parts.push_back({kIndexPartName, kInt64, {}, sizeof(int64_t)});
  }
  if (with_valid) {
    valid_part = static_cast<int>(parts.size());
    parts.push_back({kValidPartName, kBoolType, {}, sizeof(bool)});
  }
  if (with_source) {
    source_part = static_cast<int>(parts.size());
    parts.push_back({kSourcePartName, kInt64, {}, sizeof(int64_t)});
  }
  // Checked: a batch of huge rows must be a clear error, not a wrapped size and a crash.
  constexpr unsigned __int128 kMax = static_cast<unsigned __int128>(std::numeric_limits<int64_t>::max());
  unsigned __int128 total = 0;
  for (const PartSchema& p : parts) {
    part_row_bytes.push_back(p.row_bytes);
    total += static_cast<unsigned __int128>(p.row_bytes) * static_cast<unsigned __int128>(rows);
  }
  if (total > kMax) {
    std::string digits;
    for (unsigned __int128 v = total; v > 0; v /= 10) digits.insert(digits.begin(), static_cast<char>('0' + v % 10));
    throw BatchTooLarge("a batch of batch_size=" + std::to_string(rows) + " takes " + digits + " bytes over " +
                        std::to_string(parts.size()) + " part(s), more than any machine's memory; lower batch_size");
  }
  total_bytes = static_cast<size_t>(total);
}

size_t BatchLayout::batch_bytes(int64_t rows) const {
  size_t row = 0;
  for (size_t b : part_row_bytes) row += b;
  return row * static_cast<size_t>(rows);
}

std::vector<std::string> BatchLayout::names() const {
  std::vector<std::string> out;
  for (const PartSchema& p : parts) out.push_back(p.name);
  return out;
}

}  // namespace fastload
