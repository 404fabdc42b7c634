// An epoch's packing plan; see pack_epoch.h.
#include "core/pack_epoch.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace fastload {

EpochPacking::EpochPacking(std::shared_ptr<const DocumentReader> docs, const PackOptions& options, int64_t window,
                           const SamplerConfig& order, int64_t epoch, int threads, const std::atomic<bool>* cancel)
    : docs_(std::move(docs)), options_(options), window_(window), epoch_(epoch), ordering_(order, epoch) {
  const auto began = std::chrono::steady_clock::now();
  options_.validate();
  if (window_ <= 0) throw std::invalid_argument("window must be positive, got " + std::to_string(window_));
  const int64_t n = ordering_.size();
  if (n != docs_->size())
    throw std::invalid_argument("the order covers " + std::to_string(n) + " documents, the source holds " +
                                std::to_string(docs_->size()));
  const int64_t windows = (n + window_ - 1) / window_;
  first_row_.assign(static_cast<size_t>(windows) + 1, 0);
  // Windows are handed out in runs: each thread counts a run's rows, then takes the next.
  constexpr int64_t kRun = 16;
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::exception_ptr failure;
  auto work = [&] {
    PackTotals mine;
    try {
      PackScratch scratch;
      PackedWindow out;
      std::vector<int64_t> ids, lengths;
      for (int64_t first; (first = next.fetch_add(kRun)) < windows;) {
        if (cancel && cancel->load(std::memory_order_relaxed)) throw PackCancelled();
        for (int64_t w = first; w < std::min(windows, first + kRun); ++w) {
          window_documents(w, ids, lengths);
          pack_window(ids.data(), lengths.data(), static_cast<int64_t>(ids.size()), options_, true, scratch, out);
          first_row_[static_cast<size_t>(w) + 1] = out.rows;
          mine.tokens += out.tokens;
          mine.truncated += out.truncated;
          mine.empty += out.empty;
          mine.longest = std::max(mine.longest, out.longest);
        }
      }
    } catch (...) {
      next.store(windows);
      std::lock_guard<std::mutex> lock(mu);
      if (!failure) failure = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu);
    totals_.tokens += mine.tokens;
    totals_.truncated += mine.truncated;
    totals_.empty += mine.empty;
    totals_.longest = std::max(totals_.longest, mine.longest);
  };
  const int64_t helpers = std::min<int64_t>(std::max(1, threads), std::max<int64_t>(1, windows / kRun)) - 1;
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < helpers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
  for (size_t w = 0; w + 1 < first_row_.size(); ++w) first_row_[w + 1] += first_row_[w];
  totals_.documents = n;
  totals_.rows = rows();
  totals_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
}

void EpochPacking::window_documents(int64_t w, std::vector<int64_t>& docs, std::vector<int64_t>& lengths) const {
  const int64_t first = w * window_;
  const int64_t count = std::min(window_, ordering_.size() - first);
  docs.resize(static_cast<size_t>(count));
  lengths.resize(static_cast<size_t>(count));
  ordering_.fill(first, count, docs.data());
  docs_->lengths(0, docs.data(), count, lengths.data());
}

std::pair<int64_t, int64_t> EpochPacking::locate(int64_t row) const {
  if (row < 0 || row >= rows())
    throw std::out_of_range("packed row " + std::to_string(row) + " out of range [0, " + std::to_string(rows()) + ")");
  // The last window starting at or before the row (windows with no rows start where the next does).
  const auto it = std::upper_bound(first_row_.begin(), first_row_.end(), row);
  const int64_t w = static_cast<int64_t>(it - first_row_.begin()) - 1;
  return {w, row - first_row_[static_cast<size_t>(w)]};
}

void EpochPacking::pack(int64_t window, PackScratch& scratch, PackedWindow& out) const {
  std::vector<int64_t> ids, lengths;
  window_documents(window, ids, lengths);
  pack_window(ids.data(), lengths.data(), static_cast<int64_t>(ids.size()), options_, false, scratch, out);
  if (out.rows != first_row_[static_cast<size_t>(window) + 1] - first_row_[static_cast<size_t>(window)])
    throw std::logic_error("window " + std::to_string(window) + " packs into " + std::to_string(out.rows) +
                           " rows now and " +
                           std::to_string(first_row_[static_cast<size_t>(window) + 1] - first_row_[static_cast<size_t>(window)]) +
                           " when the epoch was planned: did the data change while it was read?");
}

}  // namespace fastload
