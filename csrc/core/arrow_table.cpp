// Arrow record batches and their columns; see arrow_table.h.
#include "core/arrow_table.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

namespace fastload {

namespace {

bool starts_with(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

// Dates, times, timestamps and durations as pyarrow spells them, unit and time zone included: a
// batch holds their integers, which mean nothing without the unit.
std::string temporal_name(const std::string& f) {
  static const std::pair<const char*, const char*> fixed[] = {
      {"tdD", "date32[day]"}, {"tdm", "date64[ms]"}, {"tts", "time32[s]"},       {"ttm", "time32[ms]"},
      {"ttu", "time64[us]"},  {"ttn", "time64[ns]"}, {"tiM", "month_interval"}, {"tiD", "day_time_interval"},
      {"tin", "month_day_nano_interval"}};
  for (const auto& [code, name] : fixed)
    if (f == code) return name;
  static const std::pair<char, const char*> units[] = {{'s', "s"}, {'m', "ms"}, {'u', "us"}, {'n', "ns"}};
  std::string unit = "?";
  for (const auto& [code, name] : units)
    if (f[2] == code) unit = name;
  if (starts_with(f.c_str(), "tD")) return "duration[" + unit + "]";
  if (starts_with(f.c_str(), "ts")) {  // "tsu:" or "tsu:Europe/Paris"
    const std::string zone = f.size() > 4 ? f.substr(4) : "";
    return "timestamp[" + unit + (zone.empty() ? "" : ", tz=" + zone) + "]";
  }
  return "format '" + f + "'";
}

// A readable name for an Arrow format string (the C data interface's spelling otherwise).
std::string type_name(const ArrowSchema* s) {
  const std::string f = s->format ? s->format : "?";
  static const std::pair<const char*, const char*> names[] = {
      {"n", "null"}, {"b", "bool"}, {"c", "int8"}, {"C", "uint8"}, {"s", "int16"}, {"S", "uint16"},
      {"i", "int32"}, {"I", "uint32"}, {"l", "int64"}, {"L", "uint64"}, {"e", "float16"}, {"f", "float32"},
      {"g", "float64"}, {"z", "binary"}, {"Z", "large_binary"}, {"u", "string"}, {"U", "large_string"},
      {"vu", "string_view"}, {"vz", "binary_view"}, {"+s", "struct"}, {"+m", "map"}, {"+vl", "list_view"},
      {"+vL", "large_list_view"}, {"+r", "run_end_encoded"}};
  for (const auto& [code, name] : names)
    if (f == code) return s->dictionary ? "dictionary<" + type_name(s->dictionary) + ">" : name;
  auto child = [&](int64_t i) { return i < s->n_children ? type_name(s->children[i]) : std::string("?"); };
  if (f == "+l") return "list<" + child(0) + ">";
  if (f == "+L") return "large_list<" + child(0) + ">";
  if (starts_with(f.c_str(), "+w:")) return "fixed_size_list<" + child(0) + ", " + f.substr(3) + ">";
  if (starts_with(f.c_str(), "+u")) return "union";
  if (starts_with(f.c_str(), "d:")) return "decimal(" + f.substr(2) + ")";
  if (starts_with(f.c_str(), "w:")) return "fixed_size_binary(" + f.substr(2) + ")";
  if (f.size() >= 3 && f[0] == 't') return temporal_name(f);
  return "format '" + f + "'";
}

// Fixed-width numbers (dates, times, timestamps and durations as their integers).
bool fixed_dtype(const std::string& f, DType* out) {
  static const std::pair<const char*, DType> types[] = {
      {"c", {kInt, 8}},   {"C", {kUInt, 8}},  {"s", {kInt, 16}},   {"S", {kUInt, 16}}, {"i", {kInt, 32}},
      {"I", {kUInt, 32}}, {"l", {kInt, 64}},  {"L", {kUInt, 64}},  {"e", {kFloat, 16}}, {"f", {kFloat, 32}},
      {"g", {kFloat, 64}}, {"tdD", {kInt, 32}}, {"tdm", {kInt, 64}}, {"tts", {kInt, 32}}, {"ttm", {kInt, 32}},
      {"ttu", {kInt, 64}}, {"ttn", {kInt, 64}}};
  for (const auto& [code, t] : types)
    if (f == code) return *out = t, true;
  if (starts_with(f.c_str(), "ts") || starts_with(f.c_str(), "tD")) return *out = {kInt, 64}, true;
  return false;
}

bool parse_size(const char* digits, int64_t* out) {
  char* end = nullptr;
  const long long n = std::strtoll(digits, &end, 10);
  if (end == digits || *end != '\0' || n < 0) return false;
  *out = n;
  return true;
}

// Fills kind, dtype, shape and elements of values of schema `s` (no dictionary, no struct); sets
// `unsupported` when the gather cannot read them.
void describe_values(const ArrowSchema* s, ArrowColumnInfo& c, bool in_list) {
  const std::string f = s->format ? s->format : "";
  DType t;
  int64_t n = 0;
  if (s->dictionary) {
    c.unsupported = "a dictionary inside a list is not decoded";
  } else if (fixed_dtype(f, &t)) {
    c.kind = ArrowKind::kFixed, c.dtype = t;
  } else if (f == "b") {
    if (in_list) c.unsupported = "lists of bool are not gathered";
    c.kind = ArrowKind::kBool, c.dtype = kBoolType;
  } else if (starts_with(f.c_str(), "w:") && parse_size(f.c_str() + 2, &n)) {
    c.kind = ArrowKind::kFixed, c.dtype = {kUInt, 8};
    c.item_shape.push_back(n), c.elements *= n;
  } else if (starts_with(f.c_str(), "+w:") && parse_size(f.c_str() + 3, &n) && s->n_children == 1) {
    c.item_shape.push_back(n), c.elements *= n;
    describe_values(s->children[0], c, in_list);
    if (c.unsupported.empty() && c.kind != ArrowKind::kFixed && c.kind != ArrowKind::kBool)
      c.unsupported = "fixed-size lists of variable-length values are not gathered";
  } else if ((f == "+l" || f == "+L") && !in_list && s->n_children == 1) {
    describe_values(s->children[0], c, true);
    if (c.unsupported.empty() && c.kind != ArrowKind::kFixed)
      c.unsupported = "lists of variable-length values are not gathered";
    c.kind = ArrowKind::kList;
  } else if ((f == "u" || f == "U" || f == "z" || f == "Z") && !in_list) {
    c.kind = ArrowKind::kBytes, c.dtype = {kUInt, 8};
  } else {
    c.unsupported = "its type is not gathered";
  }
}

// Leaf columns of a struct's fields, flattened to "parent.child".
void describe_fields(const ArrowSchema* s, const std::string& prefix, std::vector<int>& path,
                     std::vector<ArrowColumnInfo>& out) {
  for (int64_t i = 0; i < s->n_children; ++i) {
    const ArrowSchema* child = s->children[i];
    const std::string name = prefix + (child->name ? child->name : "");
    path.push_back(static_cast<int>(i));
    const bool is_struct = child->format && std::strcmp(child->format, "+s") == 0 && !child->dictionary;
    bool media = false;  // Hugging Face Image / Audio: struct<bytes: binary, path: string>
    if (is_struct && child->n_children == 2) {
      const char* a = child->children[0]->name;
      const char* b = child->children[1]->name;
      media = a && b && std::strcmp(a, "bytes") == 0 && std::strcmp(b, "path") == 0;
    }
    if (is_struct && !media) {
      describe_fields(child, name + ".", path, out);
    } else {
      ArrowColumnInfo c;
      c.name = name;
      c.type = type_name(child);
      c.path = path;
      if (media) {
        c.type = "struct<bytes, path> (an encoded image or audio file)";
        c.unsupported = "encoded media are not decoded natively";
      } else if (child->dictionary) {
        DType index;
        c.dictionary = true;
        if (!fixed_dtype(child->format ? child->format : "", &index) || index.code == kFloat)
          c.unsupported = "its dictionary indices are not integers";
        else
          describe_values(child->dictionary, c, false);
      } else {
        describe_values(child, c, false);
      }
      out.push_back(std::move(c));
    }
    path.pop_back();
  }
}

// Nulls below the row level of a leaf array (list items, fixed-size list elements, dictionary
// values), which no fill covers.
bool nested_nulls(const ArrowArray& a, const char* format, const ArrowColumnInfo& c) {
  const ArrowArray* node = &a;
  int64_t offset = 0, length = 0;
  if (c.dictionary) {
    node = a.dictionary;
    if (!node) return false;
    offset = node->offset, length = node->length;
    if (has_nulls(*node, offset, length)) return true;
  } else {
    offset = a.offset, length = a.length;
  }
  (void)format;
  // Walk the children (a list's items, a fixed-size list's elements) over the whole child.
  while (node->n_children == 1 && node->children && node->children[0]) {
    node = node->children[0];
    if (has_nulls(*node, node->offset, node->length)) return true;
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
  if (a.null_count == 0 || a.n_buffers < 1 || !a.buffers[0]) return false;
  if (a.null_count > 0 && offset == a.offset && length == a.length) return true;
  return first_zero_bit(static_cast<const uint8_t*>(a.buffers[0]), offset, length) >= 0;
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
                                type_name(schema_));
  for (ArrowArray* b : batches_) {
    if (b->n_children != schema_->n_children)
      throw std::invalid_argument("an Arrow chunk has " + std::to_string(b->n_children) + " columns, its schema " +
                                  std::to_string(schema_->n_children));
    starts_.push_back(starts_.back() + b->length);
  }
  std::vector<int> path;
  describe_fields(schema_, "", path, columns_);
  for (ArrowColumnInfo& c : columns_) {
    if (!c.unsupported.empty()) continue;
    for (size_t k = 0; k < batches_.size(); ++k) {
      const ArrowLeafAt at = leaf_at(*batches_[k], c.path, c.name);
      if (nested_nulls(*at.array, nullptr, c)) {
        c.unsupported = "it holds nulls inside its values (list items or fixed-size list elements), which "
                        "fill_null does not cover";
        break;
      }
      if (c.first_null >= 0) continue;
      int64_t first = -1;
      for (const auto& [bits, bit0] : at.validity) {
        const int64_t z = first_zero_bit(bits, bit0, batches_[k]->length);
        if (z >= 0 && (first < 0 || z < first)) first = z;
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
  const bool wide = [&] {
    const ArrowSchema* s = &column_schema(c);
    if (c.dictionary) s = s->dictionary;
    return std::strcmp(s->format, "+L") == 0 || std::strcmp(s->format, "U") == 0 || std::strcmp(s->format, "Z") == 0;
  }();
  int64_t longest = 0;
  auto scan = [&](const void* offsets, int64_t first, int64_t rows) {
    if (rows <= 0 || !offsets) return;
    if (wide) {
      const int64_t* o = static_cast<const int64_t*>(offsets) + first;
      for (int64_t r = 0; r < rows; ++r) longest = std::max(longest, o[r + 1] - o[r]);
    } else {
      const int32_t* o = static_cast<const int32_t*>(offsets) + first;
      for (int64_t r = 0; r < rows; ++r) longest = std::max<int64_t>(longest, int64_t{o[r + 1]} - o[r]);
    }
  };
  for (const ArrowArray* b : batches_) {
    const ArrowLeafAt at = leaf_at(*b, c.path, c.name);
    const ArrowArray* a = at.array;
    if (c.dictionary) {
      if (a->dictionary && a->dictionary->n_buffers >= 2) scan(a->dictionary->buffers[1], a->dictionary->offset,
                                                               a->dictionary->length);
    } else if (a->n_buffers >= 2) {
      scan(a->buffers[1], at.first, b->length);
    }
  }
  return longest;
}

}  // namespace fastload
