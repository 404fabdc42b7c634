// A table whose chunks must be decoded before any of their rows is read (Parquet row groups): the
// chunks are shards, decoded on demand by the collation threads through a callback into a
// bounded cache of decoded chunks, and gathered from there as an ArrowSource gathers. The
// core knows nothing of the file format: the callback (from the bindings) decodes.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/arrow_source.h"

namespace fastload {

class RowGroupSource final : public BatchSource {
 public:
  // Decodes group g into a table of the schema's columns; sets *bytes to what it holds. May throw.
  using Decode = std::function<std::shared_ptr<ArrowTable>(int64_t group, int64_t* bytes)>;

  // `schema` is a table (of no rows) with the groups' schema; group_rows[g] the rows of group g
  // (its ids follow the previous groups'); group_names name them in messages. Decoded groups are
  // kept while they fit in budget_bytes, and at least min_groups (the groups an order has in play
  // at once: order="block"'s window) plus two per collation thread are kept anyway.
  // Throws std::invalid_argument as plan_arrow_column does.
  RowGroupSource(std::shared_ptr<const ArrowTable> schema, std::vector<ArrowColumnRequest> columns,
                 std::vector<int64_t> group_rows, std::vector<std::string> group_names, Decode decode,
                 int64_t budget_bytes, int min_groups);
  const std::vector<PartSchema>& schema() const override { return parts_; }
  int64_t size() const override { return starts_.back(); }
  bool has_string_lists() const { return !string_plans_.empty(); }
  void fill(const FillRequest& request) override;

  int64_t decodes() const { return decodes_.load(); }  // groups decoded so far (a group again after eviction counts again)
  int64_t cached_bytes() const;

 private:
  struct Decoded {
    std::shared_ptr<ArrowTable> table;
    std::vector<std::vector<ArrowChunkView>> views;  // [column][chunk of the decoded table]
  };
  struct Entry {
    std::shared_future<std::shared_ptr<const Decoded>> ready;
    int64_t bytes = 0;
    uint64_t used = 0;
    bool done = false;
  };
  // Claims the groups no thread has claimed yet and decodes them, then waits for the others'
  // decodes: threads that need the same few groups (a block window's) decode them in parallel.
  void acquire(const std::vector<int64_t>& groups, std::vector<std::shared_ptr<const Decoded>>& out);
  std::shared_ptr<const Decoded> decode(int64_t group);
  void evict_locked(int64_t keep);

  std::shared_ptr<const ArrowTable> schema_table_;
  std::vector<ArrowColumnPlan> columns_;
  std::vector<const ArrowColumnPlan*> string_plans_;
  std::vector<PartSchema> parts_;
  std::vector<int64_t> starts_{0};
  std::vector<std::string> names_;
  Decode decode_;
  int64_t budget_ = 0;
  int min_groups_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<int64_t, Entry> cache_;
  int64_t cached_ = 0;
  uint64_t clock_ = 0;
  std::atomic<int> threads_{1};
  std::atomic<int64_t> decodes_{0};
};

}  // namespace fastload
