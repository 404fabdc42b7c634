// Several sources as one; see mix_source.h.
#include "core/mix_source.h"

#include "core/array_source.h"
#include "core/batch_plan.h"

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

// One child's view of a mixture's plan: each batch's rows that come from the child, as the
// child's own ids (a mixture's id is offset + the child's id), in the batch's order. Only what a
// child reading the plan ahead asks of it (RowGroupSource::read_ahead: fill, num_batches,
// max_batch_rows, epoch) is more than the parent's; the batch's rows are recomputed per call.
class ChildPlan final : public BatchPlan {
 public:
  ChildPlan(const BatchPlan* parent, int64_t first, int64_t end) : parent_(parent), first_(first), end_(end) {}
  int64_t num_batches() const override { return parent_->num_batches(); }
  int64_t max_batch_rows() const override { return parent_->max_batch_rows(); }
  int64_t epoch() const override { return parent_->epoch(); }
  uint64_t seed() const override { return parent_->seed(); }
  int64_t sample_epoch(int64_t batch) const override { return parent_->sample_epoch(batch); }
  int64_t position_after(int64_t batches_done) const override { return parent_->position_after(batches_done); }
  int64_t rows(int64_t batch) const override {
    thread_local std::vector<int64_t> ids;
    ids.resize(static_cast<size_t>(max_batch_rows()));
    BatchRows out;
    out.ids = ids.data();
    return fill(batch, out);
  }
  int64_t fill(int64_t batch, const BatchRows& out) const override {
    thread_local std::vector<int64_t> all;
    all.resize(static_cast<size_t>(parent_->max_batch_rows()));
    BatchRows mine;
    mine.ids = all.data();
    const int64_t n = parent_->fill(batch, mine);
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = all[static_cast<size_t>(i)];
      if (id >= first_ && id < end_) out.ids[k++] = id - first_;
    }
    return k;
  }

 private:
  const BatchPlan* parent_;
  const int64_t first_, end_;
};
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
    if (children_[j]->has_string_lists() != children_[0]->has_string_lists())
      throw std::invalid_argument("mixture source " + std::to_string(j) + (children_[j]->has_string_lists() ? " gives" : " does not give") +
                                  " string columns as lists, source 0" + (children_[0]->has_string_lists() ? " does" : " does not"));
  }
  string_lists_ = children_[0]->has_string_lists();
  reads_plan_ahead_ = std::any_of(children_.begin(), children_.end(),
                                  [](const auto& c) { return c->reads_plan_ahead(); });
  source_epochs_ = std::any_of(children_.begin(), children_.end(),
                               [](const auto& c) { return c->wants_source_epochs(); });
  // Arrays of strided fixed-size columns (one part each; not sharded, not ragged) are read
  // straight from their columns.
  std::vector<const ArraySource*> arrays;
  for (const auto& c : children_) {
    const auto* a = dynamic_cast<const ArraySource*>(c.get());
    if (!a || a->columns().size() != schema_.size()) return;
    for (const ArrayColumn& col : a->columns())
      if (col.sharded() || col.ragged || !col.base) return;
    arrays.push_back(a);
  }
  strided_.resize(schema_.size());
  for (size_t p = 0; p < schema_.size(); ++p)
    for (const ArraySource* a : arrays) {
      strided_[p].base.push_back(a->columns()[p].base);
      strided_[p].pitch.push_back(a->columns()[p].pitch);
    }
}

int MixSource::child_of(int64_t id) const {
  if (id < 0 || id >= offsets_.back())
    throw std::out_of_range("sample id " + std::to_string(id) + " out of the mixture's range [0, " +
                            std::to_string(offsets_.back()) + ")");
  return static_cast<int>(std::upper_bound(offsets_.begin(), offsets_.end(), id) - offsets_.begin()) - 1;
}

void MixSource::fill_run(const FillRequest& r, int child, int64_t first, int64_t count, const int64_t* local_ids,
                         std::byte** part_ptrs, ArrowStringLists* lists) {
  for (size_t p = 0; p < schema_.size(); ++p)
    part_ptrs[p] = r.parts[p] + static_cast<size_t>(first) * schema_[p].row_bytes;
  std::shared_ptr<void> extras;
  FillRequest sub = r;
  // The child's ids are its own: a child that reads the plan ahead reads its view of it (no
  // view, and no lock, for the others).
  const std::shared_ptr<const BatchPlan> view =
      r.plan && children_[static_cast<size_t>(child)]->reads_plan_ahead() ? child_plan(r.plan, child) : nullptr;
  sub.plan = view.get();
  sub.ids = local_ids;
  sub.count = count;
  sub.source_epochs = r.source_epochs ? r.source_epochs + first : nullptr;
  sub.parts = part_ptrs;
  sub.extras = &extras;
  sub.local_ids = sub.source_rows = nullptr;
  sub.num_sources = 0;
  children_[static_cast<size_t>(child)]->fill(sub);
  if (extras && !lists) throw std::logic_error("a mixture's sources must not attach extras to a batch");
  if (lists) {
    if (!extras) throw std::logic_error("mixture source " + std::to_string(child) + " attached no string lists");
    append_arrow_string_lists(*lists, *static_cast<const ArrowStringLists*>(extras.get()));
  }
}

std::shared_ptr<const BatchPlan> MixSource::child_plan(const BatchPlan* plan, int child) {
  // Plans change with each run; a view of an older one stays alive while a fill holds it.
  constexpr size_t kKept = 8;
  std::lock_guard<std::mutex> lock(child_plans_mu_);
  for (const auto& kept : child_plans_)
    if (kept.first.first == plan && kept.first.second == child) return kept.second;
  if (child_plans_.size() >= kKept * children_.size()) child_plans_.erase(child_plans_.begin());
  auto view = std::make_shared<ChildPlan>(plan, offsets_[static_cast<size_t>(child)],
                                          offsets_[static_cast<size_t>(child) + 1]);
  child_plans_.emplace_back(std::make_pair(plan, child), view);
  return view;
}

void MixSource::bad_split(const FillRequest& r) const {
  int64_t k = 0;
  for (size_t j = 0; j < children_.size(); ++j) {
    const int64_t end = r.source_rows[j + 1];
    if (r.source_rows[j] != k || end < k || end > r.count)
      throw std::logic_error("a plan's rows of mixture source " + std::to_string(j) + " are not [" +
                             std::to_string(k) + ", <= " + std::to_string(r.count) + ")");
    k = end;
  }
  throw std::logic_error("a plan's sources do not cover the batch");
}

void MixSource::fill_strided(const FillRequest& r) {
  // Each row's address, in a buffer per collation thread: batches of thousands of rows are
  // common, and an allocation per batch is not needed.
  thread_local std::vector<const std::byte*> addresses;
  if (addresses.size() < static_cast<size_t>(r.count)) addresses.resize(static_cast<size_t>(r.count));
  const std::byte** rows = addresses.data();
  const size_t children = children_.size();
  const int64_t* __restrict local = r.local_ids;
  for (size_t p = 0; p < strided_.size(); ++p) {
    const StridedPart& part = strided_[p];
    for (size_t j = 0; j < children; ++j) {
      const std::byte* const base = part.base[j];
      const int64_t pitch = part.pitch[j], lo = r.source_rows[j], hi = r.source_rows[j + 1];
      const std::byte** __restrict out = rows;
#pragma GCC unroll 4
      for (int64_t k = lo; k < hi; ++k) out[k] = base + local[k] * pitch;
    }
    // One pass over the batch: the copy prefetches across the sources' boundaries.
    gather_addresses(rows, static_cast<int64_t>(schema_[p].row_bytes), r.count, r.parts[p]);
  }
}

void MixSource::fill(const FillRequest& r) {
  const size_t parts = schema_.size();
  std::byte* inline_parts[kInlineParts];
  std::vector<std::byte*> many;
  std::byte** part_ptrs = inline_parts;
  if (parts > kInlineParts) {
    many.resize(parts);
    part_ptrs = many.data();
  }
  const int children = static_cast<int>(children_.size());
  std::shared_ptr<ArrowStringLists> lists;  // the batch's string lists: each run's, in row order
  if (string_lists_) {
    lists = std::make_shared<ArrowStringLists>();
    if (r.extras) *r.extras = lists;
  }
  if (r.source_rows && r.local_ids) {
    // The plan's own split, as where each source's rows start.
    if (r.num_sources != children)
      throw std::logic_error("a plan of " + std::to_string(r.num_sources) + " sources fills a mixture of " +
                             std::to_string(children));
    bool split = r.source_rows[0] == 0 && r.source_rows[children] == r.count;
    for (int j = 0; j < children; ++j) split &= r.source_rows[j] <= r.source_rows[j + 1];
    if (!split) bad_split(r);
    if (!strided_.empty()) return fill_strided(r);
    for (int j = 0; j < children; ++j) {
      const int64_t lo = r.source_rows[j], hi = r.source_rows[j + 1];
      if (hi > lo) fill_run(r, j, lo, hi - lo, r.local_ids + lo, part_ptrs, lists.get());
    }
    return;
  }
  // Ids alone (in any order): split into runs of one child and translate, per thread scratch.
  thread_local std::vector<int64_t> local;
  if (local.size() < static_cast<size_t>(r.count)) local.resize(static_cast<size_t>(r.count));
  int64_t* const local_ids = local.data();
  for (int64_t k = 0; k < r.count;) {
    const int j = child_of(r.ids[k]);
    const int64_t lo = offsets_[static_cast<size_t>(j)];
    const uint64_t rows = static_cast<uint64_t>(offsets_[static_cast<size_t>(j) + 1] - lo);
    int64_t end = k;
    for (; end < r.count; ++end) {
      const int64_t id = r.ids[end] - lo;
      if (static_cast<uint64_t>(id) >= rows) break;
      local_ids[end - k] = id;
    }
    fill_run(r, j, k, end - k, local_ids, part_ptrs, lists.get());
    k = end;
  }
}

}  // namespace fastload
