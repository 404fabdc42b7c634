// A table whose chunks must be decoded before any of their rows is read (Parquet row groups): the
// chunks are shards, decoded into a bounded cache of decoded chunks, and gathered from there as an
// ArrowSource gathers. The core knows nothing of the file format: a callback (from the bindings)
// decodes.
//
// Decoding ahead: the batch being filled names its plan (FillRequest::plan), and the plan is a
// pure function of the step, so the groups of the batches to come are known. The collation
// threads read the plan ahead of themselves and queue the groups not cached yet, in the order the
// batches need them, for the source's own decode threads, which decode them while the collation
// threads gather. A group decoded ahead stays cached until a batch has read it; how far ahead the
// plan is read is bounded by the budget. A collation thread that reaches a group nobody decoded
// yet decodes it itself, as without the decode threads.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/arrow_source.h"

namespace fastload {

class BatchPlan;

class RowGroupSource final : public BatchSource, public std::enable_shared_from_this<RowGroupSource> {
 public:
  // Decodes group g into a table of the schema's columns; sets *bytes to what it holds. May throw.
  // Called from the collation threads and the decode threads, several at once.
  using Decode = std::function<std::shared_ptr<ArrowTable>(int64_t group, int64_t* bytes)>;

  // `schema` is a table (of no rows) with the groups' schema; group_rows[g] the rows of group g
  // (its ids follow the previous groups'); group_names name them in messages. Decoded groups are
  // kept while they fit in budget_bytes, and at least min_groups (the groups an order has in play
  // at once: order="block"'s window) plus two per collation thread are kept anyway.
  // decode_threads (0: none) decode ahead; they start with the first batch that names its plan.
  // Throws std::invalid_argument as plan_arrow_column does.
  RowGroupSource(std::shared_ptr<const ArrowTable> schema, std::vector<ArrowColumnRequest> columns,
                 std::vector<int64_t> group_rows, std::vector<std::string> group_names, Decode decode,
                 int64_t budget_bytes, int min_groups, int decode_threads = 0);
  ~RowGroupSource() override;
  const std::vector<PartSchema>& schema() const override { return parts_; }
  int64_t size() const override { return starts_.back(); }
  bool has_string_lists() const override { return !string_plans_.empty(); }
  bool wants_source_epochs() const override { return decoded_; }  // an image column keys crops by them
  bool reads_plan_ahead() const override { return ahead_threads_ > 0; }
  void fill(const FillRequest& request) override;

  // Stops and joins the decode threads (each finishes the group it decodes); none start again.
  // The caller must not hold what a decode needs (the bindings: the GIL).
  void stop_decoding();
  int decode_threads() const { return ahead_threads_; }
  int64_t decodes() const { return decodes_.load(); }  // groups decoded so far (a group again after eviction counts again)
  int64_t decoded_ahead() const { return decoded_ahead_.load(); }  // of which by the decode threads
  int64_t cached_bytes() const;

  // For readers other than fill() (a packer reads documents by token range): group g's decoded
  // table from the cache, decoded now if it is not there; the pointer keeps it alive. Throws as
  // the decode does.
  std::shared_ptr<const ArrowTable> decoded_table(int64_t group);
  const std::vector<int64_t>& group_starts() const { return starts_; }  // group g: [starts[g], starts[g + 1])
  const ArrowTable& schema_table() const { return *schema_table_; }
  const std::string& group_name(int64_t group) const { return names_.at(static_cast<size_t>(group)); }

 private:
  struct Decoded {
    std::shared_ptr<ArrowTable> table;
    std::vector<std::vector<ArrowChunkView>> views;  // [column][chunk of the decoded table]
  };
  using Promise = std::promise<std::shared_ptr<const Decoded>>;
  struct Entry {
    std::shared_future<std::shared_ptr<const Decoded>> ready;
    int64_t bytes = 0;
    uint64_t used = 0;
    bool done = false;
    bool unread = false;  // decoded ahead, and no batch has asked for it yet: not evicted
  };
  // The decode threads' queue; shared with them, so that a thread finishing a decode may be the
  // last owner of the source (it then lets the source go and leaves).
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<int64_t> groups;
    std::unordered_set<int64_t> queued;
    bool stop = false;
  };

  // Claims a group no thread has claimed yet and decodes it, one at a time, then waits for the
  // others' decodes: threads that need the same few groups (a block window's) decode them in
  // parallel, the decode threads among them.
  void acquire(const std::vector<int64_t>& groups, std::vector<std::shared_ptr<const Decoded>>& out);
  // Under mu_: a new entry for group g, claimed by the caller, who must keep `promise`.
  void claim_locked(int64_t g, Promise& promise, bool ahead);
  // Decodes claimed groups into their promises; on a failure the group and those after it fail alike.
  void decode_claimed(std::vector<std::pair<int64_t, Promise>>& claimed);
  std::shared_ptr<const Decoded> decode(int64_t group);
  void evict_locked(int64_t keep);
  // Reads the plan past the request's step and queues the groups to come (one thread at a time).
  void read_ahead(const FillRequest& r);
  int64_t allowed_ahead() const;  // how many groups may wait decoded (or queued) ahead
  bool room_ahead() const;
  void start_decode_threads();
  static void decode_loop(std::weak_ptr<RowGroupSource> source, std::shared_ptr<Queue> queue);
  void decode_ahead(int64_t group);

  std::shared_ptr<const ArrowTable> schema_table_;
  std::vector<ArrowColumnPlan> columns_;
  std::vector<const ArrowColumnPlan*> plans_, string_plans_;  // into columns_
  bool decoded_ = false;  // some column is decoded per row (decode=)
  std::vector<PartSchema> parts_;
  std::vector<int64_t> starts_{0};
  std::vector<std::string> names_;
  Decode decode_;
  int64_t budget_ = 0;
  int min_groups_ = 0;
  mutable std::mutex mu_;
  std::unordered_map<int64_t, Entry> cache_;
  int64_t cached_ = 0;
  int64_t unread_ = 0;  // entries decoded (or decoding) ahead that no batch has read yet
  uint64_t clock_ = 0;
  std::atomic<int> threads_{1};
  std::atomic<int64_t> decodes_{0}, decoded_ahead_{0}, decoded_bytes_{0};

  // Decoding ahead.
  const int ahead_threads_;
  const uint64_t fork_generation_;
  std::shared_ptr<Queue> queue_ = std::make_shared<Queue>();
  std::mutex threads_mu_;
  std::vector<std::unique_ptr<std::thread>> decoders_;  // started once; leaked in a forked child
  bool stopped_ = false;
  std::mutex scan_mu_;  // the reader of the plan (one collation thread at a time; others skip)
  const BatchPlan* scan_plan_ = nullptr;
  int64_t scan_epoch_ = -1, scan_step_ = 0;
  std::vector<int64_t> scan_ids_;
};

}  // namespace fastload
