// What the pipeline asks of a plan: how many batches an output has and which sample ids each
// holds. EpochPlan (sampler.h) is one epoch of one source; StreamPlan (stream_plan.h) is a range
// of global steps of an endless stream over one source or a weighted mixture of several.
#pragma once
#include <cstdint>

namespace fastload {

// Where a plan writes one batch's rows; null pointers are parts the batch does not have.
struct BatchRows {
  int64_t* ids = nullptr;      // the sample id of every row (what the source reads); null only
                               // with local_ids, when nothing reads the ids (see Pipeline::build)
  bool* valid = nullptr;       // even="mask": false on padding
  int64_t* sources = nullptr;  // a mixture's source index of every row
  int64_t* local_ids = nullptr;  // a mixture's: each row's id within its own source
};

class BatchPlan {
 public:
  virtual ~BatchPlan() = default;
  virtual int64_t num_batches() const = 0;
  virtual int64_t max_batch_rows() const = 0;
  // The loader's epoch this plan runs (error messages, the Python Epoch object).
  virtual int64_t epoch() const = 0;
  virtual uint64_t seed() const = 0;
  virtual int64_t rows(int64_t batch) const = 0;
  // Writes batch `batch`'s rows; returns how many (rows(batch)).
  virtual int64_t fill(int64_t batch, const BatchRows& out) const = 0;
  // The epoch word of the batch's per-sample randomness (FillRequest::epoch, sample_rng).
  virtual int64_t sample_epoch(int64_t /*batch*/) const { return epoch(); }
  // Where the next run resumes after this output handed out `batches_done` batches: a global
  // sample position (EpochPlan) or a global step (StreamPlan).
  virtual int64_t position_after(int64_t batches_done) const = 0;
  // A mixture's sources (1 otherwise), and the rows of each in a batch (added to counts[j]).
  virtual int num_sources() const { return 1; }
  // Whether fill() writes BatchRows::sources and local_ids when asked (rows grouped by source,
  // in source order), so that a mixed source need not work them out from the ids.
  virtual bool fills_sources() const { return false; }
  virtual void add_source_rows(int64_t /*batch*/, int64_t* /*counts*/) const {}
};

}  // namespace fastload
