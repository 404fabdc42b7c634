// Several sources of one schema as one: ids are laid end to end (child j's sample i is id
// offset_j + i). A batch's rows come grouped by source (stream_plan.h), so a fill is one child
// fill per run of rows, each writing straight into its rows of the batch's parts. A stream plan
// hands over where each source's rows start and each row's local id (FillRequest::source_rows and
// local_ids); other ids are split and translated here. When every child is
// an array of strided fixed-size columns, a batch split by the plan is gathered part by part in
// one pass over its rows (each row's address from its source's column), not one fill per run.
// A child that reads the plan ahead (a Parquet source decoding the row groups of the batches to
// come) is handed a view of the plan that gives its own rows of each batch, as its own ids.
#pragma once
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/arrow_source.h"
#include "core/batch_source.h"

namespace fastload {

class MixSource final : public BatchSource {
 public:
  // Throws std::invalid_argument if the children disagree on their parts (names, dtypes, row
  // shapes or bytes), naming the child and the part, or on whether they give string columns as
  // lists (the only extras a child may attach: a batch's are its runs' lists end to end).
  explicit MixSource(std::vector<std::shared_ptr<BatchSource>> children);
  const std::vector<PartSchema>& schema() const override { return schema_; }
  int64_t size() const override { return offsets_.back(); }
  void fill(const FillRequest& request) override;
  bool wants_sources() const override { return true; }
  bool wants_source_epochs() const override { return source_epochs_; }
  bool has_string_lists() const override { return string_lists_; }
  bool reads_plan_ahead() const override { return reads_plan_ahead_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }  // children + 1 entries

 private:
  // Part p of child j: row i at base[j] + i * pitch[j].
  struct StridedPart {
    std::vector<const std::byte*> base;
    std::vector<int64_t> pitch;
  };
  int child_of(int64_t id) const;
  // Fills rows [first, first + count) from one child; its string lists (if any) go after `lists`'.
  void fill_run(const FillRequest& r, int child, int64_t first, int64_t count, const int64_t* local_ids,
                std::byte** part_ptrs, ArrowStringLists* lists);
  // The plan's split (source_rows, local_ids) over strided children: one gather per part.
  void fill_strided(const FillRequest& r);
  [[noreturn]] void bad_split(const FillRequest& r) const;  // names what is wrong with source_rows
  // Child j's view of `plan` (see ChildPlan in mix_source.cpp), made once per plan and child, for
  // children that read the plan ahead. The caller holds the returned pointer while its child
  // fills; the last few views are kept.
  std::shared_ptr<const BatchPlan> child_plan(const BatchPlan* plan, int child);

  std::vector<std::shared_ptr<BatchSource>> children_;
  std::vector<PartSchema> schema_;
  std::vector<int64_t> offsets_;
  std::vector<StridedPart> strided_;  // one per part; empty unless every child is strided arrays
  bool string_lists_ = false;
  bool source_epochs_ = false;   // some child reads FillRequest::source_epochs
  bool reads_plan_ahead_ = false;  // some child does: fill_run hands it a view of the plan
  std::mutex child_plans_mu_;
  std::vector<std::pair<std::pair<const BatchPlan*, int>, std::shared_ptr<const BatchPlan>>> child_plans_;
};

}  // namespace fastload
