// The seam between the pipeline and where samples come from. A source says which parts it fills
// (its schema) and fills the rows of a batch for a list of sample ids; the sampler, the pipeline,
// the buffers and the transfer engine know nothing else about it. Arrays in memory or on disk
// are ArraySource (array_source.h); a Python dataset is a source that lives in the bindings
// (it needs the interpreter), as torchcodec keeps its Python file reader out of its core.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace fastload {

class BatchPlan;

// One part of a batch that a source fills: `row_bytes` bytes per sample, typed as `dtype` with
// `row_shape` per sample (row_bytes == product(row_shape) * bits / 8).
struct PartSchema {
  std::string name;
  DType dtype;
  std::vector<int64_t> row_shape;
  size_t row_bytes = 0;
};

// One batch to fill: rows [0, count) of every part of the source's schema, for the sample ids
// given in order (null for a source that wants_sources(), when local_ids and source_rows are
// given). Several collation threads fill different batches at the same time.
struct FillRequest {
  const int64_t* ids = nullptr;
  int64_t count = 0;
  std::byte* const* parts = nullptr;  // the source's parts, in schema order
  uint64_t seed = 0;                  // the loader's seed (per-sample randomness derives from it)
  int64_t epoch = 0;
  int64_t step = 0;                   // the batch's step in its output
  int thread = 0;                     // the collation thread filling it, in [0, num_threads)
  // What the batch carries besides its parts (a Python source's non-array fields); the core
  // only moves it along with the batch.
  std::shared_ptr<void>* extras = nullptr;
  // For a source that wants_sources(), when the plan knows them (rows grouped by source, in
  // source order): each row's id within its source, and where each source's rows start
  // (num_sources + 1 entries, the last = count). Null otherwise.
  const int64_t* local_ids = nullptr;
  const int64_t* source_rows = nullptr;
  int num_sources = 0;
  // The plan the ids come from (the batch is its step `step`), for a source that reads ahead
  // (the row groups of the batches to come). A mixture hands such a child a view of its plan
  // whose ids are the child's own (mix_source.cpp); null for children that do not read it.
  const BatchPlan* plan = nullptr;
  // For a source that wants_source_epochs(), when the plan is a stream (steps=, fl.Mix): each
  // row's epoch of its own source; null otherwise (every row's is `epoch`). A decode stage keys
  // its crops by it, so that a sample's crop does not depend on the mixture around it.
  const int64_t* source_epochs = nullptr;
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual const std::vector<PartSchema>& schema() const = 0;
  virtual int64_t size() const = 0;  // samples; ids are in [0, size())
  // A mixture of sources reads FillRequest::local_ids and source_rows when the plan provides them.
  virtual bool wants_sources() const { return false; }
  // Whether it reads FillRequest::plan ahead of the batch it fills (a row-group source with
  // decode threads): a mixture makes a view of its plan only for children that do.
  virtual bool reads_plan_ahead() const { return false; }
  // Whether its batches carry string columns as lists (FillRequest::extras holds an
  // ArrowStringLists, arrow_source.h): the bindings turn them into Python lists.
  virtual bool has_string_lists() const { return false; }
  // Whether it reads FillRequest::source_epochs (per-sample randomness keyed by the source's own
  // epoch: an image decode stage).
  virtual bool wants_source_epochs() const { return false; }
  // Throws to fail the batch: the pipeline reports it with the batch and epoch, keeping the
  // original exception.
  virtual void fill(const FillRequest& request) = 0;
};

}  // namespace fastload
