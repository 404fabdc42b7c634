// Arrow columns described from their schema; see arrow_types.h.
#include "core/arrow_types.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace fastload {

namespace {

bool starts_with(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

bool parse_size(const char* digits, int64_t* out) {
  char* end = nullptr;
  const long long n = std::strtoll(digits, &end, 10);
  if (end == digits || *end != '\0' || n < 0) return false;
  *out = n;
  return true;
}

// The node's ARROW:extension:name, or "".
std::string extension_of(const ArrowSchema* s, std::string* metadata = nullptr) {
  std::string name;
  for (const auto& [key, value] : arrow_metadata(s->metadata)) {
    if (key == "ARROW:extension:name") name = value;
    if (key == "ARROW:extension:metadata" && metadata) *metadata = value;
  }
  return name;
}

bool is_string_format(const std::string& f) {
  return f == "u" || f == "U" || f == "z" || f == "Z" || f == "vu" || f == "vz";
}

// Fills kind, dtype, shape and elements of values of schema `s` (no struct); sets `unsupported`
// when the gather cannot read them. `depth`: the variable-size list levels above `s` in the
// column; `top`: `s` is the column itself (its own dictionary and extension are the caller's).
void describe_values(const ArrowSchema* s, ArrowColumnInfo& c, int depth, bool top) {
  const std::string f = s->format ? s->format : "";
  DType t;
  int64_t n = 0;
  if (!top) {
    const std::string ext = extension_of(s);
    if (!ext.empty()) {
      c.unsupported = "it holds the extension type '" + ext + "' inside it, which is not read natively";
      return;
    }
    if (s->dictionary) {
      c.unsupported = "a dictionary inside a list is not decoded";
      return;
    }
  }
  if (arrow_fixed_dtype(f.c_str(), &t)) {
    c.kind = ArrowKind::kFixed, c.dtype = t;
  } else if (f == "b") {
    c.kind = ArrowKind::kBool, c.dtype = kBoolType;
  } else if (f == "n") {
    c.unsupported = "its type is null (it holds no values)";
  } else if (starts_with(f.c_str(), "w:") && parse_size(f.c_str() + 2, &n)) {
    c.kind = ArrowKind::kFixed, c.dtype = {kUInt, 8};
    c.item_shape.push_back(n), c.elements *= n;
  } else if (starts_with(f.c_str(), "+w:") && parse_size(f.c_str() + 3, &n) && s->n_children == 1) {
    c.item_shape.push_back(n), c.elements *= n;
    const int inner_before = c.inner_lists;
    describe_values(s->children[0], c, depth, false);
    if (c.unsupported.empty() && ((c.kind != ArrowKind::kFixed && c.kind != ArrowKind::kBool) ||
                                  c.inner_lists != inner_before))
      c.unsupported = "fixed-size lists of variable-length values are not gathered";
  } else if ((arrow_is_list(*s) || arrow_is_list_view(*s)) && s->n_children == 1) {
    if (depth > 0 && arrow_is_list_view(*s)) {
      c.unsupported = "list views inside lists are not gathered";
      return;
    }
    if (!c.item_shape.empty()) {
      c.unsupported = "fixed-size lists of variable-length values are not gathered";
      return;
    }
    if (depth == 0) c.views = arrow_is_list_view(*s);
    if (depth > 0) ++c.inner_lists;
    describe_values(s->children[0], c, depth + 1, false);
    if (c.unsupported.empty() && c.kind == ArrowKind::kBytes)
      c.unsupported = "lists of strings or binary values are not gathered";
    c.kind = ArrowKind::kList;
  } else if (is_string_format(f)) {
    if (depth > 0) {
      c.kind = ArrowKind::kBytes;  // refused by the list above it
      return;
    }
    c.kind = ArrowKind::kBytes, c.dtype = {kUInt, 8};
    c.views = f == "vu" || f == "vz";
  } else {
    c.unsupported = "its type is not gathered";
  }
}

// The extension types a struct's storage stands for: not flattened into fields (their fields
// would be read as columns without the type's meaning), but described (and refused) as one column.
bool keeps_its_fields_together(const ArrowSchema* s) {
  if (!extension_of(s).empty()) return true;
  // Hugging Face Image / Audio: struct<bytes: binary, path: string>
  if (s->n_children != 2) return false;
  const char* a = s->children[0]->name;
  const char* b = s->children[1]->name;
  return a && b && std::strcmp(a, "bytes") == 0 && std::strcmp(b, "path") == 0;
}

void describe_fields(const ArrowSchema* s, const std::string& prefix, std::vector<int>& path,
                     std::vector<std::string>& names, std::vector<ArrowColumnInfo>& out) {
  for (int64_t i = 0; i < s->n_children; ++i) {
    const ArrowSchema* child = s->children[i];
    const std::string field = child->name ? child->name : "";
    const std::string name = prefix + field;
    path.push_back(static_cast<int>(i));
    names.push_back(field);
    const bool is_struct = child->format && std::strcmp(child->format, "+s") == 0 && !child->dictionary;
    if (is_struct && !keeps_its_fields_together(child)) {
      describe_fields(child, name + ".", path, names, out);
    } else {
      ArrowColumnInfo c;
      c.name = name;
      c.field_path = names;
      c.type = arrow_type_name(child);
      c.path = path;
      c.extension = extension_of(child, &c.extension_metadata);
      if (!c.extension.empty()) c.type = "extension<" + c.extension + "> of storage " + c.type;
      if (is_struct && c.extension.empty()) {
        c.type = "struct<bytes, path> (an encoded image or audio file)";
        c.unsupported = "encoded media are decoded only as an image column (decode=)";
        c.media = true;
      } else if (is_struct) {
        c.unsupported = "its storage is a struct";
      } else if (child->dictionary) {
        DType index;
        c.dictionary = true;
        if (!arrow_fixed_dtype(child->format ? child->format : "", &index) || index.code == kFloat)
          c.unsupported = "its dictionary indices are not integers";
        else
          describe_values(child->dictionary, c, 0, false);
        if (c.unsupported.empty() && c.kind == ArrowKind::kList)
          c.unsupported = "a dictionary of lists is not decoded";
      } else {
        describe_values(child, c, 0, true);
      }
      out.push_back(std::move(c));
    }
    names.pop_back();
    path.pop_back();
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> arrow_metadata(const char* metadata) {
  std::vector<std::pair<std::string, std::string>> out;
  if (!metadata) return out;
  // int32 count, then per pair: int32 length + key bytes, int32 length + value bytes (native order).
  // The total length is not given: each read trusts the lengths before it, bounded loosely.
  const char* p = metadata;
  auto read_int = [&p]() {
    int32_t v;
    std::memcpy(&v, p, 4);
    p += 4;
    return v;
  };
  const int32_t count = read_int();
  if (count < 0 || count > (1 << 20)) throw std::invalid_argument("Arrow schema metadata with a bad pair count");
  for (int32_t i = 0; i < count; ++i) {
    std::string kv[2];
    for (std::string& s : kv) {
      const int32_t len = read_int();
      if (len < 0 || len > (1 << 30)) throw std::invalid_argument("Arrow schema metadata with a bad length");
      s.assign(p, static_cast<size_t>(len));
      p += len;
    }
    out.emplace_back(std::move(kv[0]), std::move(kv[1]));
  }
  return out;
}

namespace {
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
}  // namespace

std::string arrow_type_name(const ArrowSchema* s) {
  const std::string f = s->format ? s->format : "?";
  static const std::pair<const char*, const char*> names[] = {
      {"n", "null"}, {"b", "bool"}, {"c", "int8"}, {"C", "uint8"}, {"s", "int16"}, {"S", "uint16"},
      {"i", "int32"}, {"I", "uint32"}, {"l", "int64"}, {"L", "uint64"}, {"e", "float16"}, {"f", "float32"},
      {"g", "float64"}, {"z", "binary"}, {"Z", "large_binary"}, {"u", "string"}, {"U", "large_string"},
      {"vu", "string_view"}, {"vz", "binary_view"}, {"+s", "struct"}, {"+m", "map"}, {"+r", "run_end_encoded"}};
  for (const auto& [code, name] : names)
    if (f == code) return s->dictionary ? "dictionary<" + arrow_type_name(s->dictionary) + ">" : name;
  auto child = [&](int64_t i) { return i < s->n_children ? arrow_type_name(s->children[i]) : std::string("?"); };
  if (f == "+l") return "list<" + child(0) + ">";
  if (f == "+L") return "large_list<" + child(0) + ">";
  if (f == "+vl") return "list_view<" + child(0) + ">";
  if (f == "+vL") return "large_list_view<" + child(0) + ">";
  if (starts_with(f.c_str(), "+w:")) return "fixed_size_list<" + child(0) + ", " + f.substr(3) + ">";
  if (starts_with(f.c_str(), "+u")) return "union";
  if (starts_with(f.c_str(), "d:")) return "decimal(" + f.substr(2) + ")";
  if (starts_with(f.c_str(), "w:")) return "fixed_size_binary(" + f.substr(2) + ")";
  if (f.size() >= 3 && f[0] == 't') return temporal_name(f);
  return "format '" + f + "'";
}

bool arrow_fixed_dtype(const char* format, DType* out) {
  const std::string f = format;
  static const std::pair<const char*, DType> types[] = {
      {"c", {kInt, 8}},   {"C", {kUInt, 8}},  {"s", {kInt, 16}},   {"S", {kUInt, 16}}, {"i", {kInt, 32}},
      {"I", {kUInt, 32}}, {"l", {kInt, 64}},  {"L", {kUInt, 64}},  {"e", {kFloat, 16}}, {"f", {kFloat, 32}},
      {"g", {kFloat, 64}}, {"tdD", {kInt, 32}}, {"tdm", {kInt, 64}}, {"tts", {kInt, 32}}, {"ttm", {kInt, 32}},
      {"ttu", {kInt, 64}}, {"ttn", {kInt, 64}}};
  for (const auto& [code, t] : types)
    if (f == code) return *out = t, true;
  if (starts_with(format, "ts") || starts_with(format, "tD")) return *out = {kInt, 64}, true;
  return false;
}

std::vector<ArrowColumnInfo> describe_arrow_columns(const ArrowSchema& record_batch) {
  std::vector<ArrowColumnInfo> out;
  std::vector<int> path;
  std::vector<std::string> names;
  describe_fields(&record_batch, "", path, names, out);
  return out;
}

bool arrow_wide_offsets(const ArrowSchema& s) {
  return std::strcmp(s.format, "+L") == 0 || std::strcmp(s.format, "U") == 0 || std::strcmp(s.format, "Z") == 0 ||
         std::strcmp(s.format, "+vL") == 0;
}
bool arrow_is_list(const ArrowSchema& s) { return std::strcmp(s.format, "+l") == 0 || std::strcmp(s.format, "+L") == 0; }
bool arrow_is_list_view(const ArrowSchema& s) {
  return std::strcmp(s.format, "+vl") == 0 || std::strcmp(s.format, "+vL") == 0;
}

}  // namespace fastload
