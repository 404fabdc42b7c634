// fl.Pack's batch source; see pack_source.h.
#include "core/pack_source.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <numeric>
#include <stdexcept>
#include <thread>

#include "core/fork_guard.h"
#include "core/gather.h"
#include "core/pack_plan.h"

namespace fastload {

namespace {

constexpr DType kInt32Type{kInt, 32};

bool same_order(const SamplerConfig& a, const SamplerConfig& b) {
  return a.num_samples == b.num_samples && a.seed == b.seed && a.shuffle == b.shuffle && a.order == b.order &&
         a.block_size == b.block_size && a.window_shards == b.window_shards && a.shard_rows == b.shard_rows;
}

// One collation thread's memory for its batches, kept between them.
struct FillScratch {
  PackScratch pack;
  std::vector<DocumentPiece> pieces;
  std::vector<int64_t> used;                  // tokens of each row
  std::vector<const PackSegment*> first_segment;
  std::vector<int64_t> segments;              // segments of each row
  std::vector<std::shared_ptr<const PackedWindow>> held;
};

}  // namespace

int64_t PackSource::default_window(int64_t documents, int64_t nonempty, int64_t tokens, int64_t length) {
  constexpr int64_t kRows = 256, kLeast = 1024, kMost = 65536;
  const double mean = nonempty > 0 ? static_cast<double>(tokens) / static_cast<double>(nonempty) : 1.0;
  const double want = static_cast<double>(kRows) * static_cast<double>(length) / std::max(mean, 1.0);
  const int64_t window = std::clamp<int64_t>(static_cast<int64_t>(want) + 1, kLeast, kMost);
  return std::max<int64_t>(1, std::min(window, documents));
}

PackSource::PackSource(std::shared_ptr<const DocumentReader> docs, PackOptions options, int64_t window,
                       std::vector<std::vector<std::byte>> pads, bool with_documents, int threads)
    : docs_(std::move(docs)), options_(options), window_(window), with_documents_(with_documents),
      fork_generation_(fork_generation()) {
  options_.validate();
  if (window_ < 0) throw std::invalid_argument("window must be positive, got " + std::to_string(window_));
  const std::vector<PackColumn>& cols = docs_->columns();
  if (pads.size() != cols.size()) throw std::invalid_argument("a pad value per packed column is needed");
  for (size_t c = 0; c < cols.size(); ++c) {
    const PackColumn& col = cols[c];
    const int64_t element = std::max<int64_t>(1, col.dtype.bits / 8);
    if (static_cast<int64_t>(pads[c].size()) != element)
      throw std::invalid_argument("column '" + col.name + "': a pad of " + std::to_string(pads[c].size()) +
                                  " bytes for elements of " + std::to_string(element));
    std::vector<std::byte> item;
    for (int64_t k = 0; k < col.item_bytes / element; ++k) item.insert(item.end(), pads[c].begin(), pads[c].end());
    if (static_cast<int64_t>(item.size()) != col.item_bytes)
      throw std::invalid_argument("column '" + col.name + "': tokens of " + std::to_string(col.item_bytes) +
                                  " bytes are not whole elements");
    item_pads_.push_back(std::move(item));
    for (const char* ours : {kSegmentIdsName, kPositionIdsName, kCuSeqlensName, kDocumentsName})
      if (col.name == ours)
        throw std::invalid_argument("column '" + col.name + "' has a name fl.Pack gives its own part; rename it");
  }
  make_schema();
  scan_documents(threads);
  if (window_ == 0) window_ = default_window(scan_.documents, scan_.documents - scan_.empty, scan_.tokens, options_.length);
  scan_.window = window_;
}

PackSource::PackSource(const PackSource& base, bool with_documents)
    : docs_(base.docs_), options_(base.options_), window_(base.window_), item_pads_(base.item_pads_),
      with_documents_(with_documents), scan_(base.scan_), fork_generation_(fork_generation()) {
  make_schema();
}

void PackSource::make_schema() {
  const int64_t length = options_.length;
  schema_.clear();
  for (const PackColumn& col : docs_->columns()) {
    std::vector<int64_t> shape{length};
    shape.insert(shape.end(), col.item_shape.begin(), col.item_shape.end());
    schema_.push_back({col.name, col.dtype, shape, static_cast<size_t>(length * col.item_bytes)});
  }
  const int64_t bound = options_.segment_bound();
  cu_per_row_ = std::min(length, bound + 1) + 1;
  schema_.push_back({kSegmentIdsName, kInt32Type, {length}, static_cast<size_t>(length) * 4});
  schema_.push_back({kPositionIdsName, kInt64, {length}, static_cast<size_t>(length) * 8});
  schema_.push_back({kCuSeqlensName, kInt32Type, {cu_per_row_}, static_cast<size_t>(cu_per_row_) * 4});
  if (with_documents_) schema_.push_back({kDocumentsName, kInt64, {bound}, static_cast<size_t>(bound) * 8});
}

void PackSource::scan_documents(int threads) {
  const int64_t n = docs_->size();
  const size_t columns = docs_->columns().size();
  const bool check_columns = columns > 1 && docs_->checks_ahead();
  const int64_t length = options_.length;
  const int parts = static_cast<int>(std::clamp<int64_t>(threads, 1, std::max<int64_t>(1, n / 65536)));
  struct Found {
    PackScan scan;
    int64_t bad = -1;  // the first document that failed
    std::exception_ptr error;
  };
  std::vector<Found> found(static_cast<size_t>(parts));
  auto work = [&](int part) {
    Found& f = found[static_cast<size_t>(part)];
    const int64_t lo = n * part / parts, hi = n * (part + 1) / parts;
    constexpr int64_t kBlock = 4096;
    std::vector<int64_t> ids(kBlock), first(kBlock), other(kBlock);
    for (int64_t b = lo; b < hi; b += kBlock) {
      const int64_t m = std::min(kBlock, hi - b);
      std::iota(ids.begin(), ids.begin() + m, b);
      try {
        docs_->lengths(0, ids.data(), m, first.data());
        for (int64_t i = 0; i < m; ++i) {
          const int64_t len = first[static_cast<size_t>(i)];
          if (len == 0) ++f.scan.empty;
          if (len > length && options_.split == PackSplit::Error)
            throw std::invalid_argument("document " + std::to_string(b + i) + " has " + std::to_string(len) +
                                        " tokens, more than length=" + std::to_string(length) +
                                        " (split='error'; split='truncate' keeps its first tokens, split='split' "
                                        "carries the rest into further rows)");
          f.scan.tokens += options_.split == PackSplit::Truncate ? std::min(len, length) : len;
          f.scan.longest = std::max(f.scan.longest, len);
        }
        for (size_t c = 1; check_columns && c < columns; ++c) {
          docs_->lengths(c, ids.data(), m, other.data());
          for (int64_t i = 0; i < m; ++i)
            if (other[static_cast<size_t>(i)] != first[static_cast<size_t>(i)])
              unequal_lengths(b + i, docs_->columns()[c].name, other[static_cast<size_t>(i)],
                              docs_->columns()[0].name, first[static_cast<size_t>(i)]);
        }
      } catch (...) {
        f.bad = b;
        f.error = std::current_exception();
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  for (int p = 1; p < parts; ++p) pool.emplace_back(work, p);
  work(0);
  for (std::thread& t : pool) t.join();
  scan_.documents = n;
  for (const Found& f : found) {
    if (f.error) std::rethrow_exception(f.error);  // parts in document order: the first failure
    scan_.empty += f.scan.empty;
    scan_.tokens += f.scan.tokens;
    scan_.longest = std::max(scan_.longest, f.scan.longest);
  }
  if (scan_.tokens == 0)
    throw std::invalid_argument("every one of the " + std::to_string(n) + " documents is empty: nothing to pack");
}

std::shared_ptr<const EpochPacking> PackSource::epoch(const SamplerConfig& order, int64_t epoch, int threads) const {
  return plan_epoch(order, epoch, threads, nullptr);
}

std::shared_ptr<const EpochPacking> PackSource::plan_epoch(const SamplerConfig& order, int64_t epoch, int threads,
                                                           const std::atomic<bool>* cancel) const {
  std::promise<std::shared_ptr<const EpochPacking>> mine;
  std::shared_future<std::shared_ptr<const EpochPacking>> theirs;
  {
    std::lock_guard<std::mutex> lock(epochs_mu_);
    for (CachedEpoch& e : epochs_)
      if (e.epoch == epoch && same_order(e.order, order)) {
        e.used = ++epochs_clock_;
        theirs = e.packing;
        break;
      }
    if (!theirs.valid()) {
      CachedEpoch entry{order, epoch, mine.get_future().share(), ++epochs_clock_};
      if (epochs_.size() >= kCachedEpochs) {
        auto oldest = std::min_element(epochs_.begin(), epochs_.end(),
                                       [](const CachedEpoch& a, const CachedEpoch& b) { return a.used < b.used; });
        *oldest = std::move(entry);
      } else {
        epochs_.push_back(std::move(entry));
      }
    }
  }
  if (theirs.valid()) return theirs.get();
  try {
    auto packing = std::make_shared<const EpochPacking>(docs_, options_, window_, order, epoch, threads, cancel);
    mine.set_value(packing);
    return packing;
  } catch (...) {
    mine.set_exception(std::current_exception());
    std::lock_guard<std::mutex> lock(epochs_mu_);
    epochs_.erase(std::remove_if(epochs_.begin(), epochs_.end(),
                                 [&](const CachedEpoch& e) { return e.epoch == epoch && same_order(e.order, order); }),
                  epochs_.end());
    throw;
  }
}

void PackSource::plan_ahead(const SamplerConfig& order, int64_t epoch, int threads) const {
  {
    std::lock_guard<std::mutex> lock(epochs_mu_);
    for (const CachedEpoch& e : epochs_)
      if (e.epoch == epoch && same_order(e.order, order)) return;
  }
  std::lock_guard<std::mutex> lock(ahead_mu_);
  if (ahead_busy_.load()) return;
  if (ahead_.joinable()) ahead_.join();  // the last one, finished
  ahead_busy_ = true;
  ahead_ = std::thread([this, order, epoch, threads] {
    try {
      (void)plan_epoch(order, epoch, threads, &stopping_);
    } catch (...) {  // epoch() raises it again when the loader asks for this epoch
    }
    ahead_busy_ = false;
  });
}

PackSource::~PackSource() {
  stopping_ = true;  // a plan made ahead stops at its next run of windows
  std::lock_guard<std::mutex> lock(ahead_mu_);
  if (!ahead_.joinable()) return;
  if (fork_generation() != fork_generation_) {
    ahead_.detach();  // the parent's thread: nothing of it runs in this forked child
    return;
  }
  ahead_.join();
}

std::shared_ptr<const PackedWindow> PackSource::window_rows(const std::shared_ptr<const EpochPacking>& packing,
                                                            int64_t window) const {
  std::promise<std::shared_ptr<const PackedWindow>> mine;
  std::shared_future<std::shared_ptr<const PackedWindow>> theirs;
  {
    std::lock_guard<std::mutex> lock(windows_mu_);
    for (CachedWindow& w : windows_)
      if (w.window == window && w.packing == packing) {
        w.used = ++windows_clock_;
        theirs = w.rows;
        break;
      }
    if (!theirs.valid()) {
      CachedWindow entry{packing, window, mine.get_future().share(), ++windows_clock_};
      if (windows_.size() >= kCachedWindows) {
        auto oldest = std::min_element(windows_.begin(), windows_.end(),
                                       [](const CachedWindow& a, const CachedWindow& b) { return a.used < b.used; });
        *oldest = std::move(entry);
      } else {
        windows_.push_back(std::move(entry));
      }
    }
  }
  if (theirs.valid()) return theirs.get();  // laid out, or being laid out by another thread
  thread_local PackScratch scratch;
  try {
    auto rows = std::make_shared<PackedWindow>();
    packing->pack(window, scratch, *rows);
    mine.set_value(rows);
    return rows;
  } catch (...) {
    // The waiters get the error too; the entry goes, so that a later batch tries again.
    mine.set_exception(std::current_exception());
    std::lock_guard<std::mutex> lock(windows_mu_);
    windows_.erase(std::remove_if(windows_.begin(), windows_.end(),
                                  [&](const CachedWindow& w) { return w.window == window && w.packing == packing; }),
                   windows_.end());
    throw;
  }
}

void PackSource::fill(const FillRequest& r) {
  const auto* plan = dynamic_cast<const PackPlan*>(r.plan);
  if (!plan) throw std::logic_error("a packed source is read through a packing plan (fl.Loader over fl.Pack)");
  thread_local FillScratch s;
  const int64_t n = r.count, length = options_.length;
  s.pieces.clear();
  s.held.clear();
  s.used.assign(static_cast<size_t>(n), 0);
  s.first_segment.assign(static_cast<size_t>(n), nullptr);
  s.segments.assign(static_cast<size_t>(n), 0);
  // Each row's segments, and the pieces of every column to copy.
  const EpochPacking* last_packing = nullptr;
  int64_t last_window = -1;
  const PackedWindow* rows = nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const PackedRowRef ref = plan->locate(r.ids[i]);
    if (!ref.packing) continue;  // an empty row: padding of even=
    const auto [w, k] = ref.packing->locate(ref.row);
    if (ref.packing.get() != last_packing || w != last_window) {
      s.held.push_back(window_rows(ref.packing, w));
      rows = s.held.back().get();
      last_packing = ref.packing.get();
      last_window = w;
    }
    const int64_t a = rows->row_start[static_cast<size_t>(k)], b = rows->row_start[static_cast<size_t>(k) + 1];
    s.first_segment[static_cast<size_t>(i)] = rows->segments.data() + a;
    s.segments[static_cast<size_t>(i)] = b - a;
    int64_t at = 0;
    for (int64_t j = a; j < b; ++j) {
      const PackSegment& seg = rows->segments[static_cast<size_t>(j)];
      s.pieces.push_back({seg.doc, seg.start, seg.count, seg.doc_length, i * length + at});
      at += seg.count;
    }
    s.used[static_cast<size_t>(i)] = at;
  }
  const std::vector<PackColumn>& cols = docs_->columns();
  const int64_t pieces = static_cast<int64_t>(s.pieces.size());
  for (size_t c = 0; c < cols.size(); ++c) {
    std::byte* dst = r.parts[c];
    docs_->copy(c, s.pieces.data(), pieces, dst);
    const int64_t item = cols[c].item_bytes;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t used = s.used[static_cast<size_t>(i)];
      fill_pattern(dst + (i * length + used) * item, (length - used) * item, item_pads_[c]);
    }
  }
  auto* segment_ids = reinterpret_cast<int32_t*>(r.parts[cols.size()]);
  auto* position_ids = reinterpret_cast<int64_t*>(r.parts[cols.size() + 1]);
  auto* cu = reinterpret_cast<int32_t*>(r.parts[cols.size() + 2]);
  int64_t* documents = with_documents_ ? reinterpret_cast<int64_t*>(r.parts[cols.size() + 3]) : nullptr;
  const int64_t bound = options_.segment_bound();
  int64_t entries = 0, total = 0, longest = 0;
  cu[entries++] = 0;
  for (int64_t i = 0; i < n; ++i) {
    int32_t* seg_out = segment_ids + i * length;
    int64_t* pos_out = position_ids + i * length;
    const PackSegment* segs = s.first_segment[static_cast<size_t>(i)];
    const int64_t count = s.segments[static_cast<size_t>(i)];
    int64_t at = 0;
    for (int64_t j = 0; j < count; ++j) {
      const int64_t len = segs[j].count;
      std::fill(seg_out + at, seg_out + at + len, static_cast<int32_t>(j + 1));
      for (int64_t t = 0; t < len; ++t) pos_out[at + t] = t;
      at += len;
      total += len;
      cu[entries++] = static_cast<int32_t>(total);
      longest = std::max(longest, len);
    }
    if (at < length) {  // the row's padding: one more segment
      std::fill(seg_out + at, seg_out + length, 0);
      for (int64_t t = 0; t < length - at; ++t) pos_out[at + t] = t;
      total += length - at;
      cu[entries++] = static_cast<int32_t>(total);
      longest = std::max(longest, length - at);
    }
    if (documents) {
      int64_t* d = documents + i * bound;
      for (int64_t j = 0; j < count; ++j) d[j] = segs[j].doc;
      std::fill(d + count, d + bound, int64_t{-1});
    }
  }
  if (r.extras) *r.extras = std::make_shared<PackedBatchInfo>(PackedBatchInfo{entries, longest});
}

}  // namespace fastload
