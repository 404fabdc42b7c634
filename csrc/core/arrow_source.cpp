// Arrow columns gathered into batches; see arrow_source.h. Each id is resolved once per block to
// its chunk and row (all columns share the chunking); then each column copies its rows: a plain
// fixed-width column through the array gather's copy loop, the rest row by row (validity, then
// the dictionary, then the value: a fixed row, unpacked bits, or a list's items padded).
#include "core/arrow_source.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/gather.h"

namespace fastload {

std::string arrow_valid_name(const std::string& column) { return column + "_valid"; }

namespace {

int64_t format_bytes(const ArrowSchema& s, const DType& t) {
  if (s.format && s.format[0] == 'w' && s.format[1] == ':') return std::strtoll(s.format + 2, nullptr, 10);
  return t.bits / 8;
}

}  // namespace

// The number of chunk ends at or before `id` (a branch-free binary search).
size_t arrow_chunk_of(const std::vector<int64_t>& starts, int64_t id) {
  const int64_t* ends = starts.data() + 1;
  const int64_t* base = ends;
  size_t n = starts.size() - 1;
  while (n > 1) {
    const size_t half = n / 2;
    base = base[half] <= id ? base + half : base;
    n -= half;
  }
  return static_cast<size_t>(base - ends) + (*base <= id ? 1 : 0);
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

namespace {

inline bool bit(const std::byte* bits, int64_t i) {
  return (static_cast<uint8_t>(bits[i >> 3]) >> (i & 7)) & 1;
}

void fill_pattern(std::byte* p, int64_t bytes, const std::vector<std::byte>& pattern) {
  if (bytes <= 0) return;
  const int64_t n = static_cast<int64_t>(pattern.size());
  if (std::all_of(pattern.begin(), pattern.end(), [&](std::byte b) { return b == pattern[0]; })) {
    std::memset(p, static_cast<int>(pattern[0]), static_cast<size_t>(bytes));
    return;
  }
  for (int64_t k = 0; k < bytes; k += n) std::memcpy(p + k, pattern.data(), static_cast<size_t>(std::min(n, bytes - k)));
}

[[noreturn]] void bad_chunk(const std::string& name, const std::string& what) {
  throw std::invalid_argument("Arrow column '" + name + "': " + what);
}

const ArrowSchema* primitive_of(const ArrowSchema* s) {
  while (s->format && std::strncmp(s->format, "+w:", 3) == 0) s = s->children[0];
  return s;
}

// Where the values of array `a` (of schema `s`) at value row v are: walks fixed-size lists down
// to the primitive values. Element index = add + v * mult at the primitive.
struct ValuesAt {
  const std::byte* data = nullptr;  // the primitive buffer (bits for bool)
  int64_t add = 0, mult = 1;
};
ValuesAt values_at(const ArrowArray* a, const ArrowSchema* s, int64_t first, const std::string& name) {
  ValuesAt v;
  v.add = first;
  while (s->format && std::strncmp(s->format, "+w:", 3) == 0) {
    const int64_t n = std::strtoll(s->format + 3, nullptr, 10);
    if (a->n_children != 1 || !a->children[0]) bad_chunk(name, "a fixed-size list without its values");
    a = a->children[0];
    s = s->children[0];
    v.add = v.add * n + a->offset;
    v.mult *= n;
  }
  if (a->n_buffers < 2) bad_chunk(name, "an array without its data buffer");
  v.data = static_cast<const std::byte*>(a->buffers[1]);
  return v;
}

ArrowChunkView view_of(const ArrowArray& batch, const ArrowColumnInfo& info, const ArrowSchema& schema,
                      const ArrowColumnPlan& col) {
  ArrowChunkView view;
  ArrowLeafAt at = leaf_at(batch, info.path, info.name);
  view.validity = std::move(at.validity);
  const ArrowArray* a = at.array;
  const ArrowSchema* s = &schema;
  int64_t first = at.first;
  if (info.dictionary) {
    if (a->n_buffers < 2 || !a->dictionary) bad_chunk(info.name, "a dictionary array without its indices or values");
    view.indices = static_cast<const std::byte*>(a->buffers[1]) + first * (col.index_type.bits / 8);
    a = a->dictionary;
    s = s->dictionary;
    view.dict_rows = a->length;
    first = a->offset;
  }
  switch (info.kind) {
    case ArrowKind::kFixed:
    case ArrowKind::kBool: {
      const ValuesAt v = values_at(a, s, first, info.name);
      if (info.kind == ArrowKind::kBool) {
        view.data = v.data, view.bit0 = v.add;
      } else {
        view.data = v.data + v.add * format_bytes(*primitive_of(s), info.dtype);
      }
      break;
    }
    case ArrowKind::kList: {
      if (a->n_buffers < 2 || a->n_children != 1 || !a->children[0]) bad_chunk(info.name, "a list without its offsets or items");
      view.offsets = static_cast<const std::byte*>(a->buffers[1]) + first * (col.wide_offsets ? 8 : 4);
      const ArrowArray* items = a->children[0];
      const ValuesAt v = values_at(items, s->children[0], items->offset, info.name);
      view.data = v.data + v.add * format_bytes(*primitive_of(s->children[0]), info.dtype);
      view.items = items->length;
      break;
    }
    case ArrowKind::kBytes: {
      if (a->n_buffers < 3) bad_chunk(info.name, "a string array without its offsets or data");
      view.offsets = static_cast<const std::byte*>(a->buffers[1]) + first * (col.wide_offsets ? 8 : 4);
      view.data = static_cast<const std::byte*>(a->buffers[2]);
      break;
    }
  }
  return view;
}

inline bool row_valid(const ArrowChunkView& v, int64_t r) {
  for (const auto& [bits, bit0] : v.validity)
    if (!bit(reinterpret_cast<const std::byte*>(bits), bit0 + r)) return false;
  return true;
}

// One list/string row's items: [first, end) of its values.
inline void list_range(const ArrowColumnPlan& col, const ArrowChunkView& v, int64_t row, int64_t* first,
                       int64_t* end) {
  if (col.wide_offsets) {
    const int64_t* o = static_cast<const int64_t*>(v.offsets);
    *first = o[row], *end = o[row + 1];
  } else {
    const int32_t* o = static_cast<const int32_t*>(v.offsets);
    *first = o[row], *end = o[row + 1];
  }
  if (*first < 0 || *end < *first || (v.items >= 0 && *end > v.items))
    bad_chunk(col.info.name, "row " + std::to_string(row) + " has offsets [" + std::to_string(*first) + ", " +
                                 std::to_string(*end) + ") outside its values (a corrupt array?)");
}

bool wide_offsets(const ArrowSchema& s) {
  return std::strcmp(s.format, "+L") == 0 || std::strcmp(s.format, "U") == 0 || std::strcmp(s.format, "Z") == 0;
}

DType index_type_of(const ArrowSchema& s) {
  static const std::pair<const char*, DType> types[] = {{"c", {kInt, 8}},   {"C", {kUInt, 8}}, {"s", {kInt, 16}},
                                                       {"S", {kUInt, 16}}, {"i", {kInt, 32}}, {"I", {kUInt, 32}},
                                                       {"l", {kInt, 64}},  {"L", {kUInt, 64}}};
  for (const auto& [code, type] : types)
    if (std::strcmp(s.format, code) == 0) return type;
  return {kInt, 64};
}

}  // namespace

void gather_arrow_column(const ArrowColumnPlan& col, const ArrowChunkView* const* views, const int64_t* row,
                         int64_t n, bool plain, std::byte* dst, int64_t* lengths, bool* valid) {
  const ArrowColumnInfo& info = col.info;
  const int64_t rb = col.row_bytes;
  if (plain && info.kind == ArrowKind::kFixed) {
    const std::byte* rows[kArrowBlock];
    for (int64_t i = 0; i < n; ++i) rows[i] = views[i]->data + row[i] * rb;
    gather_addresses(rows, rb, n, dst);
    if (valid) std::fill(valid, valid + n, true);
    return;
  }
  const bool is_list = col.is_list();
  const int64_t cap = is_list ? col.request.max_items : 0;
  // Pass 1: validity, dictionary and (lists) offsets, prefetching the values; pass 2: copy.
  const std::byte* src[kArrowBlock];
  int64_t items[kArrowBlock];
  int64_t value_row[kArrowBlock];
  bool ok[kArrowBlock];
  for (int64_t i = 0; i < n; ++i) {
    const ArrowChunkView& v = *views[i];
    ok[i] = v.validity.empty() || row_valid(v, row[i]);
    if (!ok[i]) continue;
    int64_t r = row[i];
    if (v.indices) {
      r = read_arrow_index(v.indices, col.index_type, r);
      if (r < 0 || r >= v.dict_rows)
        bad_chunk(info.name, "dictionary index " + std::to_string(r) + " outside its " + std::to_string(v.dict_rows) +
                                 " values (a corrupt array?)");
    }
    value_row[i] = r;
    if (is_list) {
      int64_t first, end;
      list_range(col, v, r, &first, &end);
      items[i] = std::min(end - first, cap);
      src[i] = v.data + first * col.item_bytes;
      __builtin_prefetch(src[i], 0, 0);
    } else if (info.kind == ArrowKind::kFixed) {
      src[i] = v.data + r * rb;
      __builtin_prefetch(src[i], 0, 0);
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    std::byte* out = dst + i * rb;
    if (valid) valid[i] = ok[i];
    if (!ok[i]) {
      if (is_list) {
        fill_pattern(out, rb, col.request.pad);
        lengths[i] = 0;
      } else {
        std::memcpy(out, col.request.fill_value.data(), static_cast<size_t>(rb));
      }
      continue;
    }
    const ArrowChunkView& v = *views[i];
    switch (info.kind) {
      case ArrowKind::kFixed: std::memcpy(out, src[i], static_cast<size_t>(rb)); break;
      case ArrowKind::kBool: {
        const int64_t e = info.elements, b0 = v.bit0 + value_row[i] * e;
        for (int64_t j = 0; j < e; ++j) out[j] = static_cast<std::byte>(bit(v.data, b0 + j));
        break;
      }
      case ArrowKind::kList:
      case ArrowKind::kBytes: {
        const int64_t bytes = items[i] * col.item_bytes;
        if (bytes) std::memcpy(out, src[i], static_cast<size_t>(bytes));
        fill_pattern(out + bytes, rb - bytes, col.request.pad);
        lengths[i] = items[i];
        break;
      }
    }
  }
}

std::shared_ptr<ArrowStringLists> arrow_string_lists(const std::vector<const ArrowColumnPlan*>& plans, int64_t rows) {
  auto lists = std::make_shared<ArrowStringLists>();
  for (const ArrowColumnPlan* p : plans) {
    lists->names.push_back(p->info.name);
    lists->utf8.push_back(p->utf8);
    lists->bytes.emplace_back();
    lists->offsets.emplace_back(1, 0);
    lists->offsets.back().reserve(static_cast<size_t>(rows) + 1);
    lists->valid.emplace_back();
    lists->valid.back().reserve(static_cast<size_t>(rows));
  }
  return lists;
}

void append_arrow_string_lists(ArrowStringLists& into, const ArrowStringLists& from) {
  if (into.names.empty()) {
    into.names = from.names;
    into.utf8 = from.utf8;
    into.bytes.assign(from.names.size(), {});
    into.offsets.assign(from.names.size(), std::vector<int64_t>(1, 0));
    into.valid.assign(from.names.size(), {});
  }
  if (into.names != from.names || into.utf8 != from.utf8)
    throw std::invalid_argument("the sources of a mixture give different string columns as lists");
  for (size_t k = 0; k < from.names.size(); ++k) {
    const int64_t shift = static_cast<int64_t>(into.bytes[k].size());
    into.bytes[k].insert(into.bytes[k].end(), from.bytes[k].begin(), from.bytes[k].end());
    for (size_t i = 1; i < from.offsets[k].size(); ++i) into.offsets[k].push_back(shift + from.offsets[k][i]);
    into.valid[k].insert(into.valid[k].end(), from.valid[k].begin(), from.valid[k].end());
  }
}

void collect_arrow_strings(const ArrowColumnPlan& col, const ArrowChunkView* const* views, const int64_t* row,
                           int64_t n, ArrowStringLists& lists, size_t k) {
  std::vector<char>& bytes = lists.bytes[k];
  std::vector<int64_t>& offsets = lists.offsets[k];
  std::vector<uint8_t>& valid = lists.valid[k];
  for (int64_t i = 0; i < n; ++i) {
    const ArrowChunkView& v = *views[i];
    const bool ok = v.validity.empty() || row_valid(v, row[i]);
    valid.push_back(ok ? 1 : 0);
    if (ok) {
      int64_t r = row[i];
      if (v.indices) {
        r = read_arrow_index(v.indices, col.index_type, r);
        if (r < 0 || r >= v.dict_rows)
          bad_chunk(col.info.name, "dictionary index " + std::to_string(r) + " outside its " +
                                       std::to_string(v.dict_rows) + " values (a corrupt array?)");
      }
      int64_t first, end;
      list_range(col, v, r, &first, &end);
      const char* src = reinterpret_cast<const char*>(v.data) + first;
      bytes.insert(bytes.end(), src, src + (end - first));
    }
    offsets.push_back(static_cast<int64_t>(bytes.size()));
  }
}

ArrowColumnPlan plan_arrow_column(const ArrowTable& table, ArrowColumnRequest req, bool check_nulls) {
  ArrowColumnPlan col;
  col.info = table.column(req.name);
  const ArrowColumnInfo& info = col.info;
  if (!info.unsupported.empty())
    throw std::invalid_argument("Arrow column '" + info.name + "' of type " + info.type + ": " + info.unsupported);
  if (check_nulls && info.first_null >= 0 && !req.fill)
    throw std::invalid_argument("Arrow column '" + info.name + "' holds nulls (the first at row " +
                                std::to_string(info.first_null) + "): pass fill_null={'" + info.name +
                                "': value} or drop it with columns=");
  const ArrowSchema& s = table.column_schema(info);
  const ArrowSchema& values = info.dictionary ? *s.dictionary : s;
  if (info.dictionary) col.index_type = index_type_of(s);
  const int64_t element_bytes = info.kind == ArrowKind::kBool ? 1 : info.dtype.bits / 8;
  col.utf8 = std::strcmp(values.format, "u") == 0 || std::strcmp(values.format, "U") == 0;
  if (req.as_list) {
    if (info.kind != ArrowKind::kBytes)
      throw std::invalid_argument("Arrow column '" + info.name + "' of type " + info.type + " is not a string column");
    col.wide_offsets = wide_offsets(values);
    col.item_bytes = 1;
    req.with_valid = false;
  } else if (col.is_list() || info.kind == ArrowKind::kList || info.kind == ArrowKind::kBytes) {
    col.wide_offsets = wide_offsets(values);
    col.item_bytes = info.elements * element_bytes;
    if (req.max_items < 0) throw std::invalid_argument("Arrow column '" + info.name + "': negative max_length");
    if (req.pad.empty() || col.item_bytes % static_cast<int64_t>(req.pad.size()) != 0)
      throw std::invalid_argument("Arrow column '" + info.name + "': a pad value of " + std::to_string(req.pad.size()) +
                                  " bytes does not divide an item of " + std::to_string(col.item_bytes));
    col.row_bytes = req.max_items * col.item_bytes;
  } else {
    col.row_bytes = info.elements * element_bytes;
    if (req.fill && static_cast<int64_t>(req.fill_value.size()) != col.row_bytes)
      throw std::invalid_argument("Arrow column '" + info.name + "': a fill value of " +
                                  std::to_string(req.fill_value.size()) + " bytes for rows of " +
                                  std::to_string(col.row_bytes));
  }
  if (!req.fill) req.with_valid = false;
  col.request = std::move(req);
  return col;
}

void add_arrow_parts(const ArrowColumnPlan& col, std::vector<PartSchema>& parts) {
  if (col.request.as_list) return;  // carried in the batch's extras
  std::vector<int64_t> shape = col.info.item_shape;
  if (col.is_list()) shape.insert(shape.begin(), col.request.max_items);
  parts.push_back({col.info.name, col.info.dtype, shape, static_cast<size_t>(col.row_bytes)});
  if (col.is_list()) parts.push_back({col.info.name + "_lengths", kInt64, {}, sizeof(int64_t)});
  if (col.request.with_valid) parts.push_back({arrow_valid_name(col.info.name), kBoolType, {}, 1});
}

ArrowChunkView arrow_chunk_view(const ArrowTable& table, size_t chunk, const ArrowColumnPlan& plan) {
  const ArrowColumnInfo& here = table.column(plan.info.name);
  if (here.kind != plan.info.kind || here.dtype != plan.info.dtype || here.item_shape != plan.info.item_shape ||
      here.dictionary != plan.info.dictionary || !here.unsupported.empty())
    throw std::invalid_argument("Arrow column '" + plan.info.name + "' is " + here.type + " here, " + plan.info.type +
                                " where the source was opened");
  const ArrowSchema& s = table.column_schema(here);
  if ((plan.is_list() || plan.request.as_list) && wide_offsets(here.dictionary ? *s.dictionary : s) != plan.wide_offsets)
    throw std::invalid_argument("Arrow column '" + plan.info.name + "' is " + here.type + " here, " + plan.info.type +
                                " where the source was opened");
  if (here.dictionary && index_type_of(s) != plan.index_type)
    throw std::invalid_argument("Arrow column '" + plan.info.name + "': its dictionary indices changed type");
  return view_of(table.chunk(chunk), here, s, plan);
}

ArrowSource::ArrowSource(std::shared_ptr<const ArrowTable> table, std::vector<ArrowColumnRequest> requests,
                         std::shared_ptr<const ArrowTable> indices)
    : table_(std::move(table)), indices_(std::move(indices)) {
  size_ = table_->rows();
  for (ArrowColumnRequest& req : requests) {
    Column col;
    col.plan = plan_arrow_column(*table_, std::move(req));
    for (size_t c = 0; c < table_->num_chunks(); ++c) {
      col.chunks.push_back(arrow_chunk_view(*table_, c, col.plan));
    }
    add_arrow_parts(col.plan, schema_);
    columns_.push_back(std::move(col));
  }
  for (const Column& col : columns_) {
    plans_.push_back(&col.plan);
    if (col.plan.request.as_list) string_plans_.push_back(&col.plan);
  }
  if (indices_) {
    const auto& cols = indices_->columns();
    if (cols.size() != 1 || cols[0].kind != ArrowKind::kFixed || cols[0].dictionary || cols[0].dtype.code == kFloat ||
        cols[0].elements != 1 || !cols[0].unsupported.empty() || cols[0].first_null >= 0)
      throw std::invalid_argument("an indices mapping must be one integer column without nulls");
    index_dtype_ = cols[0].dtype;
    for (size_t c = 0; c < indices_->num_chunks(); ++c) {
      const ArrowLeafAt at = leaf_at(indices_->chunk(c), cols[0].path, cols[0].name);
      if (at.array->n_buffers < 2) throw std::invalid_argument("an indices mapping's chunk has no data");
      index_data_.push_back(static_cast<const std::byte*>(at.array->buffers[1]) + at.first * (index_dtype_.bits / 8));
    }
    size_ = indices_->rows();
  }
}

std::shared_ptr<ArrowStringLists> attach_arrow_string_lists(const std::vector<const ArrowColumnPlan*>& plans,
                                                            const FillRequest& r) {
  if (plans.empty()) return nullptr;
  auto lists = arrow_string_lists(plans, r.count);
  if (r.extras) *r.extras = lists;
  return lists;
}

void ArrowSource::fill(const FillRequest& r) {
  size_t chunk[kArrowBlock];
  int64_t row[kArrowBlock];
  const std::vector<int64_t>& starts = table_->starts();
  const std::shared_ptr<ArrowStringLists> lists = attach_arrow_string_lists(string_plans_, r);
  auto view_of = [&](size_t c, int64_t i) { return &columns_[c].chunks[chunk[i]]; };
  for (int64_t b = 0; b < r.count; b += kArrowBlock) {
    const int64_t n = std::min(kArrowBlock, r.count - b);
    for (int64_t i = 0; i < n; ++i) {
      int64_t id = r.ids[b + i];
      if (indices_) {
        const std::vector<int64_t>& is = indices_->starts();
        const size_t c = arrow_chunk_of(is, id);
        const int64_t mapped = read_arrow_index(index_data_[c], index_dtype_, id - is[c]);
        if (mapped < 0 || mapped >= table_->rows())
          throw std::invalid_argument("the indices mapping sends sample " + std::to_string(id) + " to row " +
                                      std::to_string(mapped) + " of a table of " + std::to_string(table_->rows()));
        id = mapped;
      }
      chunk[i] = arrow_chunk_of(starts, id);
      row[i] = id - starts[chunk[i]];
    }
    gather_arrow_block(plans_, r, b, n, row, view_of, lists.get());
  }
}

}  // namespace fastload
