// Decoded-on-demand chunks as a batch source; see row_group_source.h. A block's rows are
// resolved to their groups, each distinct group is acquired once (decoded by the first thread
// that needs it; others wait for that decode, not a second one), and the columns are gathered
// from the decoded arrays. A decoded group stays alive while a thread gathers from it, even if
// the cache has let it go.
#include "core/row_group_source.h"

#include <algorithm>
#include <stdexcept>

namespace fastload {

RowGroupSource::RowGroupSource(std::shared_ptr<const ArrowTable> schema, std::vector<ArrowColumnRequest> columns,
                               std::vector<int64_t> group_rows, std::vector<std::string> group_names, Decode decode,
                               int64_t budget_bytes, int min_groups)
    : schema_table_(std::move(schema)), names_(std::move(group_names)), decode_(std::move(decode)),
      budget_(budget_bytes), min_groups_(min_groups) {
  for (ArrowColumnRequest& req : columns) {
    // Nulls are checked in each group as it is decoded (the schema holds no rows).
    columns_.push_back(plan_arrow_column(*schema_table_, std::move(req), /*check_nulls=*/false));
    add_arrow_parts(columns_.back(), parts_);
  }
  for (const ArrowColumnPlan& col : columns_)
    if (col.request.as_list) string_plans_.push_back(&col);
  for (int64_t rows : group_rows) {
    if (rows < 0) throw std::invalid_argument("a row group of negative rows");
    starts_.push_back(starts_.back() + rows);
  }
  names_.resize(group_rows.size());
}

int64_t RowGroupSource::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

std::shared_ptr<const RowGroupSource::Decoded> RowGroupSource::decode(int64_t g) {
  int64_t bytes = 0;
  auto d = std::make_shared<Decoded>();
  d->table = decode_(g, &bytes);
  const ArrowTable& t = *d->table;
  if (t.rows() != starts_[g + 1] - starts_[g])
    throw std::invalid_argument(names_[g] + " decoded to " + std::to_string(t.rows()) + " rows, not the " +
                                std::to_string(starts_[g + 1] - starts_[g]) +
                                " its metadata gave when the source was opened (was the file rewritten?)");
  for (const ArrowColumnPlan& col : columns_) {
    const ArrowColumnInfo& here = t.column(col.info.name);
    if (here.first_null >= 0 && !col.request.fill)
      throw std::invalid_argument("column '" + col.info.name + "' holds nulls (the first at row " +
                                  std::to_string(starts_[g] + here.first_null) + ", in " + names_[g] +
                                  "): pass fill_null={'" + col.info.name + "': value} or drop it with columns=");
    if (!here.unsupported.empty())
      throw std::invalid_argument("column '" + col.info.name + "' in " + names_[g] + ": " + here.unsupported);
    std::vector<ArrowChunkView> views;
    for (size_t c = 0; c < t.num_chunks(); ++c) views.push_back(arrow_chunk_view(t, c, col));
    d->views.push_back(std::move(views));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(g);
    if (it != cache_.end()) {
      it->second.bytes = bytes;
      it->second.done = true;
      cached_ += bytes;
    }
    evict_locked(g);
  }
  decodes_.fetch_add(1);
  return d;
}

void RowGroupSource::evict_locked(int64_t keep) {
  const size_t floor = static_cast<size_t>(min_groups_ + 2 * threads_.load());
  while (cached_ > budget_) {
    size_t done = 0;
    auto victim = cache_.end();
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (!it->second.done) continue;
      ++done;
      if (it->first != keep && (victim == cache_.end() || it->second.used < victim->second.used)) victim = it;
    }
    if (victim == cache_.end() || done <= floor) return;
    cached_ -= victim->second.bytes;
    cache_.erase(victim);
  }
}

void RowGroupSource::acquire(const std::vector<int64_t>& groups, std::vector<std::shared_ptr<const Decoded>>& out) {
  using Promise = std::promise<std::shared_ptr<const Decoded>>;
  std::vector<std::shared_future<std::shared_ptr<const Decoded>>> ready(groups.size());
  std::vector<std::pair<size_t, Promise>> mine;  // (index in groups, promise) of the groups claimed here
  mine.reserve(groups.size());
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < groups.size(); ++i) {
      auto it = cache_.find(groups[i]);
      if (it == cache_.end()) {
        mine.emplace_back(i, Promise());
        Entry& e = cache_[groups[i]];
        e.ready = mine.back().second.get_future().share();
        it = cache_.find(groups[i]);
      }
      it->second.used = ++clock_;
      ready[i] = it->second.ready;
    }
  }
  for (size_t k = 0; k < mine.size(); ++k) {
    try {
      mine[k].second.set_value(decode(groups[mine[k].first]));
    } catch (...) {
      // This group and the ones not decoded yet fail alike (a later batch tries them again):
      // no thread may wait for a promise nobody will keep.
      const std::exception_ptr error = std::current_exception();
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t j = k; j < mine.size(); ++j) cache_.erase(groups[mine[j].first]);
      }
      for (size_t j = k; j < mine.size(); ++j) mine[j].second.set_exception(error);
      std::rethrow_exception(error);
    }
  }
  out.resize(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) out[i] = ready[i].get();  // rethrows another thread's failed decode
}

void RowGroupSource::fill(const FillRequest& r) {
  for (int seen = threads_.load(); r.thread + 1 > seen && !threads_.compare_exchange_weak(seen, r.thread + 1);) {
  }
  const ArrowChunkView* views[kArrowBlock];
  const Decoded* of_row[kArrowBlock];
  size_t chunk[kArrowBlock];
  int64_t row[kArrowBlock];
  std::vector<int64_t> groups;                           // this block's distinct groups, sorted
  std::vector<std::shared_ptr<const Decoded>> held;      // and their decoded arrays
  int64_t group_of[kArrowBlock];
  std::shared_ptr<ArrowStringLists> lists;
  if (!string_plans_.empty()) {
    lists = arrow_string_lists(string_plans_, r.count);
    if (r.extras) *r.extras = lists;
  }
  for (int64_t b = 0; b < r.count; b += kArrowBlock) {
    const int64_t n = std::min(kArrowBlock, r.count - b);
    groups.clear();
    for (int64_t i = 0; i < n; ++i) {
      group_of[i] = static_cast<int64_t>(arrow_chunk_of(starts_, r.ids[b + i]));
      groups.push_back(group_of[i]);
    }
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    acquire(groups, held);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = group_of[i];
      const Decoded& d = *held[static_cast<size_t>(std::lower_bound(groups.begin(), groups.end(), g) - groups.begin())];
      const int64_t local = r.ids[b + i] - starts_[g];
      chunk[i] = arrow_chunk_of(d.table->starts(), local);
      row[i] = local - d.table->starts()[chunk[i]];
      of_row[i] = &d;
    }
    size_t p = 0, k = 0;
    for (size_t c = 0; c < columns_.size(); ++c) {
      const ArrowColumnPlan& col = columns_[c];
      bool plain = true;
      for (int64_t i = 0; i < n; ++i) {
        views[i] = &of_row[i]->views[c][chunk[i]];
        plain = plain && views[i]->plain();
      }
      if (col.request.as_list) {
        collect_arrow_strings(col, views, row, n, *lists, k++);
        continue;
      }
      std::byte* dst = r.parts[p++] + b * col.row_bytes;
      int64_t* lengths = col.is_list() ? reinterpret_cast<int64_t*>(r.parts[p++]) + b : nullptr;
      bool* valid = col.request.with_valid ? reinterpret_cast<bool*>(r.parts[p++]) + b : nullptr;
      gather_arrow_column(col, views, row, n, plain, dst, lengths, valid);
    }
  }
}

}  // namespace fastload
