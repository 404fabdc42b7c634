// Several sources of one schema as one: ids are laid end to end (child j's sample i is id
// offset_j + i). A batch's rows come grouped by source (stream_plan.h), so a fill is one child
// fill per run of rows, each writing straight into its rows of the batch's parts.
#pragma once
#include <memory>
#include <vector>

#include "core/batch_source.h"

namespace fastload {

class MixSource final : public BatchSource {
 public:
  // Throws std::invalid_argument if the children disagree on their parts (names, dtypes, row
  // shapes or bytes), naming the child and the part; children must not attach extras.
  explicit MixSource(std::vector<std::shared_ptr<BatchSource>> children);
  const std::vector<PartSchema>& schema() const override { return schema_; }
  int64_t size() const override { return offsets_.back(); }
  void fill(const FillRequest& request) override;
  const std::vector<int64_t>& offsets() const { return offsets_; }  // children + 1 entries

 private:
  int child_of(int64_t id) const;

  std::vector<std::shared_ptr<BatchSource>> children_;
  std::vector<PartSchema> schema_;
  std::vector<int64_t> offsets_;
};

}  // namespace fastload
