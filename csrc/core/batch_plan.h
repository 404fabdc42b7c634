// What the pipeline asks of a plan: how many batches an output has and which sample ids each
// holds. EpochPlan (sampler.h) is one epoch of one source; StreamPlan (stream_plan.h) is a range
// of global steps of an endless stream over one source or a weighted mixture of several.
#pragma once
#include <cstdint>
#include <memory>

namespace fastload {

// One collation thread's own state for one plan (BatchPlan::cursor()): what it worked out for
// its last batch, so that its next batch, usually a few steps on, starts from there with no lock
// and no counter shared with the other threads.
class BatchPlan;
class PlanCursor {
 public:
  explicit PlanCursor(const BatchPlan* owner) : owner_(owner) {}
  virtual ~PlanCursor() = default;
  const BatchPlan* owner() const { return owner_; }  // a plan reads only its own cursors

 private:
  const BatchPlan* owner_;
};

// Where a plan writes one batch's rows; null pointers are parts the batch does not have.
struct BatchRows {
  int64_t* ids = nullptr;      // the sample id of every row (what the source reads); null only
                               // with local_ids, when nothing reads the ids (see Pipeline::build)
  bool* valid = nullptr;       // even="mask": false on padding
  int64_t* sources = nullptr;  // a mixture's source index of every row
  int64_t* local_ids = nullptr;  // a mixture's: each row's id within its own source
  // A mixture's: where each source's rows start (num_sources() + 1 entries, the last = rows).
  int64_t* source_rows = nullptr;
  // A stream's (fills_epochs()): each row's epoch of its own source (which pass over that source
  // the row's sample comes from), when asked.
  int64_t* epochs = nullptr;
  // The filling thread's cursor from this plan's cursor(), or null (then fill() starts afresh).
  PlanCursor* cursor = nullptr;
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
  // Whether fill() writes BatchRows::sources, local_ids and source_rows when asked (rows grouped
  // by source, in source order), so that a mixed source need not work them out from the ids.
  virtual bool fills_sources() const { return false; }
  // Whether fill() writes BatchRows::epochs when asked (a stream: each source has its own epochs).
  virtual bool fills_epochs() const { return false; }
  // A new cursor for one thread's fill() calls (BatchRows::cursor), or null if the plan has no
  // use for one. fill() gives the same rows with or without it.
  virtual std::unique_ptr<PlanCursor> cursor() const { return nullptr; }
  virtual void add_source_rows(int64_t /*batch*/, int64_t* /*counts*/) const {}
};

}  // namespace fastload
