// Arrow columns gathered into batches; see arrow_gather.h. Each column copies its rows of a block:
// a plain fixed-width column through the array gather's copy loop, the rest row by row (validity,
// then the dictionary, then the value: a fixed row, unpacked bits, a list's items padded once its
// inner levels are checked against their declared sizes, or a string's bytes).
#include "core/arrow_gather.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "core/gather.h"

namespace fastload {

std::string arrow_valid_name(const std::string& column) { return column + "_valid"; }

namespace {

inline bool bit(const void* bits, int64_t i) { return (static_cast<const uint8_t*>(bits)[i >> 3] >> (i & 7)) & 1; }

[[noreturn]] void bad_column(const std::string& name, const std::string& what) {
  throw std::invalid_argument("Arrow column '" + name + "': " + what);
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + (shape[i] < 0 ? std::string("None") : std::to_string(shape[i]));
  return s + (shape.size() == 1 ? ",)" : ")");
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

const ArrowSchema* primitive_of(const ArrowSchema* s) {
  while (s->format && std::strncmp(s->format, "+w:", 3) == 0) s = s->children[0];
  return s;
}

int64_t format_bytes(const ArrowSchema& s, const DType& t) {
  if (s.format && s.format[0] == 'w' && s.format[1] == ':') return std::strtoll(s.format + 2, nullptr, 10);
  return t.bits / 8;
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
    if (a->n_children != 1 || !a->children[0]) bad_column(name, "a fixed-size list without its values");
    a = a->children[0];
    s = s->children[0];
    v.add = v.add * n + a->offset;
    v.mult *= n;
  }
  if (a->n_buffers < 2) bad_column(name, "an array without its data buffer");
  v.data = static_cast<const std::byte*>(a->buffers[1]);
  return v;
}

ArrowChunkView view_of(const ArrowArray& batch, const ArrowColumnInfo& info, const ArrowSchema& schema,
                      const ArrowColumnPlan& col, int64_t row0) {
  ArrowChunkView view;
  view.row0 = row0;
  ArrowLeafAt at = leaf_at(batch, info.path, info.name);
  view.validity = std::move(at.validity);
  const ArrowArray* a = at.array;
  const ArrowSchema* s = &schema;
  int64_t first = at.first;
  if (info.dictionary) {
    if (a->n_buffers < 2 || !a->dictionary) bad_column(info.name, "a dictionary array without its indices or values");
    view.indices = static_cast<const std::byte*>(a->buffers[1]) + first * (col.index_type.bits / 8);
    a = a->dictionary;
    s = s->dictionary;
    view.dict_rows = a->length;
    first = a->offset;
    if (has_nulls(*a, a->offset, a->length))
      view.dict_valid = static_cast<const uint8_t*>(a->buffers[0]), view.dict_bit0 = a->offset;
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
      view.list = arrow_list_offsets(*a, *s, first);
      if (!view.list.offsets) bad_column(info.name, "a list without its offsets or items");
      const ArrowArray* items = a->children[0];
      const ArrowSchema* item_schema = s->children[0];
      for (int level = 0; level < info.inner_lists; ++level) {
        view.inner.push_back(arrow_list_offsets(*items, *item_schema, items->offset));
        if (!view.inner.back().offsets) bad_column(info.name, "an inner list without its offsets or items");
        items = items->children[0];
        item_schema = item_schema->children[0];
      }
      view.leaf_items = items->length;
      const ValuesAt v = values_at(items, item_schema, items->offset, info.name);
      if (info.dtype == kBoolType) {
        view.data = v.data, view.bit0 = v.add;
      } else {
        view.data = v.data + v.add * format_bytes(*primitive_of(item_schema), info.dtype);
      }
      break;
    }
    case ArrowKind::kBytes: {
      view.strings = arrow_strings(*a, *s, first);
      if (!view.strings.valid()) bad_column(info.name, "a string array without its offsets, views or data");
      break;
    }
  }
  return view;
}

inline bool row_valid(const ArrowChunkView& v, int64_t r) {
  for (const auto& [bits, bit0] : v.validity)
    if (!bit(bits, bit0 + r)) return false;
  return true;
}

// Row `r` of a chunk (`value_row` after its dictionary): whether it is not null.
inline bool value_valid(const ArrowColumnPlan& col, const ArrowChunkView& v, int64_t r, int64_t* value_row) {
  if (!v.validity.empty() && !row_valid(v, r)) return false;
  if (v.indices) {
    const int64_t d = read_arrow_index(v.indices, col.index_type, r);
    if (d < 0 || d >= v.dict_rows)
      bad_column(col.info.name, "row " + std::to_string(v.row0 + r) + " has dictionary index " + std::to_string(d) +
                                    " outside its " + std::to_string(v.dict_rows) + " values (a corrupt array?)");
    if (v.dict_valid && !bit(v.dict_valid, v.dict_bit0 + d)) return false;
    r = d;
  }
  *value_row = r;
  return true;
}

[[noreturn]] void bad_offsets(const ArrowColumnPlan& col, int64_t row, int64_t first, int64_t end) {
  bad_column(col.info.name, "row " + std::to_string(row) + " has offsets [" + std::to_string(first) + ", " +
                                std::to_string(end) + ") outside its values (a corrupt array?)");
}

// A list row (chunk row `r`, its number in the data `row`): its items at the row's level, and in
// *leaf the first of its values below the last list level. Inner levels must have their declared
// sizes (the row is refused, naming it, otherwise); their values are then contiguous.
int64_t list_row(const ArrowColumnPlan& col, const ArrowChunkView& v, int64_t r, int64_t row, int64_t* leaf) {
  int64_t first, end;
  if (!v.list.range(r, &first, &end)) bad_offsets(col, row, first, end);
  const int64_t items = end - first;
  const std::vector<int64_t>& declared = col.request.list_shape;
  if (col.exact && items != declared[0])
    bad_column(col.info.name, "row " + std::to_string(row) + " does not have the declared shape " +
                                  shape_text(declared) + ": its dimension 0 is " + std::to_string(items));
  for (size_t level = 0; level < v.inner.size(); ++level) {
    const ArrowListOffsets& o = v.inner[level];
    const int64_t want = declared[level + 1];
    int64_t next_first = 0, next_end = 0;
    for (int64_t i = first; i < end; ++i) {
      int64_t a, b;
      if (!o.range(i, &a, &b)) bad_offsets(col, row, a, b);
      if (b - a != want)
        bad_column(col.info.name, "row " + std::to_string(row) + " does not have the declared shape " +
                                      shape_text(declared) + ": its dimension " + std::to_string(level + 1) +
                                      " is " + std::to_string(b - a) + " in an item");
      if (i == first) next_first = a;
      next_end = b;
    }
    first = next_first, end = next_end;
  }
  *leaf = first;
  return items;
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
  const bool bits = info.dtype == kBoolType;
  const int64_t cap = is_list ? col.request.max_items : 0;
  // Pass 1: validity, dictionary, offsets and declared sizes, prefetching the values; pass 2: copy.
  const std::byte* src[kArrowBlock];
  int64_t items[kArrowBlock];
  int64_t at[kArrowBlock];  // bool: the first bit of the row's values
  bool ok[kArrowBlock];
  for (int64_t i = 0; i < n; ++i) {
    const ArrowChunkView& v = *views[i];
    int64_t r = 0;
    ok[i] = value_valid(col, v, row[i], &r);
    if (!ok[i]) continue;
    if (info.kind == ArrowKind::kList) {
      int64_t leaf = 0;
      items[i] = std::min(list_row(col, v, row[i], v.row0 + row[i], &leaf), cap);
      at[i] = v.bit0 + leaf * info.elements;
      src[i] = bits ? nullptr : v.data + leaf * col.leaf_bytes;
    } else if (info.kind == ArrowKind::kBytes) {
      const char* p = nullptr;
      int64_t length = 0;
      if (!v.strings.get(r, &p, &length))
        bad_column(info.name, "row " + std::to_string(v.row0 + row[i]) + " has bytes outside its data (a corrupt array?)");
      items[i] = std::min(length, cap);
      src[i] = reinterpret_cast<const std::byte*>(p);
    } else if (info.kind == ArrowKind::kFixed) {
      src[i] = v.data + r * rb;
    } else {
      at[i] = v.bit0 + r * info.elements;
      src[i] = nullptr;
    }
    if (src[i]) __builtin_prefetch(src[i], 0, 0);
  }
  for (int64_t i = 0; i < n; ++i) {
    std::byte* out = dst + i * rb;
    if (valid) valid[i] = ok[i];
    if (!ok[i]) {
      if (is_list) {  // the fill row's items (whole items, cut to the slot), then padding
        const int64_t bytes = std::min<int64_t>(static_cast<int64_t>(col.request.fill_value.size()), rb);
        if (bytes) std::memcpy(out, col.request.fill_value.data(), static_cast<size_t>(bytes));
        fill_pattern(out + bytes, rb - bytes, col.request.pad);
        if (lengths) lengths[i] = bytes / col.item_bytes;
      } else {
        std::memcpy(out, col.request.fill_value.data(), static_cast<size_t>(rb));
      }
      continue;
    }
    switch (info.kind) {
      case ArrowKind::kFixed: std::memcpy(out, src[i], static_cast<size_t>(rb)); break;
      case ArrowKind::kBool:
        for (int64_t j = 0; j < info.elements; ++j) out[j] = static_cast<std::byte>(bit(views[i]->data, at[i] + j));
        break;
      case ArrowKind::kList:
      case ArrowKind::kBytes: {
        const int64_t bytes = items[i] * col.item_bytes;
        if (bits) {
          for (int64_t j = 0; j < bytes; ++j) out[j] = static_cast<std::byte>(bit(views[i]->data, at[i] + j));
        } else if (bytes) {
          std::memcpy(out, src[i], static_cast<size_t>(bytes));
        }
        fill_pattern(out + bytes, rb - bytes, col.request.pad);
        if (lengths) lengths[i] = items[i];
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

std::shared_ptr<ArrowStringLists> attach_arrow_string_lists(const std::vector<const ArrowColumnPlan*>& plans,
                                                            const FillRequest& r) {
  if (plans.empty()) return nullptr;
  auto lists = arrow_string_lists(plans, r.count);
  if (r.extras) *r.extras = lists;
  return lists;
}

void append_arrow_string_lists(ArrowStringLists& into, const ArrowStringLists& from) {
  if (into.names.empty()) {
    into.names = from.names;
    into.utf8 = from.utf8;
    into.json = from.json;
    into.bytes.assign(from.names.size(), {});
    into.offsets.assign(from.names.size(), std::vector<int64_t>(1, 0));
    into.valid.assign(from.names.size(), {});
  }
  if (into.names != from.names || into.utf8 != from.utf8 || into.json != from.json)
    throw std::invalid_argument("the sources of a mixture give different string columns as lists");
  for (size_t k = 0; k < from.names.size(); ++k) {
    const int64_t shift = static_cast<int64_t>(into.bytes[k].size());
    into.bytes[k].insert(into.bytes[k].end(), from.bytes[k].begin(), from.bytes[k].end());
    for (size_t i = 1; i < from.offsets[k].size(); ++i) into.offsets[k].push_back(shift + from.offsets[k][i]);
    into.valid[k].insert(into.valid[k].end(), from.valid[k].begin(), from.valid[k].end());
  }
}

void collect_arrow_strings(const ArrowColumnPlan& col, const ArrowChunkView* const* views, const int64_t* row,
                           int64_t n, ArrowStringLists& lists, size_t k, bool* valid) {
  std::vector<char>& bytes = lists.bytes[k];
  std::vector<int64_t>& offsets = lists.offsets[k];
  std::vector<uint8_t>& present = lists.valid[k];
  const auto* fill = reinterpret_cast<const char*>(col.request.fill_value.data());
  for (int64_t i = 0; i < n; ++i) {
    const ArrowChunkView& v = *views[i];
    int64_t r = 0;
    const bool ok = value_valid(col, v, row[i], &r);
    if (valid) valid[i] = ok;
    if (ok) {
      const char* p = nullptr;
      int64_t length = 0;
      if (!v.strings.get(r, &p, &length))
        bad_column(col.info.name, "row " + std::to_string(v.row0 + row[i]) + " has bytes outside its data (a corrupt array?)");
      bytes.insert(bytes.end(), p, p + length);
    } else if (!col.request.fill_none) {  // the fill value in place of the null
      bytes.insert(bytes.end(), fill, fill + col.request.fill_value.size());
    }
    present.push_back(ok || !col.request.fill_none ? 1 : 0);
    offsets.push_back(static_cast<int64_t>(bytes.size()));
  }
}

namespace {

bool is_binary_format(const char* f) {
  return f && (std::strcmp(f, "z") == 0 || std::strcmp(f, "Z") == 0 || std::strcmp(f, "vz") == 0);
}
bool is_string_format(const char* f) {
  return f && (std::strcmp(f, "u") == 0 || std::strcmp(f, "U") == 0 || std::strcmp(f, "vu") == 0);
}

// Field `child` (0: bytes, 1: path) of a struct<bytes, path> column in one chunk, with the
// struct's validity and the field's own.
ArrowChunkView media_field_view(const ArrowArray& batch, const ArrowColumnInfo& info, const ArrowSchema& s, int child,
                                int64_t row0) {
  ArrowChunkView view;
  view.row0 = row0;
  ArrowLeafAt at = leaf_at(batch, info.path, info.name);
  const ArrowArray* st = at.array;
  if (st->n_children != 2 || !st->children || !st->children[child])
    bad_column(info.name, "a struct<bytes, path> chunk without its two fields");
  const ArrowArray* a = st->children[child];
  const int64_t first = at.first + a->offset;
  view.validity = std::move(at.validity);
  if (a->null_count != 0 && a->n_buffers >= 1 && a->buffers[0])
    view.validity.emplace_back(static_cast<const uint8_t*>(a->buffers[0]), first);
  view.strings = arrow_strings(*a, *s.children[child], first);
  if (!view.strings.valid()) bad_column(info.name, "a struct<bytes, path> field without its offsets, views or data");
  return view;
}

// A binary column decoded per row (ArrowColumnRequest::decoder), with its path column if any.
ArrowColumnPlan plan_decoded_column(const ArrowTable& table, ArrowColumnPlan col, ArrowColumnRequest req,
                                    bool check_nulls) {
  const ArrowColumnInfo& info = col.info;
  const ArrowSchema& s = table.column_schema(info);
  const ArrowSchema& values = info.dictionary ? *s.dictionary : s;
  col.utf8 = std::strcmp(values.format, "u") == 0 || std::strcmp(values.format, "U") == 0 ||
             std::strcmp(values.format, "vu") == 0;
  if (info.media) {
    col.utf8 = false;
    if (s.n_children != 2 || !is_binary_format(s.children[0]->format) || !is_string_format(s.children[1]->format))
      bad_column(info.name, "of type " + info.type + ": its bytes must be binary and its path a string");
  } else if (info.kind != ArrowKind::kBytes || col.utf8) {
    bad_column(info.name, "of type " + info.type + " cannot be decoded: decode= takes a binary column (or a struct "
                          "of bytes and path, as a Hugging Face Image feature)");
  }
  if (info.dictionary) arrow_fixed_dtype(s.format, &col.index_type);
  if (req.as_list || req.fill || req.with_valid || req.max_items != 0)
    bad_column(info.name, "a decoded column takes no max_length, fill_null or with_valid");
  if (info.media) {  // the path field of the same struct: its plan only names it (no dictionary)
    auto plan = std::make_shared<ArrowColumnPlan>();
    plan->info = info;
    plan->info.name = info.name + ".path";
    col.path = std::move(plan);
  } else if (!req.path_column.empty()) {
    ArrowColumnRequest path;
    path.name = req.path_column;
    path.as_list = true;  // read as strings; its plan serves only the views of its values
    auto plan = std::make_shared<ArrowColumnPlan>(plan_arrow_column(table, std::move(path), /*check_nulls=*/false));
    if (!plan->utf8)
      bad_column(req.path_column, "of type " + plan->info.type + " is not a string column of paths");
    col.path = std::move(plan);
  } else if (check_nulls && info.first_null >= 0) {
    bad_column(info.name, "holds nulls (the first at row " + std::to_string(info.first_null) +
                          "): an image column's rows must all hold an image");
  }
  const PartSchema part = req.decoder->part(req.decoded_name.empty() ? info.name : req.decoded_name);
  col.item_shape = part.row_shape;
  col.row_bytes = static_cast<int64_t>(part.row_bytes);
  col.item_bytes = 1;
  col.request = std::move(req);
  return col;
}

}  // namespace

void decode_arrow_values(const ArrowColumnPlan& col, const ArrowChunkView* const* views, const int64_t* rows,
                         const int64_t* ids, const int64_t* epochs, int64_t n, uint64_t seed, int64_t epoch,
                         std::byte* dst) {
  const ValueDecoder& decoder = *col.request.decoder;
  const std::string& name = col.request.decoded_name.empty() ? col.info.name : col.request.decoded_name;
  thread_local std::string path;
  for (int64_t i = 0; i < n; ++i) {
    const ArrowChunkView& v = *views[i];
    ValueOrigin origin;
    origin.column = &name;
    origin.row = v.row0 + rows[i];
    origin.sample = ids[i];
    std::byte* out = dst + i * col.row_bytes;
    int64_t r = 0;
    const char* p = nullptr;
    int64_t length = 0;
    if (value_valid(col, v, rows[i], &r)) {
      if (!v.strings.get(r, &p, &length))
        bad_column(name, "row " + std::to_string(origin.row) + " has bytes outside its data (a corrupt array?)");
      decoder.decode(p, length, nullptr, seed, epochs ? epochs[i] : epoch, origin, out);
      continue;
    }
    if (!col.path || !v.path || !value_valid(*col.path, *v.path, rows[i], &r))
      bad_column(name, "row " + std::to_string(origin.row) + " (sample " + std::to_string(origin.sample) +
                           ") holds no image: its bytes are null" + (col.path ? " and so is its path" : ""));
    if (!v.path->strings.get(r, &p, &length))
      bad_column(col.path->info.name, "row " + std::to_string(origin.row) + " has bytes outside its data (a corrupt array?)");
    path.assign(p, static_cast<size_t>(length));
    decoder.decode(nullptr, 0, &path, seed, epochs ? epochs[i] : epoch, origin, out);
  }
}

ArrowColumnPlan plan_arrow_column(const ArrowTable& table, ArrowColumnRequest req, bool check_nulls) {
  ArrowColumnPlan col;
  col.info = table.column(req.name);
  const ArrowColumnInfo& info = col.info;
  const std::string& name = info.name;
  if (req.decoder && info.media) return plan_decoded_column(table, std::move(col), std::move(req), check_nulls);
  if (!info.unsupported.empty())
    throw std::invalid_argument("Arrow column '" + name + "' of type " + info.type + ": " + info.unsupported);
  if (req.decoder) return plan_decoded_column(table, std::move(col), std::move(req), check_nulls);
  if (check_nulls && info.first_null >= 0 && !req.fill)
    throw std::invalid_argument("Arrow column '" + name + "' holds nulls (the first at row " +
                                std::to_string(info.first_null) + "): pass fill_null={'" + name +
                                "': value} or drop it with columns=");
  const ArrowSchema& s = table.column_schema(info);
  const ArrowSchema& values = info.dictionary ? *s.dictionary : s;
  if (info.dictionary) arrow_fixed_dtype(s.format, &col.index_type);
  const int64_t element_bytes = info.kind == ArrowKind::kBool || info.dtype == kBoolType ? 1 : info.dtype.bits / 8;
  col.utf8 = std::strcmp(values.format, "u") == 0 || std::strcmp(values.format, "U") == 0 ||
             std::strcmp(values.format, "vu") == 0;
  col.item_shape = info.item_shape;
  if (!req.shape.empty() && info.kind != ArrowKind::kFixed && info.kind != ArrowKind::kBool)
    bad_column(name, "a shape is given for a column of type " + info.type + ", which is not fixed-size");
  if (!req.list_shape.empty() && info.kind != ArrowKind::kList)
    bad_column(name, "a list shape is given for a column of type " + info.type + ", which is not a list");
  if (req.as_list) {
    if (info.kind != ArrowKind::kBytes) bad_column(name, "of type " + info.type + " is not a string column");
    col.item_bytes = 1;
  } else if (info.kind == ArrowKind::kList || info.kind == ArrowKind::kBytes) {
    std::vector<int64_t> inner;
    if (info.kind == ArrowKind::kList) {
      const std::vector<int64_t>& declared = req.list_shape;
      if (info.inner_lists > 0 && declared.empty())
        bad_column(name, "of type " + info.type + ": a list of lists is read only with a declared shape (a Hugging "
                         "Face Array2D/Array3D feature)");
      if (!declared.empty()) {
        if (static_cast<int>(declared.size()) != 1 + info.inner_lists)
          bad_column(name, "the declared shape " + shape_text(declared) + " has " + std::to_string(declared.size()) +
                           " dimensions, the type " + info.type + " " + std::to_string(1 + info.inner_lists) +
                           " variable-size ones");
        for (size_t d = 1; d < declared.size(); ++d)
          if (declared[d] <= 0) bad_column(name, "the declared shape " + shape_text(declared) + " is not positive");
        inner.assign(declared.begin() + 1, declared.end());
        if (declared[0] >= 0) col.exact = true, req.max_items = declared[0];
      }
      col.item_shape.insert(col.item_shape.begin(), inner.begin(), inner.end());
    }
    col.leaf_bytes = info.elements * element_bytes;
    col.item_bytes = product(inner) * col.leaf_bytes;
    if (req.max_items < 0) bad_column(name, "negative max_length");
    if (req.pad.empty() || col.item_bytes % static_cast<int64_t>(req.pad.size()) != 0)
      bad_column(name, "a pad value of " + std::to_string(req.pad.size()) + " bytes does not divide an item of " +
                           std::to_string(col.item_bytes));
    col.row_bytes = req.max_items * col.item_bytes;
    const int64_t fill = static_cast<int64_t>(req.fill_value.size());
    if (req.fill && (col.item_bytes == 0 ? fill != 0 : fill % col.item_bytes != 0))
      bad_column(name, "a fill value of " + std::to_string(fill) + " bytes is not whole items of " +
                           std::to_string(col.item_bytes));
    if (req.fill && col.exact && fill != col.row_bytes)
      bad_column(name, "a fill value of " + std::to_string(fill) + " bytes for rows of " + std::to_string(col.row_bytes));
  } else {
    if (!req.shape.empty()) {
      if (product(req.shape) != info.elements || std::any_of(req.shape.begin(), req.shape.end(), [](int64_t d) { return d < 0; }))
        bad_column(name, "the shape " + shape_text(req.shape) + " does not hold the " + std::to_string(info.elements) +
                             " elements of a row of " + info.type);
      col.item_shape = req.shape;
    }
    col.row_bytes = info.elements * element_bytes;
    if (req.fill && static_cast<int64_t>(req.fill_value.size()) != col.row_bytes)
      bad_column(name, "a fill value of " + std::to_string(req.fill_value.size()) + " bytes for rows of " +
                           std::to_string(col.row_bytes));
  }
  if (!req.fill) req.with_valid = false, req.fill_none = false;
  col.request = std::move(req);
  return col;
}

void add_arrow_parts(const ArrowColumnPlan& col, std::vector<PartSchema>& parts) {
  if (col.decoded()) {
    parts.push_back(col.request.decoder->part(col.request.decoded_name.empty() ? col.info.name : col.request.decoded_name));
    return;
  }
  if (!col.request.as_list) {  // a list of strings is carried in the batch's extras
    std::vector<int64_t> shape = col.item_shape;
    if (col.is_list()) shape.insert(shape.begin(), col.request.max_items);
    parts.push_back({col.info.name, col.info.dtype, shape, static_cast<size_t>(col.row_bytes)});
    if (col.has_lengths()) parts.push_back({col.info.name + "_lengths", kInt64, {}, sizeof(int64_t)});
  }
  if (col.request.with_valid) parts.push_back({arrow_valid_name(col.info.name), kBoolType, {}, 1});
}

ArrowChunkView arrow_chunk_view(const ArrowTable& table, size_t chunk, const ArrowColumnPlan& plan, int64_t row0) {
  const ArrowColumnInfo& here = table.column(plan.info.name);
  if (plan.info.media) {  // an image column's struct<bytes, path> (the plan checked its fields' types)
    const ArrowSchema& s = table.column_schema(here);
    if (!here.media || !is_binary_format(s.children[0]->format) || !is_string_format(s.children[1]->format))
      throw std::invalid_argument("Arrow column '" + plan.info.name + "' is " + here.type + " here, " +
                                  plan.info.type + " where the source was opened");
    ArrowChunkView view = media_field_view(table.chunk(chunk), here, s, 0, row0);
    view.path = std::make_shared<const ArrowChunkView>(media_field_view(table.chunk(chunk), here, s, 1, row0));
    return view;
  }
  if (here.kind != plan.info.kind || here.dtype != plan.info.dtype || here.item_shape != plan.info.item_shape ||
      here.dictionary != plan.info.dictionary || here.inner_lists != plan.info.inner_lists || !here.unsupported.empty())
    throw std::invalid_argument("Arrow column '" + plan.info.name + "' is " + here.type + " here, " + plan.info.type +
                                " where the source was opened");
  const ArrowSchema& s = table.column_schema(here);
  if (here.dictionary) {
    DType index;
    arrow_fixed_dtype(s.format, &index);
    if (index != plan.index_type)
      throw std::invalid_argument("Arrow column '" + plan.info.name + "': its dictionary indices changed type");
  }
  ArrowChunkView view = view_of(table.chunk(chunk), here, s, plan, row0);
  if (plan.path) view.path = std::make_shared<const ArrowChunkView>(arrow_chunk_view(table, chunk, *plan.path, row0));
  return view;
}

}  // namespace fastload
