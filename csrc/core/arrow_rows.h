// Where one element's values are in Arrow's variable-length layouts: list offsets (or a list
// view's offsets and sizes) and string/binary bytes (offsets into one data buffer, or the 16-byte
// views of string_view/binary_view into inline bytes or variadic buffers). Shared by the table's
// scans and the gather.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/arrow_c_data.h"
#include "core/arrow_types.h"

namespace fastload {

// The offsets of a list (or list view) array, from its element 0 at physical index `first`.
struct ArrowListOffsets {
  const void* offsets = nullptr;
  const void* sizes = nullptr;  // list views only
  bool wide = false;
  int64_t items = -1;  // the child array's length (the bound of every range)

  // Element i's items [first, end) in the child; false if they lie outside the child.
  bool range(int64_t i, int64_t* first, int64_t* end) const {
    if (wide) {
      const int64_t* o = static_cast<const int64_t*>(offsets);
      *first = o[i];
      *end = sizes ? o[i] + static_cast<const int64_t*>(sizes)[i] : o[i + 1];
    } else {
      const int32_t* o = static_cast<const int32_t*>(offsets);
      *first = o[i];
      *end = sizes ? int64_t{o[i]} + static_cast<const int32_t*>(sizes)[i] : o[i + 1];
    }
    return *first >= 0 && *end >= *first && (items < 0 || *end <= items);
  }
};

// `a` is a list or list view array of schema `s`; null offsets when it lacks its buffers.
inline ArrowListOffsets arrow_list_offsets(const ArrowArray& a, const ArrowSchema& s, int64_t first) {
  ArrowListOffsets o;
  o.wide = arrow_wide_offsets(s);
  const bool view = arrow_is_list_view(s);
  if (a.n_buffers < (view ? 3 : 2) || a.n_children != 1 || !a.children[0] || !a.buffers[1]) return o;
  const int64_t width = o.wide ? 8 : 4;
  o.offsets = static_cast<const std::byte*>(a.buffers[1]) + first * width;
  if (view) o.sizes = static_cast<const std::byte*>(a.buffers[2]) + first * width;
  o.items = a.children[0]->length;
  return o;
}

// The bytes of a string or binary array (offsets or views), from its element 0 at physical `first`.
struct ArrowStrings {
  // offsets layout
  ArrowListOffsets offsets;
  const char* data = nullptr;
  // views layout
  const std::byte* views = nullptr;
  std::vector<const char*> buffers;
  std::vector<int64_t> buffer_sizes;

  bool valid() const { return views || (offsets.offsets && data); }
  // Element i's bytes; false if they lie outside their buffer (a corrupt array).
  bool get(int64_t i, const char** p, int64_t* n) const {
    if (!views) {
      int64_t first, end;
      if (!offsets.range(i, &first, &end)) return false;
      *p = data + first, *n = end - first;
      return true;
    }
    const std::byte* v = views + i * 16;
    int32_t length;
    std::memcpy(&length, v, 4);
    if (length < 0) return false;
    *n = length;
    if (length <= 12) {
      *p = reinterpret_cast<const char*>(v + 4);
      return true;
    }
    int32_t buffer, offset;
    std::memcpy(&buffer, v + 8, 4);
    std::memcpy(&offset, v + 12, 4);
    if (buffer < 0 || static_cast<size_t>(buffer) >= buffers.size() || offset < 0 ||
        int64_t{offset} + length > buffer_sizes[static_cast<size_t>(buffer)])
      return false;
    *p = buffers[static_cast<size_t>(buffer)] + offset;
    return true;
  }
};

// `a` is a string / binary array of schema `s` (large and view forms too); !valid() when it lacks
// its buffers.
inline ArrowStrings arrow_strings(const ArrowArray& a, const ArrowSchema& s, int64_t first) {
  ArrowStrings out;
  const bool view = std::strcmp(s.format, "vu") == 0 || std::strcmp(s.format, "vz") == 0;
  if (!view) {
    if (a.n_buffers < 3 || !a.buffers[1]) return out;
    out.offsets.wide = arrow_wide_offsets(s);
    out.offsets.offsets = static_cast<const std::byte*>(a.buffers[1]) + first * (out.offsets.wide ? 8 : 4);
    // An empty array's data buffer may be null; every element then has no bytes.
    static const char kNone = 0;
    out.data = a.buffers[2] ? static_cast<const char*>(a.buffers[2]) : &kNone;
    return out;
  }
  // validity, views, the variadic data buffers, then their sizes (int64 each).
  if (a.n_buffers < 3 || !a.buffers[1]) return out;
  const int64_t variadic = a.n_buffers - 3;
  const auto* sizes = static_cast<const int64_t*>(a.buffers[a.n_buffers - 1]);
  if (variadic > 0 && !sizes) return out;
  for (int64_t b = 0; b < variadic; ++b) {
    out.buffers.push_back(static_cast<const char*>(a.buffers[2 + b]));
    out.buffer_sizes.push_back(sizes[b]);
  }
  out.views = static_cast<const std::byte*>(a.buffers[1]) + first * 16;
  return out;
}

}  // namespace fastload
