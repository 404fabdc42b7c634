// Arrow record batches and their columns; see arrow_table.h.
#include "core/arrow_table.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/arrow_rows.h"

namespace fastload {

namespace {

inline bool bit_set(const uint8_t* bits, int64_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

bool row_is_valid(const std::vector<std::pair<const uint8_t*, int64_t>>& validity, int64_t r) {
  for (const auto& [bits, bit0] : validity)
    if (!bit_set(bits, bit0 + r)) return false;
  return true;
}

// Whether anything below elements [begin, end) (physical indices) of `a` (schema `s`) is null: the
// children's elements those cover, at every depth. The elements themselves are not looked at.
bool null_below(const ArrowArray& a, const ArrowSchema& s, int64_t begin, int64_t end) {
  if (begin >= end || a.n_children != 1 || !a.children || !a.children[0] || s.n_children != 1) return false;
  const ArrowArray& child = *a.children[0];
  const ArrowSchema& cs = *s.children[0];
  if (std::strncmp(s.format, "+w:", 3) == 0) {
    const int64_t n = std::strtoll(s.format + 3, nullptr, 10);
    const int64_t b = begin * n + child.offset, e = end * n + child.offset;
    return has_nulls(child, b, e - b) || null_below(child, cs, b, e);
  }
  if (arrow_is_list(s)) {
    const ArrowListOffsets o = arrow_list_offsets(a, s, 0);
    int64_t b, e, unused;
    if (!o.offsets || !o.range(begin, &b, &unused) || !o.range(end - 1, &unused, &e) || e < b) return false;
    b += child.offset, e += child.offset;
    return has_nulls(child, b, e - b) || null_below(child, cs, b, e);
  }
  if (arrow_is_list_view(s)) {  // ranges in any order: element by element
    const ArrowListOffsets o = arrow_list_offsets(a, s, 0);
    if (!o.offsets) return false;
    for (int64_t i = begin; i < end; ++i) {
      int64_t b, e;
      if (!o.range(i, &b, &e)) continue;  // the gather reports it
      b += child.offset, e += child.offset;
      if (has_nulls(child, b, e - b) || null_below(child, cs, b, e)) return true;
    }
  }
  return false;
}

}  // namespace

int64_t first_zero_bit(const uint8_t* bitmap, int64_t offset, int64_t length) {
  int64_t i = 0;
  while (i < length && ((offset + i) & 7)) {
    if (!((bitmap[(offset + i) >> 3] >> ((offset + i) & 7)) & 1)) return i;
    ++i;
  }
  for (; i + 64 <= length; i += 64) {
    uint64_t word;
    std::memcpy(&word, bitmap + ((offset + i) >> 3), 8);
    if (word != ~uint64_t{0}) return i + __builtin_ctzll(~word);
  }
  for (; i < length; ++i)
    if (!((bitmap[(offset + i) >> 3] >> ((offset + i) & 7)) & 1)) return i;
  return -1;
}

bool has_nulls(const ArrowArray& a, int64_t offset, int64_t length) {
  if (length <= 0 || a.null_count == 0 || a.n_buffers < 1 || !a.buffers[0]) return false;
  if (a.null_count > 0 && offset == a.offset && length == a.length) return true;
  return first_zero_bit(static_cast<const uint8_t*>(a.buffers[0]), offset, length) >= 0;
}

int64_t first_nested_null(const ArrowArray& leaf, const ArrowSchema& s, int64_t first, int64_t rows,
                          const std::vector<std::pair<const uint8_t*, int64_t>>& validity) {
  if (!null_below(leaf, s, first, first + rows)) return -1;
  // Some null lies below the chunk's rows: find the first row that is not null itself and holds one.
  for (int64_t r = 0; r < rows; ++r)
    if (row_is_valid(validity, r) && null_below(leaf, s, first + r, first + r + 1)) return r;
  return -1;
}

int64_t first_null_dictionary_value(const ArrowArray& leaf, DType index_type, int64_t first, int64_t rows,
                                    const std::vector<std::pair<const uint8_t*, int64_t>>& validity) {
  const ArrowArray* dict = leaf.dictionary;
  if (!dict || !has_nulls(*dict, dict->offset, dict->length) || leaf.n_buffers < 2 || !leaf.buffers[1]) return -1;
  const auto* indices = static_cast<const std::byte*>(leaf.buffers[1]) + first * (index_type.bits / 8);
  const auto* bits = static_cast<const uint8_t*>(dict->buffers[0]);
  for (int64_t r = 0; r < rows; ++r) {
    if (!row_is_valid(validity, r)) continue;
    const int64_t v = read_arrow_index(indices, index_type, r);
    if (v >= 0 && v < dict->length && !bit_set(bits, dict->offset + v)) return r;
  }
  return -1;
}

int64_t read_arrow_index(const std::byte* p, DType t, int64_t i) {
  switch (t.bits) {
    case 8: return t.code == kInt ? int64_t{reinterpret_cast<const int8_t*>(p)[i]} : int64_t{reinterpret_cast<const uint8_t*>(p)[i]};
    case 16: return t.code == kInt ? int64_t{reinterpret_cast<const int16_t*>(p)[i]} : int64_t{reinterpret_cast<const uint16_t*>(p)[i]};
    case 32: return t.code == kInt ? int64_t{reinterpret_cast<const int32_t*>(p)[i]} : int64_t{reinterpret_cast<const uint32_t*>(p)[i]};
    default: {
      int64_t v;
      std::memcpy(&v, p + i * 8, 8);
      // uint64 past int64's range reads negative and fails the caller's bounds check.
      return v;
    }
  }
}

ArrowLeafAt leaf_at(const ArrowArray& batch, const std::vector<int>& path, const std::string& name) {
  ArrowLeafAt at;
  const ArrowArray* node = &batch;
  int64_t first = batch.offset;
  for (int i : path) {
    if (i >= node->n_children || !node->children || !node->children[i])
      throw std::invalid_argument("Arrow column '" + name + "': a chunk's array lacks the child the schema names");
    node = node->children[i];
    first += node->offset;
    if (node->null_count != 0 && node->n_buffers >= 1 && node->buffers[0])
      at.validity.emplace_back(static_cast<const uint8_t*>(node->buffers[0]), first);
  }
  at.array = node;
  // A struct's children are indexed by the parent's index plus their own offset: `first` already
  // holds the leaf's own offset.
  at.first = first;
  return at;
}

ArrowTable::ArrowTable(ArrowSchema* schema, std::vector<ArrowArray*> batches) {
  // Own everything first, so that a throw below still releases what was moved in.
  schema_ = new ArrowSchema(*schema);
  schema->release = nullptr;
  for (ArrowArray* b : batches) {
    auto* owned = new ArrowArray(*b);
    b->release = nullptr;
    if (owned->length > 0) {
      batches_.push_back(owned);
    } else {
      if (owned->release) owned->release(owned);
      delete owned;
    }
  }
  if (!schema_->format || std::strcmp(schema_->format, "+s") != 0)
    throw std::invalid_argument("an Arrow table must be a stream of record batches (a struct), got " +
                                arrow_type_name(schema_) + ": one column or array; make it a table of named columns "
                                "first (pa.table({'x': array}), a Polars series.to_frame())");
  for (ArrowArray* b : batches_) {
    if (b->n_children != schema_->n_children)
      throw std::invalid_argument("an Arrow chunk has " + std::to_string(b->n_children) + " columns, its schema " +
                                  std::to_string(schema_->n_children));
    starts_.push_back(starts_.back() + b->length);
  }
  columns_ = describe_arrow_columns(*schema_);
  for (ArrowColumnInfo& c : columns_) {
    if (!c.unsupported.empty()) continue;
    const ArrowSchema& s = column_schema(c);
    DType index_type;
    if (c.dictionary) arrow_fixed_dtype(s.format, &index_type);
    for (size_t k = 0; k < batches_.size(); ++k) {
      const int64_t rows = batches_[k]->length;
      const ArrowLeafAt at = leaf_at(*batches_[k], c.path, c.name);
      const ArrowArray* dict = at.array->dictionary;
      // A dictionary's values are shared by every row: one with a null below it is refused
      // whether a row of this chunk points at it or not.
      const int64_t nested = c.dictionary ? (dict ? first_nested_null(*dict, *s.dictionary, dict->offset,
                                                                      dict->length, {}) : -1)
                                          : first_nested_null(*at.array, s, at.first, rows, at.validity);
      if (nested >= 0) {
        c.unsupported = "it holds nulls inside its values (list items or fixed-size list elements; the first in row " +
                        std::to_string(c.dictionary ? nested : starts_[k] + nested) + (c.dictionary ? " of its dictionary" : "") +
                        "), which fill_null does not cover";
        break;
      }
      if (c.first_null >= 0) continue;
      int64_t first = -1;
      for (const auto& [bits, bit0] : at.validity) {
        const int64_t z = first_zero_bit(bits, bit0, rows);
        if (z >= 0 && (first < 0 || z < first)) first = z;
      }
      if (c.dictionary) {  // a row pointing at a null value of its dictionary is null too
        const int64_t z = first_null_dictionary_value(*at.array, index_type, at.first, first < 0 ? rows : first,
                                                      at.validity);
        if (z >= 0) first = z;
      }
      if (first >= 0) c.first_null = starts_[k] + first;
    }
  }
}

ArrowTable::~ArrowTable() {
  for (ArrowArray* b : batches_) {
    if (b->release) b->release(b);
    delete b;
  }
  if (schema_) {
    if (schema_->release) schema_->release(schema_);
    delete schema_;
  }
}

size_t ArrowTable::column_index(const std::string& name) const {
  for (size_t i = 0; i < columns_.size(); ++i)
    if (columns_[i].name == name) return i;
  throw std::invalid_argument("the Arrow table has no column '" + name + "'");
}

const ArrowColumnInfo& ArrowTable::column(const std::string& name) const { return columns_[column_index(name)]; }

const ArrowSchema& ArrowTable::column_schema(const ArrowColumnInfo& c) const {
  const ArrowSchema* s = schema_;
  for (int i : c.path) s = s->children[i];
  return *s;
}

int64_t ArrowTable::longest(size_t column) const {
  const ArrowColumnInfo& c = columns_.at(column);
  if (c.kind != ArrowKind::kList && c.kind != ArrowKind::kBytes) return 0;
  const ArrowSchema* s = &column_schema(c);
  if (c.dictionary) s = s->dictionary;
  int64_t longest = 0;
  for (const ArrowArray* b : batches_) {
    const ArrowLeafAt at = leaf_at(*b, c.path, c.name);
    const ArrowArray* a = at.array;
    int64_t first = at.first, rows = b->length;
    if (c.dictionary) {
      if (!a->dictionary) continue;
      a = a->dictionary, first = a->offset, rows = a->length;
    }
    // Rows whose offsets are corrupt are skipped here: the gather reports them, naming the row.
    if (c.kind == ArrowKind::kList) {
      const ArrowListOffsets o = arrow_list_offsets(*a, *s, first);
      if (!o.offsets) continue;
      for (int64_t r = 0; r < rows; ++r) {
        int64_t begin, end;
        if (o.range(r, &begin, &end)) longest = std::max(longest, end - begin);
      }
    } else {
      const ArrowStrings strings = arrow_strings(*a, *s, first);
      if (!strings.valid()) continue;
      for (int64_t r = 0; r < rows; ++r) {
        const char* p;
        int64_t n;
        if (strings.get(r, &p, &n)) longest = std::max(longest, n);
      }
    }
  }
  return longest;
}

}  // namespace fastload

namespace fastload {

std::vector<const std::byte*> arrow_indices_data(const ArrowTable& indices, DType* dtype) {
  const auto& cols = indices.columns();
  if (cols.size() != 1 || cols[0].kind != ArrowKind::kFixed || cols[0].dictionary || cols[0].dtype.code == kFloat ||
      cols[0].elements != 1 || !cols[0].unsupported.empty() || cols[0].first_null >= 0)
    throw std::invalid_argument("an indices mapping must be one integer column without nulls");
  *dtype = cols[0].dtype;
  std::vector<const std::byte*> data;
  for (size_t c = 0; c < indices.num_chunks(); ++c) {
    const ArrowLeafAt at = leaf_at(indices.chunk(c), cols[0].path, cols[0].name);
    if (at.array->n_buffers < 2) throw std::invalid_argument("an indices mapping's chunk has no data");
    data.push_back(static_cast<const std::byte*>(at.array->buffers[1]) + at.first * (dtype->bits / 8));
  }
  return data;
}

}  // namespace fastload
