// One epoch's packing plan: the documents in the epoch's order (the loader's Ordering of them:
// shuffle, order, seed, as for any source), cut into windows of `window` consecutive documents,
// each window packed alone (packing_plan.h). The epoch's rows are the windows' rows in window
// order. Made once per epoch by packing every window to count its rows (O(documents) time on
// `threads` threads, O(windows) memory: the first row of each window); a window's rows are laid
// out again, from the lengths, when a batch reads them. A pure function of (lengths, options,
// window, the order's configuration, epoch): world size, rank and threads never change it.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/pack_documents.h"
#include "core/packing_plan.h"
#include "core/sampler.h"

namespace fastload {

struct PackCancelled : std::runtime_error {
  PackCancelled() : std::runtime_error("the epoch's packing was cancelled") {}
};

// What an epoch's packing holds (all ranks together, padding rows of even= not counted).
struct PackTotals {
  int64_t documents = 0;
  int64_t empty = 0;      // empty documents skipped
  int64_t rows = 0;
  int64_t tokens = 0;     // tokens placed (not padding)
  int64_t truncated = 0;  // tokens cut (split="truncate")
  int64_t longest = 0;    // the longest segment
  double seconds = 0.0;   // wall time it took to plan
};

class EpochPacking {
 public:
  // `order`: the loader's sampler settings for the documents (num_samples = documents; the batch
  // geometry is ignored). Throws std::invalid_argument as pack_window does, or PackCancelled once
  // *cancel is set (a plan made ahead whose source goes away).
  EpochPacking(std::shared_ptr<const DocumentReader> docs, const PackOptions& options, int64_t window,
               const SamplerConfig& order, int64_t epoch, int threads, const std::atomic<bool>* cancel = nullptr);

  int64_t epoch() const { return epoch_; }
  int64_t rows() const { return first_row_.back(); }
  int64_t num_windows() const { return static_cast<int64_t>(first_row_.size()) - 1; }
  int64_t first_row(int64_t window) const { return first_row_[static_cast<size_t>(window)]; }
  // (window, row within it) of row `row` in [0, rows()).
  std::pair<int64_t, int64_t> locate(int64_t row) const;
  // Window w's rows laid out.
  void pack(int64_t window, PackScratch& scratch, PackedWindow& out) const;
  const PackTotals& totals() const { return totals_; }
  const PackOptions& options() const { return options_; }

 private:
  void window_documents(int64_t w, std::vector<int64_t>& docs, std::vector<int64_t>& lengths) const;

  std::shared_ptr<const DocumentReader> docs_;
  PackOptions options_;
  int64_t window_, epoch_;
  Ordering ordering_;
  std::vector<int64_t> first_row_;  // num_windows + 1 entries
  PackTotals totals_;
};

}  // namespace fastload
