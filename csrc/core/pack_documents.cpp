// The packer's readers of documents; see pack_documents.h.
#include "core/pack_documents.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "core/row_group_source.h"

namespace fastload {

void unequal_lengths(int64_t doc, const std::string& column, int64_t items, const std::string& first,
                     int64_t first_items) {
  throw std::invalid_argument("document " + std::to_string(doc) + ": column '" + column + "' has " +
                              std::to_string(items) + " items and column '" + first + "' " +
                              std::to_string(first_items) +
                              ": packed columns must have equal lengths row by row (e.g. input_ids and labels)");
}

// ------------------------------------------------------------------ ragged array columns

namespace {
PackColumn column_of(const std::string& name, DType dtype, std::vector<int64_t> item_shape, int64_t item_bytes) {
  return PackColumn{name, dtype, std::move(item_shape), item_bytes};
}
}  // namespace

RaggedDocuments::RaggedDocuments(std::vector<ArrayColumn> columns) : cols_(std::move(columns)) {
  if (cols_.empty()) throw std::invalid_argument("a packer needs at least one column");
  size_ = cols_[0].rows;
  for (const ArrayColumn& c : cols_) {
    if (!c.ragged) throw std::invalid_argument("column '" + c.name + "' is not a ragged column");
    if (c.rows != size_)
      throw std::invalid_argument("column '" + c.name + "' has " + std::to_string(c.rows) + " rows, column '" +
                                  cols_[0].name + "' " + std::to_string(size_));
    std::vector<int64_t> item_shape(c.row_shape.begin() + (c.row_shape.empty() ? 0 : 1), c.row_shape.end());
    columns_.push_back(column_of(c.name, c.dtype, std::move(item_shape), c.item_bytes));
  }
}

void RaggedDocuments::lengths(size_t column, const int64_t* docs, int64_t n, int64_t* out) const {
  ragged_row_lengths(cols_.at(column), docs, n, out);
}

void RaggedDocuments::copy(size_t column, const DocumentPiece* pieces, int64_t n, std::byte* dst) const {
  constexpr int64_t kBlock = 256;
  const ArrayColumn& col = cols_.at(column);
  RaggedPiece block[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (int64_t i = 0; i < m; ++i) {
      const DocumentPiece& p = pieces[b + i];
      block[i] = {p.doc, p.start, p.count, p.length, dst + p.out * col.item_bytes};
    }
    gather_ragged_pieces(col, block, m, [](const ArrayColumn& c, int64_t id, int64_t items, int64_t expect) {
      throw std::invalid_argument("document " + std::to_string(id) + ": column '" + c.name + "' has " +
                                  std::to_string(items) + " items where the first packed column has " +
                                  std::to_string(expect) +
                                  ": packed columns must have equal lengths row by row (e.g. input_ids and labels)");
    });
  }
}

// ------------------------------------------------------------------ Arrow list columns

namespace {

// Items [*first, *end) of value row `row` of a list column's chunk, bounds-checked.
inline void list_items(const ArrowColumnPlan& plan, const ArrowChunkView& v, int64_t row, int64_t* first,
                       int64_t* end) {
  if (!v.list.range(row, first, end))
    throw std::invalid_argument("Arrow column '" + plan.info.name + "': row " + std::to_string(v.row0 + row) +
                                " has offsets [" + std::to_string(*first) + ", " + std::to_string(*end) +
                                ") outside its values (a corrupt array?)");
}

std::vector<PackColumn> pack_columns_of(const std::vector<ArrowColumnPlan>& plans) {
  std::vector<PackColumn> out;
  for (const ArrowColumnPlan& p : plans) out.push_back(column_of(p.info.name, p.info.dtype, p.info.item_shape, p.item_bytes));
  return out;
}

void refuse_nulls(const ArrowTable& table, const std::vector<ArrowColumnPlan>& plans, const std::string& where) {
  for (const ArrowColumnPlan& p : plans) {
    const ArrowColumnInfo& info = table.column(p.info.name);
    if (info.first_null >= 0)
      throw std::invalid_argument("list column '" + p.info.name + "' holds nulls (the first at row " +
                                  std::to_string(info.first_null) + where +
                                  "): a packed document cannot be null; filter those rows out first");
  }
}

}  // namespace

std::vector<ArrowColumnPlan> arrow_list_plans(const ArrowTable& table, const std::vector<std::string>& names) {
  if (names.empty()) throw std::invalid_argument("a packer needs at least one column");
  std::vector<ArrowColumnPlan> plans;
  for (const std::string& name : names) {
    const ArrowColumnInfo& info = table.column(name);
    // A list of lists or a list of booleans (bit-packed) is not a run of tokens.
    const bool tokens = info.kind == ArrowKind::kList && info.unsupported.empty() && info.inner_lists == 0 &&
                        info.dtype.code != kBool;
    if (!tokens)
      throw std::invalid_argument("column '" + name + "' of type " + info.type +
                                  " is not a list column of numbers: fl.Pack packs list columns (token ids, "
                                  "labels); drop it with columns=[...]" +
                                  (info.unsupported.empty() ? "" : " (" + info.unsupported + ")"));
    ArrowColumnRequest request;
    request.name = name;
    request.pad = {std::byte{0}};
    plans.push_back(plan_arrow_column(table, std::move(request), /*check_nulls=*/false));
  }
  return plans;
}

ArrowDocuments::ArrowDocuments(std::shared_ptr<const ArrowTable> table, std::shared_ptr<const ArrowTable> indices,
                               std::vector<ArrowColumnPlan> plans)
    : table_(std::move(table)), indices_(std::move(indices)), plans_(std::move(plans)) {
  refuse_nulls(*table_, plans_, "");
  columns_ = pack_columns_of(plans_);
  for (const ArrowColumnPlan& p : plans_) {
    std::vector<ArrowChunkView> views;
    for (size_t c = 0; c < table_->num_chunks(); ++c) {
      views.push_back(arrow_chunk_view(*table_, c, p, table_->starts()[c]));
      if (views.back().indices) throw std::invalid_argument("list column '" + p.info.name + "' is dictionary-encoded");
    }
    views_.push_back(std::move(views));
  }
  size_ = table_->rows();
  if (indices_) {
    index_data_ = arrow_indices_data(*indices_, &index_dtype_);
    size_ = indices_->rows();
  }
}

int64_t ArrowDocuments::table_row(int64_t doc) const {
  if (!indices_) return doc;
  const std::vector<int64_t>& is = indices_->starts();
  const size_t c = arrow_chunk_of(is, doc);
  const int64_t row = read_arrow_index(index_data_[c], index_dtype_, doc - is[c]);
  if (row < 0 || row >= table_->rows())
    throw std::invalid_argument("the indices mapping sends document " + std::to_string(doc) + " to row " +
                                std::to_string(row) + " of a table of " + std::to_string(table_->rows()));
  return row;
}

void ArrowDocuments::lengths(size_t column, const int64_t* docs, int64_t n, int64_t* out) const {
  const ArrowColumnPlan& plan = plans_.at(column);
  const std::vector<ArrowChunkView>& views = views_[column];
  const std::vector<int64_t>& starts = table_->starts();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = table_row(docs[i]);
    const size_t c = arrow_chunk_of(starts, row);
    int64_t first, end;
    list_items(plan, views[c], row - starts[c], &first, &end);
    out[i] = end - first;
  }
}

void ArrowDocuments::copy(size_t column, const DocumentPiece* pieces, int64_t n, std::byte* dst) const {
  const ArrowColumnPlan& plan = plans_.at(column);
  const std::vector<ArrowChunkView>& views = views_[column];
  const std::vector<int64_t>& starts = table_->starts();
  const int64_t item = plan.item_bytes;
  for (int64_t i = 0; i < n; ++i) {
    const DocumentPiece& p = pieces[i];
    const int64_t row = table_row(p.doc);
    const size_t c = arrow_chunk_of(starts, row);
    int64_t first, end;
    list_items(plan, views[c], row - starts[c], &first, &end);
    if (end - first != p.length) unequal_lengths(p.doc, plan.info.name, end - first, columns_[0].name, p.length);
    if (p.count > 0)
      std::memcpy(dst + p.out * item, views[c].data + (first + p.start) * item, static_cast<size_t>(p.count * item));
  }
}

// ------------------------------------------------------------------ Parquet row groups

RowGroupDocuments::RowGroupDocuments(std::shared_ptr<RowGroupSource> source, std::vector<std::string> names,
                                     int threads)
    : source_(std::move(source)) {
  plans_ = arrow_list_plans(source_->schema_table(), names);
  columns_ = pack_columns_of(plans_);
  const std::vector<int64_t>& starts = source_->group_starts();
  size_ = starts.back();
  lengths_.assign(static_cast<size_t>(size_), 0);
  const int64_t groups = static_cast<int64_t>(starts.size()) - 1;
  std::atomic<int64_t> next{0};
  std::exception_ptr failure;
  std::mutex failure_mu;
  auto work = [&] {
    try {
      for (int64_t g; (g = next.fetch_add(1)) < groups;) {
        std::shared_ptr<const ArrowTable> table = source_->decoded_table(g);
        refuse_nulls(*table, plans_, " of " + source_->group_name(g));
        const std::vector<int64_t>& chunk_starts = table->starts();
        for (size_t k = 0; k < table->num_chunks(); ++k) {
          std::vector<ArrowChunkView> views;
          for (const ArrowColumnPlan& p : plans_)
            views.push_back(arrow_chunk_view(*table, k, p, starts[static_cast<size_t>(g)] + chunk_starts[k]));
          for (int64_t r = 0; r < chunk_starts[k + 1] - chunk_starts[k]; ++r) {
            const int64_t doc = starts[static_cast<size_t>(g)] + chunk_starts[k] + r;
            int64_t first, end, length = 0;
            for (size_t c = 0; c < plans_.size(); ++c) {
              list_items(plans_[c], views[c], r, &first, &end);
              if (c == 0) length = end - first;
              else if (end - first != length) unequal_lengths(doc, plans_[c].info.name, end - first, plans_[0].info.name, length);
            }
            if (length > int64_t{INT32_MAX})
              throw std::invalid_argument("document " + std::to_string(doc) + " has " + std::to_string(length) +
                                          " tokens, more than a packer reads (2**31 - 1)");
            lengths_[static_cast<size_t>(doc)] = static_cast<int32_t>(length);
          }
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
      next.store(groups);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

void RowGroupDocuments::lengths(size_t column, const int64_t* docs, int64_t n, int64_t* out) const {
  if (column != 0) throw std::logic_error("a Parquet packer keeps the first column's lengths only");
  for (int64_t i = 0; i < n; ++i) out[i] = lengths_[static_cast<size_t>(docs[i])];
}

void RowGroupDocuments::copy(size_t column, const DocumentPiece* pieces, int64_t n, std::byte* dst) const {
  const ArrowColumnPlan& plan = plans_.at(column);
  const std::vector<int64_t>& starts = source_->group_starts();
  const int64_t item = plan.item_bytes;
  // By row group, so that each group's table is fetched (or decoded) once per batch.
  std::vector<std::pair<int64_t, int64_t>> order(static_cast<size_t>(n));  // (group, piece)
  for (int64_t i = 0; i < n; ++i)
    order[static_cast<size_t>(i)] = {static_cast<int64_t>(arrow_chunk_of(starts, pieces[i].doc)), i};
  std::sort(order.begin(), order.end());
  std::shared_ptr<const ArrowTable> table;
  std::vector<ArrowChunkView> views;
  int64_t held = -1;
  for (const auto& [g, i] : order) {
    if (g != held) {
      table = source_->decoded_table(g);
      views.clear();
      for (size_t k = 0; k < table->num_chunks(); ++k)
        views.push_back(arrow_chunk_view(*table, k, plan, starts[static_cast<size_t>(g)] + table->starts()[k]));
      held = g;
    }
    const DocumentPiece& p = pieces[i];
    const int64_t local = p.doc - starts[static_cast<size_t>(g)];
    const size_t k = arrow_chunk_of(table->starts(), local);
    int64_t first, end;
    list_items(plan, views[k], local - table->starts()[k], &first, &end);
    if (end - first != p.length) unequal_lengths(p.doc, plan.info.name, end - first, columns_[0].name, p.length);
    if (p.count > 0)
      std::memcpy(dst + p.out * item, views[k].data + (first + p.start) * item, static_cast<size_t>(p.count * item));
  }
}

}  // namespace fastload
