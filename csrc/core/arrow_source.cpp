// Arrow columns gathered into batches; see arrow_source.h. Each id is resolved once per block to
// its chunk and row (all columns share the chunking), through the indices mapping if there is
// one; then the columns are gathered from their chunk views (arrow_gather.h).
#include "core/arrow_source.h"

#include <algorithm>
#include <stdexcept>

namespace fastload {

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

ArrowSource::ArrowSource(std::shared_ptr<const ArrowTable> table, std::vector<ArrowColumnRequest> requests,
                         std::shared_ptr<const ArrowTable> indices)
    : table_(std::move(table)), indices_(std::move(indices)) {
  size_ = table_->rows();
  for (ArrowColumnRequest& req : requests) {
    Column col;
    col.plan = plan_arrow_column(*table_, std::move(req));
    for (size_t c = 0; c < table_->num_chunks(); ++c) {
      col.chunks.push_back(arrow_chunk_view(*table_, c, col.plan, table_->starts()[c]));
    }
    add_arrow_parts(col.plan, schema_);
    columns_.push_back(std::move(col));
  }
  for (const Column& col : columns_) {
    plans_.push_back(&col.plan);
    if (col.plan.request.as_list) string_plans_.push_back(&col.plan);
    decoded_ = decoded_ || col.plan.decoded();
  }
  if (indices_) {
    index_data_ = arrow_indices_data(*indices_, &index_dtype_);
    size_ = indices_->rows();
  }
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
