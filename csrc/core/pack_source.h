// fl.Pack's batch source: packed rows of `length` tokens, written straight into the batch by the
// collation threads. A batch's ids are packed rows that its plan resolves (pack_plan.h); each
// row's segments come from its window's layout (recomputed from the lengths, kept in a small
// cache shared by the threads), and each column's pieces are copied by the document reader
// (pack_documents.h). Parts, in order:
//   each packed column      (length, *item_shape)  its dtype; pad past the row's last segment
//   segment_ids             (length,) int32   1, 2, ... per segment of the row, 0 on padding
//   position_ids            (length,) int64   0, 1, ... from each segment's start (padding: one more)
//   cu_seqlens              (C,) int32        the batch's segment boundaries over its flattened
//                                             rows x length tokens, each row's padding one more
//                                             segment; the batch's first `entries` values of
//                                             the part's flat buffer (C per row leaves room)
//   documents (with_documents)  (S,) int64    the document of each segment of the row, -1 after
// A batch's extras (PackedBatchInfo) say how many cu_seqlens entries it has and its longest
// segment, which the bindings hand out as a 1-D cu_seqlens and a Python int max_seqlen.
#pragma once
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/batch_source.h"
#include "core/pack_epoch.h"

namespace fastload {

inline const char* const kSegmentIdsName = "segment_ids";
inline const char* const kPositionIdsName = "position_ids";
inline const char* const kCuSeqlensName = "cu_seqlens";
inline const char* const kDocumentsName = "documents";

// What a packed batch carries besides its parts (FillRequest::extras).
struct PackedBatchInfo {
  int64_t cu_entries = 0;  // cu_seqlens values of this batch (segments + 1)
  int64_t max_seqlen = 0;  // its longest segment (padding segments included)
};

// What a packer found in its documents when it was made (every epoch packs the same documents).
struct PackScan {
  int64_t documents = 0;
  int64_t empty = 0;
  int64_t tokens = 0;     // tokens an epoch places (after truncation)
  int64_t longest = 0;    // the longest document
  int64_t window = 0;     // the window in use
};

class PackSource final : public BatchSource {
 public:
  // pads[c]: one element of column c (its dtype's bytes). window 0: the default (see
  // default_window). Reads every document's length once (and, where the reader allows, checks
  // that the columns agree on each; `threads` read side by side). Throws std::invalid_argument for
  // bad options, a pad of the wrong size, a clash with the parts it adds, a document longer than
  // length with split="error", unequal lengths, or documents that are all empty.
  PackSource(std::shared_ptr<const DocumentReader> docs, PackOptions options, int64_t window,
             std::vector<std::vector<std::byte>> pads, bool with_documents, int threads);

  // `base`'s packer (its reader, options, window and scan) with or without the documents part.
  PackSource(const PackSource& base, bool with_documents);

  const std::vector<PartSchema>& schema() const override { return schema_; }
  int64_t size() const override { return docs_->size(); }  // documents
  void fill(const FillRequest& request) override;

  ~PackSource() override;

  // Epoch `epoch`'s packing with the documents ordered by `order` (the loader's sampler
  // settings, num_samples = documents): planned on `threads` threads, or the cached one (or the
  // one being planned, waited for).
  std::shared_ptr<const EpochPacking> epoch(const SamplerConfig& order, int64_t epoch, int threads) const;
  // Plans epoch `epoch` on a thread of its own unless it is cached, being planned, or another
  // epoch is being planned ahead: a loader asks for the next epoch's plan while this one runs, so
  // that the next epoch starts without the wait. Errors wait for the epoch() that asks again.
  void plan_ahead(const SamplerConfig& order, int64_t epoch, int threads) const;
  const PackOptions& options() const { return options_; }
  const PackScan& scan() const { return scan_; }
  const DocumentReader& documents() const { return *docs_; }
  int64_t cu_seqlens_per_row() const { return cu_per_row_; }

  // The default window: enough documents for 256 rows' worth of tokens on average (`tokens` over
  // `nonempty` documents; best-fit decreasing over ~256 rows leaves about 0.25% padding on
  // lognormal lengths, bench/bench_packing.py), at least 1024 and at most 65536, and at most all
  // `documents`.
  static int64_t default_window(int64_t documents, int64_t nonempty, int64_t tokens, int64_t length);

 private:
  struct CachedWindow {
    std::shared_ptr<const EpochPacking> packing;
    int64_t window = -1;
    // Laid out by the first thread that asked; the others wait for it rather than lay it out too
    // (consecutive batches read the same window, one per collation thread).
    std::shared_future<std::shared_ptr<const PackedWindow>> rows;
    uint64_t used = 0;
  };
  struct CachedEpoch {
    SamplerConfig order;
    int64_t epoch = -1;
    std::shared_future<std::shared_ptr<const EpochPacking>> packing;  // planned, or being planned
    uint64_t used = 0;
  };
  std::shared_ptr<const PackedWindow> window_rows(const std::shared_ptr<const EpochPacking>& packing,
                                                  int64_t window) const;
  std::shared_ptr<const EpochPacking> plan_epoch(const SamplerConfig& order, int64_t epoch, int threads,
                                                 const std::atomic<bool>* cancel) const;
  void scan_documents(int threads);
  void make_schema();

  std::shared_ptr<const DocumentReader> docs_;
  PackOptions options_;
  int64_t window_ = 0;
  std::vector<std::vector<std::byte>> item_pads_;  // per column: one token's bytes
  bool with_documents_ = false;
  int64_t cu_per_row_ = 0;
  std::vector<PartSchema> schema_;
  PackScan scan_;

  static constexpr size_t kCachedWindows = 32;
  static constexpr size_t kCachedEpochs = 3;
  mutable std::mutex windows_mu_;
  mutable std::vector<CachedWindow> windows_;
  mutable uint64_t windows_clock_ = 0;
  mutable std::mutex epochs_mu_;
  mutable std::vector<CachedEpoch> epochs_;
  mutable uint64_t epochs_clock_ = 0;
  mutable std::mutex ahead_mu_;
  mutable std::thread ahead_;               // the epoch planned ahead (one at a time)
  mutable std::atomic<bool> ahead_busy_{false};
  std::atomic<bool> stopping_{false};  // the source is going: a plan made ahead stops
  uint64_t fork_generation_ = 0;
};

}  // namespace fastload
