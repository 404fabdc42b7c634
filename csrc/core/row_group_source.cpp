// Decoded-on-demand chunks as a batch source; see row_group_source.h. A block's rows are
// resolved to their groups, each distinct group is acquired once (decoded by the first thread
// that needs it, or by a decode thread ahead of time; others wait for that decode, not a second
// one), and the columns are gathered from the decoded arrays. A decoded group stays alive while a
// thread gathers from it, even if the cache has let it go.
#include "core/row_group_source.h"

#include <algorithm>
#include <stdexcept>

#include "core/batch_plan.h"
#include "core/fork_guard.h"

namespace fastload {

RowGroupSource::RowGroupSource(std::shared_ptr<const ArrowTable> schema, std::vector<ArrowColumnRequest> columns,
                               std::vector<int64_t> group_rows, std::vector<std::string> group_names, Decode decode,
                               int64_t budget_bytes, int min_groups, int decode_threads)
    : schema_table_(std::move(schema)), names_(std::move(group_names)), decode_(std::move(decode)),
      budget_(budget_bytes), min_groups_(min_groups), ahead_threads_(std::max(0, decode_threads)),
      fork_generation_(fork_generation()) {
  for (ArrowColumnRequest& req : columns) {
    // Nulls are checked in each group as it is decoded (the schema holds no rows).
    columns_.push_back(plan_arrow_column(*schema_table_, std::move(req), /*check_nulls=*/false));
    add_arrow_parts(columns_.back(), parts_);
  }
  for (const ArrowColumnPlan& col : columns_) {
    plans_.push_back(&col);
    if (col.request.as_list) string_plans_.push_back(&col);
    decoded_ = decoded_ || col.decoded();
  }
  for (int64_t rows : group_rows) {
    if (rows < 0) throw std::invalid_argument("a row group of negative rows");
    starts_.push_back(starts_.back() + rows);
  }
  names_.resize(group_rows.size());
}

RowGroupSource::~RowGroupSource() {
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    queue_->stop = true;
  }
  queue_->cv.notify_all();
  if (fork_generation() != fork_generation_) {
    for (auto& t : decoders_) (void)t.release();  // the parent's threads: nothing of them runs here
    return;
  }
  // No decode thread holds the source now (each holds it only while it decodes, and this is the
  // last owner going): the others are idle and leave at once. This one may be a decode thread
  // that held the last owner.
  for (auto& t : decoders_) {
    if (!t->joinable()) continue;  // stop_decoding() joined it
    if (t->get_id() == std::this_thread::get_id())
      t->detach();
    else
      t->join();
  }
}

void RowGroupSource::stop_decoding() {
  std::lock_guard<std::mutex> threads(threads_mu_);
  stopped_ = true;
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    queue_->stop = true;
  }
  queue_->cv.notify_all();
  if (fork_generation() != fork_generation_) return;
  for (auto& t : decoders_)
    if (t->joinable() && t->get_id() != std::this_thread::get_id()) t->join();
}

int64_t RowGroupSource::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_;
}

std::shared_ptr<const RowGroupSource::Decoded> RowGroupSource::decode(int64_t g) {
  int64_t bytes = 0;
  auto d = std::make_shared<Decoded>();
  d->table = decode_(g, &bytes);
  const ArrowTable& t = *d->table;
  if (t.rows() != starts_[g + 1] - starts_[g])
    throw std::invalid_argument(names_[g] + " decoded to " + std::to_string(t.rows()) + " rows, not the " +
                                std::to_string(starts_[g + 1] - starts_[g]) +
                                " its metadata gave when the source was opened (was the file rewritten?)");
  for (const ArrowColumnPlan& col : columns_) {
    const ArrowColumnInfo& here = t.column(col.info.name);
    // An image column with paths reads the path of a row whose bytes are null (its own check).
    if (here.first_null >= 0 && !col.request.fill && !col.path)
      throw std::invalid_argument("column '" + col.info.name + "' holds nulls (the first at row " +
                                  std::to_string(starts_[g] + here.first_null) + ", in " + names_[g] +
                                  "): pass fill_null={'" + col.info.name + "': value} or drop it with columns=");
    if (!here.unsupported.empty() && !(col.decoded() && here.media))
      throw std::invalid_argument("column '" + col.info.name + "' in " + names_[g] + ": " + here.unsupported);
    std::vector<ArrowChunkView> views;
    for (size_t c = 0; c < t.num_chunks(); ++c) views.push_back(arrow_chunk_view(t, c, col, starts_[g] + t.starts()[c]));
    d->views.push_back(std::move(views));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(g);
    if (it != cache_.end()) {
      it->second.bytes = bytes;
      it->second.done = true;
      cached_ += bytes;
    }
    evict_locked(g);
  }
  decoded_bytes_.fetch_add(bytes);
  decodes_.fetch_add(1);
  return d;
}

void RowGroupSource::evict_locked(int64_t keep) {
  const size_t floor = static_cast<size_t>(min_groups_ + 2 * threads_.load());
  while (cached_ > budget_) {
    size_t readable = 0;  // decoded groups a batch has asked for: what the floor counts
    auto victim = cache_.end();
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (!it->second.done || it->second.unread) continue;
      ++readable;
      if (it->first != keep && (victim == cache_.end() || it->second.used < victim->second.used)) victim = it;
    }
    if (victim == cache_.end() || readable <= floor) return;
    cached_ -= victim->second.bytes;
    cache_.erase(victim);
  }
}

void RowGroupSource::claim_locked(int64_t g, Promise& promise, bool ahead) {
  Entry& e = cache_[g];
  e.ready = promise.get_future().share();
  e.used = ++clock_;
  e.unread = ahead;
  unread_ += ahead ? 1 : 0;
}

void RowGroupSource::decode_claimed(std::vector<std::pair<int64_t, Promise>>& claimed) {
  for (size_t k = 0; k < claimed.size(); ++k) {
    try {
      claimed[k].second.set_value(decode(claimed[k].first));
    } catch (...) {
      // This group and the ones not decoded yet fail alike (a later batch tries them again):
      // no thread may wait for a promise nobody will keep.
      const std::exception_ptr error = std::current_exception();
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (size_t j = k; j < claimed.size(); ++j) {
          auto it = cache_.find(claimed[j].first);
          if (it == cache_.end()) continue;
          unread_ -= it->second.unread ? 1 : 0;
          cache_.erase(it);
        }
      }
      for (size_t j = k; j < claimed.size(); ++j) claimed[j].second.set_exception(error);
      std::rethrow_exception(error);
    }
  }
}

void RowGroupSource::acquire(const std::vector<int64_t>& groups, std::vector<std::shared_ptr<const Decoded>>& out) {
  std::vector<std::shared_future<std::shared_ptr<const Decoded>>> ready(groups.size());
  std::vector<bool> have(groups.size(), false);
  // One group claimed at a time: the other groups this block needs stay free for the other
  // collation threads and the decode threads to claim meanwhile (a new window's groups are then
  // decoded side by side, not one after another by the first thread that needs them all).
  for (;;) {
    std::vector<std::pair<int64_t, Promise>> mine;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = 0; i < groups.size(); ++i) {
        if (have[i]) continue;
        auto it = cache_.find(groups[i]);
        if (it == cache_.end()) {
          if (!mine.empty()) continue;  // next round
          mine.emplace_back(groups[i], Promise());
          claim_locked(groups[i], mine.back().second, false);
          it = cache_.find(groups[i]);
        }
        Entry& e = it->second;
        e.used = ++clock_;
        if (e.unread) {
          e.unread = false;
          --unread_;
        }
        ready[i] = e.ready;  // holds the decoded group even if the cache lets it go
        have[i] = true;
      }
    }
    if (mine.empty()) break;
    decode_claimed(mine);
  }
  out.resize(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) out[i] = ready[i].get();  // rethrows another thread's failed decode
}

int64_t RowGroupSource::allowed_ahead() const {
  // Decoded-ahead groups no batch has read yet, and those queued: at most half the budget's
  // worth (of the mean group decoded so far), and at least one order="block" window.
  const int64_t decoded = decodes_.load();
  const int64_t mean = decoded > 0 ? std::max<int64_t>(1, decoded_bytes_.load() / decoded) : 0;
  return std::max<int64_t>(min_groups_, mean > 0 ? budget_ / 2 / mean : 0);
}

bool RowGroupSource::room_ahead() const {
  const int64_t allowed = allowed_ahead();
  int64_t pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending = unread_;
  }
  {
    std::lock_guard<std::mutex> lock(queue_->mu);
    pending += static_cast<int64_t>(queue_->groups.size());
  }
  return pending < allowed;
}

void RowGroupSource::start_decode_threads() {
  std::lock_guard<std::mutex> lock(threads_mu_);
  if (stopped_ || !decoders_.empty()) return;
  std::weak_ptr<RowGroupSource> self = weak_from_this();
  if (self.expired()) return;  // not owned by a shared_ptr (a test's source on the stack): no decoding ahead
  for (int t = 0; t < ahead_threads_; ++t)
    decoders_.push_back(std::make_unique<std::thread>(&RowGroupSource::decode_loop, self, queue_));
}

void RowGroupSource::decode_loop(std::weak_ptr<RowGroupSource> source, std::shared_ptr<Queue> queue) {
  for (;;) {
    int64_t g;
    {
      std::unique_lock<std::mutex> lock(queue->mu);
      queue->cv.wait(lock, [&] { return queue->stop || !queue->groups.empty(); });
      if (queue->stop) return;
      g = queue->groups.front();
      queue->groups.pop_front();
      queue->queued.erase(g);
    }
    std::shared_ptr<RowGroupSource> self = source.lock();
    if (!self) return;
    try {
      self->decode_ahead(g);
    } catch (...) {
      // The batch that needs the group gets the error from its entry's promise (and a later
      // batch decodes the group again): nothing to do here.
    }
  }
}

void RowGroupSource::decode_ahead(int64_t g) {
  std::vector<std::pair<int64_t, Promise>> mine;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cache_.count(g)) return;  // a collation thread got there first, or it is still cached
    mine.emplace_back(g, Promise());
    claim_locked(g, mine.back().second, true);
  }
  decode_claimed(mine);
  decoded_ahead_.fetch_add(1);
}

void RowGroupSource::read_ahead(const FillRequest& r) {
  if (!r.plan || ahead_threads_ == 0 || fork_generation() != fork_generation_) return;
  std::unique_lock<std::mutex> scan(scan_mu_, std::try_to_lock);
  if (!scan.owns_lock()) return;  // another collation thread is reading the plan
  const BatchPlan& plan = *r.plan;
  if (r.plan != scan_plan_ || plan.epoch() != scan_epoch_) {
    // Another epoch (or a resumed one): what was read ahead for the last one is not wanted.
    scan_plan_ = r.plan;
    scan_epoch_ = plan.epoch();
    scan_step_ = r.step;  // this batch's groups too: the decode threads help with a new window
    {
      std::lock_guard<std::mutex> lock(queue_->mu);
      queue_->groups.clear();
      queue_->queued.clear();
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& entry : cache_) entry.second.unread = false;
    unread_ = 0;
  }
  start_decode_threads();
  scan_step_ = std::max(scan_step_, r.step);
  scan_ids_.resize(static_cast<size_t>(plan.max_batch_rows()));
  std::vector<int64_t> fresh;
  // A few batches per call, so that no batch waits long for its own filling thread's reading.
  constexpr int kBatchesPerCall = 16;
  for (int k = 0; k < kBatchesPerCall && scan_step_ < plan.num_batches() && room_ahead(); ++k) {
    BatchRows out;
    out.ids = scan_ids_.data();
    const int64_t n = plan.fill(scan_step_, out);
    fresh.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (int64_t i = 0; i < n; ++i) {
        const int64_t g = static_cast<int64_t>(arrow_chunk_of(starts_, scan_ids_[static_cast<size_t>(i)]));
        if (!cache_.count(g) && std::find(fresh.begin(), fresh.end(), g) == fresh.end()) fresh.push_back(g);
      }
    }
    const int64_t unread = [&] {
      std::lock_guard<std::mutex> lock(mu_);
      return unread_;
    }();
    bool all = true;
    {
      std::lock_guard<std::mutex> lock(queue_->mu);
      // The batch's groups in the order its rows need them; the room is checked per group, and
      // a batch whose groups did not all fit is read again by the next call.
      const int64_t allowed = allowed_ahead();
      for (int64_t g : fresh) {
        if (queue_->queued.count(g)) continue;
        if (unread + static_cast<int64_t>(queue_->groups.size()) >= allowed) {
          all = false;
          break;
        }
        queue_->groups.push_back(g);
        queue_->queued.insert(g);
      }
    }
    queue_->cv.notify_all();
    if (!all) break;
    ++scan_step_;
  }
}

void RowGroupSource::fill(const FillRequest& r) {
  for (int seen = threads_.load(); r.thread + 1 > seen && !threads_.compare_exchange_weak(seen, r.thread + 1);) {
  }
  read_ahead(r);
  size_t chunk[kArrowBlock];
  int64_t row[kArrowBlock];
  const Decoded* of_row[kArrowBlock];
  std::vector<int64_t> groups;                           // this block's distinct groups, sorted
  std::vector<std::shared_ptr<const Decoded>> held;      // and their decoded arrays
  int64_t group_of[kArrowBlock];
  const std::shared_ptr<ArrowStringLists> lists = attach_arrow_string_lists(string_plans_, r);
  auto view_of = [&](size_t c, int64_t i) { return &of_row[i]->views[c][chunk[i]]; };
  for (int64_t b = 0; b < r.count; b += kArrowBlock) {
    const int64_t n = std::min(kArrowBlock, r.count - b);
    groups.clear();
    for (int64_t i = 0; i < n; ++i) {
      group_of[i] = static_cast<int64_t>(arrow_chunk_of(starts_, r.ids[b + i]));
      groups.push_back(group_of[i]);
    }
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    acquire(groups, held);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t g = group_of[i];
      const Decoded& d = *held[static_cast<size_t>(std::lower_bound(groups.begin(), groups.end(), g) - groups.begin())];
      const int64_t local = r.ids[b + i] - starts_[g];
      chunk[i] = arrow_chunk_of(d.table->starts(), local);
      row[i] = local - d.table->starts()[chunk[i]];
      of_row[i] = &d;
    }
    gather_arrow_block(plans_, r, b, n, row, view_of, lists.get());
  }
}

std::shared_ptr<const ArrowTable> RowGroupSource::decoded_table(int64_t group) {
  std::vector<std::shared_ptr<const Decoded>> held;
  acquire({group}, held);
  return std::shared_ptr<const ArrowTable>(held[0], held[0]->table.get());  // shares the entry's life
}

}  // namespace fastload
