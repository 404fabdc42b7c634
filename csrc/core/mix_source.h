// Several sources of one schema as one: ids are laid end to end (child j's sample i is id
// offset_j + i). A batch's rows come grouped by source (stream_plan.h), so a fill is one child
// fill per run of rows, each writing straight into its rows of the batch's parts. A stream plan
// hands over where each source's rows start and each row's local id (FillRequest::source_rows and
// local_ids); other ids are split and translated here. When every child is
// an array of strided fixed-size columns, a batch split by the plan is gathered part by part in
// one pass over its rows (each row's address from its source's column), not one fill per run.
#pragma once
#include <memory>
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
  bool has_string_lists() const override { return string_lists_; }
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

  std::vector<std::shared_ptr<BatchSource>> children_;
  std::vector<PartSchema> schema_;
  std::vector<int64_t> offsets_;
  std::vector<StridedPart> strided_;  // one per part; empty unless every child is strided arrays
  bool string_lists_ = false;
};

}  // namespace fastload
