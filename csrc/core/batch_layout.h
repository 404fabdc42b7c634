// The one owner of a batch's layout: which parts it has (the source's parts, then the loader's
// "index" and "valid"), their names, types, shapes and sizes. The pipeline, the transfer engine,
// the bindings and (through fastload._C.BatchLayout) the Python side all read it from here.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/batch_source.h"

namespace fastload {

// A batch whose bytes cannot be counted in int64: more than any machine's memory.
class BatchTooLarge : public std::length_error {
 public:
  using std::length_error::length_error;
};

// Names the loader adds; a source part may not use them.
inline const char* const kIndexPartName = "index";
inline const char* const kValidPartName = "valid";
// A mixture's part: the index of the source of each row (reserved where a loader adds it).
inline const char* const kSourcePartName = "source";

// Each part is its own buffer, so that a user who keeps one column keeps only that column's memory.
struct BatchLayout {
  std::vector<PartSchema> parts;  // the source's parts in its order, then index, valid, source
  size_t source_parts = 0;
  bool with_index = false;
  bool with_valid = false;
  bool with_source = false;
  int64_t max_rows = 0;
  std::vector<size_t> part_row_bytes;  // bytes per row of each part
  int index_part = -1, valid_part = -1, source_part = -1;
  size_t total_bytes = 0;  // all parts of a full batch

  // Throws std::invalid_argument on a reserved or repeated part name, BatchTooLarge if the batch's
  // bytes would overflow.
  BatchLayout(const std::vector<PartSchema>& source_schema, bool with_index, bool with_valid, int64_t max_rows,
              bool with_source = false);
  size_t num_parts() const { return parts.size(); }
  size_t part_bytes(size_t part) const { return part_row_bytes[part] * static_cast<size_t>(max_rows); }
  // Bytes of a batch of `rows` rows over every part (what a batch handed out occupies).
  size_t batch_bytes(int64_t rows) const;
  std::vector<std::string> names() const;
};

}  // namespace fastload
