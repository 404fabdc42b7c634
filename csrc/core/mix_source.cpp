// Several sources as one; see mix_source.h.
#include "core/mix_source.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fastload {

namespace {
std::string describe(const PartSchema& p) {
  std::string s = "(dtype code " + std::to_string(p.dtype.code) + ", " + std::to_string(p.dtype.bits) + " bits, shape [";
  for (size_t i = 0; i < p.row_shape.size(); ++i) s += (i ? ", " : "") + std::to_string(p.row_shape[i]);
  return s + "], " + std::to_string(p.row_bytes) + " bytes a row)";
}

// Part pointers of one child fill live on the stack up to this many parts.
constexpr size_t kInlineParts = 32;
}  // namespace

MixSource::MixSource(std::vector<std::shared_ptr<BatchSource>> children) : children_(std::move(children)) {
  if (children_.empty()) throw std::invalid_argument("a mixture needs at least one source");
  for (const auto& c : children_)
    if (!c) throw std::invalid_argument("a mixture's source is null");
  schema_ = children_[0]->schema();
  offsets_.push_back(0);
  for (size_t j = 0; j < children_.size(); ++j) {
    const std::vector<PartSchema>& s = children_[j]->schema();
    if (s.size() != schema_.size())
      throw std::invalid_argument("mixture source " + std::to_string(j) + " has " + std::to_string(s.size()) +
                                  " parts, source 0 has " + std::to_string(schema_.size()));
    for (size_t p = 0; p < s.size(); ++p) {
      const PartSchema &a = schema_[p], &b = s[p];
      if (a.name != b.name || a.dtype != b.dtype || a.row_shape != b.row_shape || a.row_bytes != b.row_bytes)
        throw std::invalid_argument("mixture source " + std::to_string(j) + "'s part " + std::to_string(p) + " '" +
                                    b.name + "' " + describe(b) + " differs from source 0's '" + a.name + "' " +
                                    describe(a));
    }
    offsets_.push_back(offsets_.back() + children_[j]->size());
  }
}

int MixSource::child_of(int64_t id) const {
  if (id < 0 || id >= offsets_.back())
    throw std::out_of_range("sample id " + std::to_string(id) + " out of the mixture's range [0, " +
                            std::to_string(offsets_.back()) + ")");
  return static_cast<int>(std::upper_bound(offsets_.begin(), offsets_.end(), id) - offsets_.begin()) - 1;
}

void MixSource::fill(const FillRequest& r) {
  // Local ids of the current run; per thread, reused from batch to batch.
  thread_local std::vector<int64_t> local;
  const size_t parts = schema_.size();
  std::byte* inline_parts[kInlineParts];
  std::vector<std::byte*> many;
  std::byte** part_ptrs = inline_parts;
  if (parts > kInlineParts) {
    many.resize(parts);
    part_ptrs = many.data();
  }
  if (local.size() < static_cast<size_t>(r.count)) local.resize(static_cast<size_t>(r.count));
  int64_t* const local_ids = local.data();
  int j = -1;
  for (int64_t k = 0; k < r.count;) {
    // Runs come in source order: the next child is usually the one after the last.
    const int64_t first = r.ids[k];
    if (j + 1 < static_cast<int>(children_.size()) && first >= offsets_[static_cast<size_t>(j) + 1] &&
        first < offsets_[static_cast<size_t>(j) + 2])
      j = j + 1;
    else
      j = child_of(first);
    const int64_t lo = offsets_[static_cast<size_t>(j)];
    const uint64_t rows = static_cast<uint64_t>(offsets_[static_cast<size_t>(j) + 1] - lo);
    // The run of rows of child j, translated to its ids in one pass.
    int64_t end = k;
    for (; end < r.count; ++end) {
      const int64_t id = r.ids[end] - lo;
      if (static_cast<uint64_t>(id) >= rows) break;
      local_ids[end - k] = id;
    }
    const int64_t run = end - k;
    for (size_t p = 0; p < parts; ++p) part_ptrs[p] = r.parts[p] + static_cast<size_t>(k) * schema_[p].row_bytes;
    std::shared_ptr<void> extras;
    FillRequest sub = r;
    sub.ids = local_ids;
    sub.count = run;
    sub.parts = part_ptrs;
    sub.extras = &extras;
    children_[static_cast<size_t>(j)]->fill(sub);
    if (extras) throw std::logic_error("a mixture's sources must not attach extras to a batch");
    k = end;
  }
}

}  // namespace fastload
