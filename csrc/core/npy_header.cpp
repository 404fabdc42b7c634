// .npy headers parsed natively; see npy_header.h.
#include "core/npy_header.h"

#include <cstring>

namespace fastload {

namespace {

// The value after `'key':` in the header dict (either quote style); npos if absent.
size_t value_of(const std::string& h, const char* key) {
  for (const char q : {'\'', '"'}) {
    const std::string k = std::string(1, q) + key + std::string(1, q);
    size_t at = h.find(k);
    if (at == std::string::npos) continue;
    at = h.find(':', at + k.size());
    if (at == std::string::npos) return at;
    ++at;
    while (at < h.size() && h[at] == ' ') ++at;
    return at;
  }
  return std::string::npos;
}

}  // namespace

bool parse_npy_header(const uint8_t* d, size_t n, NpyHeader* out, std::string* why) {
  if (n < 10 || std::memcmp(d, "\x93NUMPY", 6) != 0) {
    *why = "not a .npy file (no \\x93NUMPY magic)";
    return false;
  }
  const int major = d[6];
  size_t length = 0, start = 0;
  if (major == 1) {
    length = static_cast<size_t>(d[8]) | (static_cast<size_t>(d[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (n < 12) {
      *why = "a .npy header cut short";
      return false;
    }
    length = static_cast<size_t>(d[8]) | (static_cast<size_t>(d[9]) << 8) | (static_cast<size_t>(d[10]) << 16) |
             (static_cast<size_t>(d[11]) << 24);
    start = 12;
  } else {
    *why = ".npy format version " + std::to_string(major) + " is unknown";
    return false;
  }
  if (length > n - start) {
    *why = "a .npy header cut short";
    return false;
  }
  const std::string h(reinterpret_cast<const char*>(d + start), length);
  out->data_offset = start + length;
  size_t at = value_of(h, "descr");
  if (at == std::string::npos || at >= h.size() || (h[at] != '\'' && h[at] != '"')) {
    *why = "a .npy header whose descr is not a simple type (structured and object arrays are not read)";
    return false;
  }
  const size_t end = h.find(h[at], at + 1);
  if (end == std::string::npos) {
    *why = "a malformed .npy header";
    return false;
  }
  out->descr = h.substr(at + 1, end - at - 1);
  at = value_of(h, "fortran_order");
  if (at == std::string::npos) {
    *why = "a .npy header without fortran_order";
    return false;
  }
  out->fortran_order = h.compare(at, 4, "True") == 0;
  at = value_of(h, "shape");
  if (at == std::string::npos || at >= h.size() || h[at] != '(') {
    *why = "a .npy header without a shape";
    return false;
  }
  out->shape.clear();
  size_t p = at + 1;
  while (p < h.size() && h[p] != ')') {
    if (h[p] == ' ' || h[p] == ',') {
      ++p;
      continue;
    }
    if (h[p] < '0' || h[p] > '9') {
      *why = "a malformed .npy shape";
      return false;
    }
    int64_t v = 0;
    while (p < h.size() && h[p] >= '0' && h[p] <= '9') {
      if (v > (INT64_MAX - 9) / 10) {
        *why = "a .npy shape too large";
        return false;
      }
      v = v * 10 + (h[p++] - '0');
    }
    out->shape.push_back(v);
  }
  if (p >= h.size()) {
    *why = "a malformed .npy shape";
    return false;
  }
  return true;
}

std::string npy_shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

}  // namespace fastload
