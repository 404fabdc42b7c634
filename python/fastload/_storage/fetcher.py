"""The fetcher of one remote source: makes cached objects present for the collation threads (the
mapping layer's provider), prefetches along this rank's plan, and evicts the cached object whose
next use in the plan is furthest away (Belady's rule; least recently used without a plan).

The plan is a pure function (Loader.plan), so the fetcher knows each shard's next use exactly;
the consumer's position comes from the batches the loader has handed out. Downloads run on a
small pool of threads (boto3 releases the GIL while it waits on sockets), bounded in requests and
in bytes in flight; the cache is bounded by `limit` bytes, and a file mapped or being mapped by a
collation thread is never removed (LazyFiles.try_unmap refuses it)."""
from __future__ import annotations

import atexit
import concurrent.futures
import functools
import os
import threading
import time
import weakref
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import numpy as np

from .cache import Entry, ObjectCache, cache_too_small
from .client_protocol import Client
from .stats import StorageStats

_INF = np.iinfo(np.int64).max
_DEMAND_WAIT = 120.0  # seconds a collation thread waits for room before the error
_NO_PIN_BOUND = (1 << 31) - 1  # LazyFiles.pin_bound when the cache holds every file
_DEMAND_PATIENCE = 0.25  # seconds it waits for other threads' reads before evicting a file they need
_RESCAN_S = 1.0  # the cache folder is walked at most this often (see _scan_locked)
_NEXT_EPOCH_SHARE = 8  # the next epoch's shards are prefetched up to limit / this (at least a shard)


class PlanWindow(NamedTuple):
    """A stretch of this rank's plan as one source's fetcher sees it: the shard of each of its
    samples in read order, the step each is read at (non-decreasing), the step the stretch ends
    before, and whether the plan ends there. A short one starts a run: its downloads start while
    the full window is computed."""
    shards: np.ndarray
    steps: np.ndarray
    end: int
    last: bool
    short: bool = False  # a first, small window (quick to compute): replaced by a full one at once


class Plan(Protocol):
    """Where the fetcher gets its plan from (see _storage/plan.py): a window of it from a step."""

    def window(self, at: int) -> PlanWindow: ...


class Fetcher:
    def __init__(self, client: Client, cache: ObjectCache, entries: Sequence[Entry], shard_files: Sequence[Sequence[int]],
                 limit: int, max_inflight_bytes: int | None = None):
        self.client, self.cache, self.entries, self.limit = client, cache, list(entries), limit
        cache.limit = limit  # named when the file system under the cache is full
        self.shard_files = [list(f) for f in shard_files]
        self.shard_of_file = np.zeros(len(self.entries), dtype=np.int64)
        for k, files in enumerate(self.shard_files):
            self.shard_of_file[files] = k
        self.shard_bytes = np.array([sum(self.entries[i].size for i in f) for f in self.shard_files], dtype=np.int64)
        self.max_inflight = max_inflight_bytes or max(int(self.shard_bytes.max()), min(limit // 4, 1 << 30))
        # Large files come in ranged parts (parts.py) when the bytes in flight hold fewer whole
        # files than the requests allowed at once (a small cache of large shards): the same bytes
        # as more requests. Otherwise whole, one request each: whole files already fill the
        # requests, and parts would only add requests (on loopback they measured no gain either
        # way: bench/RESULTS.md). storage_options['part_size'] asks for parts always. The bound
        # on requests counts parts.
        largest = max((e.size for e in self.entries), default=1)
        self._in_parts = client.part_size > 0 and (
            client.parts_always or self.max_inflight // max(1, largest) < client.concurrency)
        self._requests_of = np.array([client.requests_for(e.size) if self._in_parts else 1 for e in self.entries],
                                     dtype=np.int64)
        self._get: Callable[..., int] = functools.partial(client.get, parts=self._in_parts)
        self._by_rel = {e.rel: i for i, e in enumerate(self.entries)}
        self._cond = threading.Condition()
        self._fetching = np.zeros(len(self.entries), dtype=bool)
        self._last_use = np.zeros(len(self.entries), dtype=np.int64)
        self._clock = 0
        self._reserved = 0  # bytes of downloads in flight (their temporary files)
        self._on_disk: set[int] | None = None  # files complete in the cache folder (_scan_locked)
        self._on_disk_bytes = 0  # and their bytes
        self._scanned_at = 0.0
        self._files: Any = None  # the native LazyFiles, once the source is described
        self._pin_bound: int | None = None  # the most files a collation thread pins at once (bound_pins)
        self._stats = StorageStats(limit=limit, dataset_bytes=sum(e.size for e in self.entries))
        self._active = 0
        self._busy_since = 0.0
        # The plan followed, in steps from where it was handed over: where the consumer is
        # (position()), and a window of it (_install): the shard of each sample read and its step,
        # and per shard the sorted steps where it is read. A new window is asked of _plan (by the
        # prefetch thread) when the consumer has passed the middle of this one.
        self._plan: Plan | None = None
        self._occ_steps: np.ndarray | None = None
        self._occ_start: np.ndarray | None = None
        self._seq: np.ndarray | None = None
        self._at: np.ndarray | None = None
        self._window = (0, 0, True)  # (first step, end step, whether the plan ends there)
        self._short, self._rounds = False, 0  # a short first window; prefetch rounds run on this window
        self._occ_keys: np.ndarray | None = None
        # Which of the plan's reads are done: the rows each file had given the collation threads
        # when the plan was handed over (LazyFiles.rows_read), and per shard the reads the plan
        # makes before the window held (each of a shard's files is read once per sample of it).
        self._reads_from: np.ndarray | None = None
        self._every_file = list(range(len(self.entries)))
        self._reads_before = np.zeros(len(self.shard_files), dtype=np.int64)
        # The prefetch round that found nothing to start: (index in _seq, _changed) then. Nothing
        # changes its answer until the consumer has moved on or a file came or went (or a download
        # ended).
        self._idle: tuple[int, int] | None = None
        self._changed = 0  # bumped when a download ends, a file is evicted or a window installed
        self._position: Callable[[], int | None] = lambda: None
        self._epoch_token = 0
        self._boundary = 0  # the step where the next epoch starts
        self._stopped = False
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._ready = False  # the pool's threads were started ahead (ready())
        self._thread: threading.Thread | None = None
        _live.add(self)

    # ------------------------------------------------------------------ the collation threads' side
    def bind(self, lazy_files: Any) -> None:
        """Makes this fetcher the provider of the native LazyFiles (one per source). The provider
        holds the fetcher weakly: the fetcher holds the LazyFiles, and a cycle through the native
        object would keep both (and the prefetch thread) alive for good."""
        with self._cond:
            self._files = lazy_files
            self._count_reads_from_now_locked()
            if self._pin_bound is not None and hasattr(lazy_files, "pin_bound"):
                lazy_files.pin_bound = self._pin_bound
        ref = weakref.ref(self)

        def provide(i: int) -> tuple[int, int, int, int]:
            fetcher = ref()
            if fetcher is None:
                raise RuntimeError("the remote source was closed while a batch still needed its files")
            return fetcher.provide(i)

        lazy_files.set_provider(provide)

    def bound_pins(self, threads: int) -> None:
        """A Loader of `threads` collation threads reads this source: each pins at most as many
        files at once as let all of them fit the cache together, so that a thread waiting for room
        always gets it once the others' batches are copied (the least of every Loader's bound).
        A cache too small for each thread to read one shard is an error naming both sizes."""
        if self._files is not None and not hasattr(self._files, "pin_bound"):
            return  # a source that pins a file only while it opens it (remote Parquet) holds no more
        threads = max(1, threads)
        need = int(np.sort(self.shard_bytes)[::-1][:threads].sum())  # each thread in a shard of its own
        if need > self.limit:
            fit = int(np.searchsorted(np.cumsum(np.sort(self.shard_bytes)[::-1]), self.limit, side="right"))
            raise cache_too_small(self.limit, need, f"but {threads} collation threads each read a shard at once ({need} "
                                  f"bytes for the {threads} largest)", f", or pass num_threads={max(1, fit)}")
        # The most files each thread may pin: the largest files of all threads' pins fit the limit.
        # A cache that holds every file needs no bound (a batch of a cached epoch pins its ~100
        # distinct files in one go).
        largest_first = np.cumsum(np.sort(np.array([e.size for e in self.entries], dtype=np.int64))[::-1])
        fit = int(np.searchsorted(largest_first, self.limit, side="right"))
        bound = _NO_PIN_BOUND if fit >= len(self.entries) else max(1, fit // threads)
        with self._cond:
            self._pin_bound = bound if self._pin_bound is None else min(self._pin_bound, bound)
            if self._files is not None:
                self._files.pin_bound = self._pin_bound

    def provide(self, i: int) -> tuple[int, int, int, int]:
        """Called by a collation thread before it maps file i: the file is present (fetched now
        if needed) and its identity is returned. Raises OSError naming the URL on failure."""
        entry = self.entries[i]
        t0 = time.monotonic()
        waited = False
        with self._cond:
            self._clock += 1
            self._last_use[i] = self._clock
            while True:
                if not self._fetching[i]:
                    st = self.cache.present(entry)
                    self._note_locked(i, st is not None)
                    if st is not None:
                        if waited:
                            self._stats.misses += 1
                            self._stats.wait_s += time.monotonic() - t0
                        else:
                            self._stats.hits += 1
                        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
                    break
                waited = True
                self._cond.wait(0.5)
            self._stats.misses += 1
            self._fetching[i] = True
            try:
                self._make_room_locked(entry.size, demand=True, needed_at=-1, wanted=i)
            except BaseException:
                self._fetching[i] = False
                self._cond.notify_all()
                raise
        st = self._download(i)
        with self._cond:
            self._stats.wait_s += time.monotonic() - t0
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

    def _download(self, i: int) -> os.stat_result:
        """Downloads file i (room already reserved, _fetching[i] set): always clears both."""
        entry = self.entries[i]
        with self._cond:
            if self._active == 0:
                self._busy_since = time.monotonic()
            self._active += 1
        ok = False
        try:
            st, n = self.cache.fetch(entry, self._get)
            ok = True
        finally:
            with self._cond:
                if ok:
                    self._note_locked(i, True)
                self._active -= 1
                if self._active == 0:
                    self._stats.fetch_busy_s += time.monotonic() - self._busy_since
                self._reserved -= entry.size
                self._fetching[i] = False
                self._changed += 1
                self._cond.notify_all()
        with self._cond:
            self._stats.bytes_fetched += n
        return st

    # ------------------------------------------------------------------ room and eviction
    def _next_use(self, files: np.ndarray, pos: int) -> np.ndarray:
        """Per file, the step of the plan where its shard is next read, at or after step `pos`
        and after the reads of it the collation threads have done (they run ahead of the
        consumer: a file whose every read in the window is done is _INF, the first to go, though
        the consumer has not reached those steps yet); _INF if not read again within the window
        held. Without a plan: older use = sooner gone (least recently used), as negative times."""
        if self._occ_steps is None:
            return -self._last_use[files]
        shards = self.shard_of_file[files]
        done = self._reads_done_locked()
        done = done[files] if done is not None else np.zeros(len(files), dtype=np.int64)
        # Each shard's first read at a step >= pos: one searchsorted over (shard, step) keys.
        span = self._window[1] + 1  # the window's steps are < its end
        at = np.searchsorted(self._occ_step_keys, shards * span + min(max(pos, 0), span - 1))
        at = np.maximum(at, self._occ_start[shards] + done)
        read = at < self._occ_start[shards + 1]
        out = np.full(len(files), _INF, dtype=np.int64)
        out[read] = self._occ_steps[at[read]]
        return out

    def _reads_done_locked(self) -> np.ndarray | None:
        """Per file, how many of the window's reads of it the collation threads have done (None
        before the source is described)."""
        if self._reads_from is None or self._files is None:
            return None
        read = np.asarray(self._files.rows_read(self._every_file), dtype=np.int64)
        return read - self._reads_from - self._reads_before[self.shard_of_file]

    def _make_room_locked(self, nbytes: int, demand: bool, needed_at: int, wanted: int | None = None) -> bool:
        """Reserves nbytes of the limit, evicting the cached files needed furthest ahead (files of
        under 1/64 of it: down to 15/16, so the walk comes once per many). A prefetch evicts only
        files needed later than `needed_at` (else False); a demand (for file `wanted`) waits for
        room (files unpinned, reads done, downloads done), for _DEMAND_PATIENCE evicting no file
        the plan reads before `wanted`, and raises after a bound."""
        deadline = time.monotonic() + _DEMAND_WAIT
        patience = time.monotonic() + _DEMAND_PATIENCE if demand else 0.0
        fresh = False
        while True:
            on_disk = self._scan_locked(fresh)
            used = self._on_disk_bytes + self._reserved
            if used + nbytes <= self.limit:
                self._reserved += nbytes
                return True
            if not fresh:  # over the limit by the cached view: look at the folder before evicting
                fresh = True
                continue
            candidates = np.array([i for i in on_disk if not self._fetching[i]], dtype=np.int64)
            if len(candidates):
                pos = self._position() or 0
                uses = self._next_use(candidates, pos)
                keep_before = needed_at + 1 if not demand else None  # a prefetch keeps files needed by then
                if demand and wanted is not None and self._occ_steps is not None and time.monotonic() < patience:
                    # A file the plan reads before the one demanded is one another collation
                    # thread is about to read (the last batches of a window of order="block"
                    # while this thread reads a batch that straddles into the next): wait for
                    # those reads rather than evict the file and fetch it again.
                    # Nor one read at the same step (the wanted file's shard's other columns).
                    wanted_at = int(self._next_use(np.array([wanted], dtype=np.int64), pos)[0])
                    keep_before = wanted_at + 1 if wanted_at < _INF else None
                slack = self.limit // 16 if self.limit >= 64 * nbytes else 0  # small files: 1/16 freed at once
                for j in np.argsort(-uses, kind="stable"):
                    if keep_before is not None and uses[j] < keep_before:
                        if not demand and used + nbytes > self.limit:
                            return False
                        break
                    i = int(candidates[j])
                    if self._files is not None and not self._files.try_unmap(i):
                        continue  # a collation thread reads it now
                    self.cache.remove(self.entries[i])
                    self._note_locked(i, False)
                    self._stats.evictions += 1
                    used -= self.entries[i].size
                    if used + nbytes + slack <= self.limit:
                        break
                if used + nbytes <= self.limit:
                    continue  # scan again: another process may have added files meanwhile
            if not demand:
                return False
            if time.monotonic() > deadline:
                raise OSError(f"the cache of {self.limit} bytes has no room for {nbytes} more bytes "
                              f"({self.entries[0].url} ...): {used} bytes are held by files the collation threads "
                              "read now or by downloads in flight; raise cache_limit")
            self._cond.wait(0.05)

    def _scan_locked(self, fresh: bool = False) -> set[int]:
        """Files of this dataset complete in the cache folder (any process's). The folder is
        walked at most every _RESCAN_S seconds (or when `fresh`): between walks this process's
        own downloads and evictions keep the set exact, and other processes' are seen at the
        next walk (and before any eviction decision, which always walks). The set is the
        fetcher's own: read it under the lock, do not change it."""
        now = time.monotonic()
        if fresh or self._on_disk is None or now - self._scanned_at > _RESCAN_S:
            on_disk = set()
            for rel, size in self.cache.scan().items():
                i = self._by_rel.get(rel)
                if i is not None and size == self.entries[i].size:
                    on_disk.add(i)
            if on_disk != self._on_disk:
                self._on_disk = on_disk
                self._on_disk_bytes = sum(self.entries[i].size for i in on_disk)
                self._changed += 1
            self._scanned_at = now
        return self._on_disk

    def _note_locked(self, i: int, present: bool) -> None:
        if self._on_disk is not None and (i in self._on_disk) != present:
            (self._on_disk.add if present else self._on_disk.discard)(i)
            self._on_disk_bytes += self.entries[i].size if present else -self.entries[i].size
            self._changed += 1

    # ------------------------------------------------------------------ plan-driven prefetch
    def follow(self, plan: Plan, position: Callable[[], int | None], boundary: int | None = None) -> None:
        """Follows a plan from now on: position() gives the steps the consumer has taken (None
        once the run is over or abandoned: prefetch stops), plan.window(step) a stretch of the
        plan from a step. Steps from `boundary` on are the next epoch's: prefetched only up to
        _NEXT_EPOCH_SHARE of the limit (the run may end there). The prefetch thread asks for the
        windows, so the caller (an iter()) never waits for one."""
        with self._cond:
            self._clear_plan_locked()
            self._plan, self._position = plan, position
            self._boundary = _INF if boundary is None else boundary
            self._epoch_token += 1
            self._ensure_thread_locked()
            self._cond.notify_all()

    def start_epoch(self, seq: np.ndarray, position: Callable[[], int | None], boundary: int | None = None,
                    prefetch: bool = True) -> None:
        """A whole plan at once: the shard of each sample from here on, in order, each sample its
        own step (position(): samples handed out). prefetch=False (tests): eviction follows the
        plan, nothing is fetched ahead."""
        seq = np.asarray(seq, dtype=np.int64)
        with self._cond:
            self._clear_plan_locked()
            self._position = position
            self._boundary = len(seq) if boundary is None else boundary
            self._epoch_token += 1
            self._install_locked(PlanWindow(seq, np.arange(len(seq), dtype=np.int64), len(seq), True), 0)
            if prefetch:
                self._ensure_thread_locked()
            self._cond.notify_all()

    def _clear_plan_locked(self) -> None:
        self._plan = None
        self._seq = self._at = self._occ_steps = self._occ_start = self._occ_keys = None
        self._window = (0, 0, True)
        self._count_reads_from_now_locked()

    def _count_reads_from_now_locked(self) -> None:
        """The plan's reads are counted from here: the rows read so far are its start."""
        files = self._files
        counted = files is not None and hasattr(files, "rows_read")  # remote Parquet's pins count no rows
        self._reads_from = np.asarray(files.rows_read(self._every_file), dtype=np.int64) if counted else None
        self._reads_before[:] = 0

    def _install_locked(self, w: PlanWindow, first: int) -> None:
        if self._seq is not None:
            held_first, held_end, _ = self._window
            if first > held_end:  # the consumer went past the window held: count from here
                self._count_reads_from_now_locked()
            else:  # the held window's reads before `first` are before the new window's
                self._reads_before += np.bincount(self._seq[self._at < first], minlength=len(self.shard_files))
        seq = np.asarray(w.shards, dtype=np.int64)
        # numpy sorts 16-bit keys by radix (4x faster than int64 on a window of 200K samples).
        keys = seq.astype(np.uint16) if len(self.shard_files) <= 1 << 16 else seq
        order = np.argsort(keys, kind="stable")
        counts = np.bincount(seq, minlength=len(self.shard_files))
        self._seq, self._at = seq, np.asarray(w.steps, dtype=np.int64)
        self._occ_steps = self._at[order]
        self._occ_step_keys = seq[order] * (w.end + 1) + self._occ_steps  # (shard, step), sorted
        self._occ_start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # (shard, index) keys in sorted order: each shard's next read at or after an index is one
        # searchsorted for all shards at once (_ahead_locked).
        self._occ_keys = seq[order] * (len(seq) + 1) + order
        self._window = (first, w.end, w.last)
        self._short, self._rounds = w.short and not w.last, 0
        self._idle = None
        self._changed += 1

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        t, pool = self._thread, self._pool
        if t is not None and t is not threading.current_thread():
            t.join(timeout=30)
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def ready(self) -> None:
        """Starts the prefetch thread and every download thread now (a Loader over the source was
        built), not when the first epoch needs them: a thread started while the collation
        threads and downloads hold the GIL in turns waits for its first turn, and downloads wait
        for the threads (the 16th started 50-150 ms into epoch 1 on a loaded 2-core machine)."""
        with self._cond:
            self._ensure_thread_locked()
            pool, n = self._pool, self.client.concurrency
            if pool is None or self._ready:  # once: later Loaders find the threads there (maybe busy)
                return
            self._ready = True
        _start_threads(pool, n)
        if int(self._requests_of.max()) > 1:  # files fetched in parts: their pool too
            _start_threads(self.client.parts.get(), n)

    def _ensure_thread_locked(self) -> None:
        if self._thread is None and not self._stopped:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, self.client.concurrency),
                                                               thread_name_prefix="fastload-fetch")
            self._thread = threading.Thread(target=_prefetch_loop, args=(weakref.ref(self),), daemon=True,
                                            name="fastload-prefetch")
            self._thread.start()

    def _refresh_window(self) -> bool:
        """Asks the plan for a new window when the consumer has passed the middle of the one
        held (or none is held yet); the plan is computed outside the lock. True if it did."""
        with self._cond:
            plan, token = self._plan, self._epoch_token
            at = self._position() if plan is not None else None
            if at is None or self._all_cached_locked():
                return False
            first, end, last = self._window
            if self._seq is not None and (last or at < (first + end) // 2) and not (self._short and self._rounds):
                return False
        w = plan.window(at)
        with self._cond:
            if token == self._epoch_token:  # not replaced meanwhile
                self._install_locked(w, at)
        return True

    def _prefetch_round(self) -> float:
        """Starts the downloads the plan wants next and the bounds allow; returns how long to wait
        before the next round."""
        if self._refresh_window():
            return 0.0
        with self._cond:
            if self._seq is None or self._stopped or self._all_cached_locked():
                return 0.2
            at = self._position()
            if at is None:  # the run was abandoned or replaced: fetch nothing more for it
                self._clear_plan_locked()
                return 0.2
            start = int(np.searchsorted(self._at, at, side="left"))
            if self._idle == (start, self._changed):
                return 0.1  # the last round found nothing to do, and nothing has changed since
            done = self._reads_done_locked()  # once a round: a walk of every file's count
            ahead, needed_at = self._ahead_locked(start, done)
            if not len(ahead):
                return 0.2
            self._rounds += 1
            in_flight = int(self._requests_of[self._fetching].sum())  # requests, a file's parts each
            inflight_bytes = self._reserved
            on_disk = self._scan_locked()
            span = 0  # bytes of the distinct shards from pos up to the candidate: over the limit, stop
            next_epoch = 0  # of which the next epoch's
            started = 0
            for k, when in zip(ahead, needed_at):
                span += int(self.shard_bytes[k])
                if span > self.limit:
                    break
                if when >= self._boundary:
                    next_epoch += int(self.shard_bytes[k])
                    if next_epoch > max(self.limit // _NEXT_EPOCH_SHARE, int(self.shard_bytes.max())):
                        break
                reads = self._occ_start[k + 1] - self._occ_start[k]  # of shard k in the window
                for i in self.shard_files[k]:
                    if self._fetching[i] or i in on_disk:
                        continue
                    if done is not None and done[i] >= reads:
                        continue  # this column's reads are done; another column of the shard is still read
                    size, requests = self.entries[i].size, int(self._requests_of[i])
                    if in_flight and (in_flight + requests > self.client.concurrency
                                      or inflight_bytes + size > self.max_inflight):
                        return 0.02
                    if not self._make_room_locked(size, demand=False, needed_at=when):
                        return 0.05
                    self._fetching[i] = True
                    in_flight += requests
                    inflight_bytes += size
                    started += 1
                    assert self._pool is not None
                    self._pool.submit(self._prefetch_one, i)
            if not started:
                self._idle = (start, self._changed)
            return 0.02 if started else 0.1

    def _all_cached_locked(self) -> bool:
        """Every file is in the cache (a dataset that fits, after its first epoch): there is
        nothing to prefetch or evict, so no window of the plan is computed (a file another process
        removes is seen at the next walk of the folder, and the plan is asked for again)."""
        return len(self._scan_locked()) == len(self.entries)

    def _ahead_locked(self, start: int, done: np.ndarray | None) -> tuple[list[int], list[int]]:
        """The shards the plan reads from index `start` of the window on, in the order of their
        next read, and the step of that read: one searchsorted over the shards, not a pass over
        the window's samples. `done` (_reads_done_locked): reads the collation threads did ahead
        of the consumer are not ahead."""
        n = len(self._seq) + 1
        shards = np.arange(len(self.shard_files), dtype=np.int64)
        at = np.searchsorted(self._occ_keys, shards * n + start)
        if done is not None:  # reads the collation threads did ahead of the consumer are not ahead
            least = np.full(len(shards), np.iinfo(np.int64).max, dtype=np.int64)
            np.minimum.at(least, self.shard_of_file, done)  # a shard is read while one of its files is
            at = np.maximum(at, self._occ_start[:-1] + np.clip(least, 0, n))
        found = at < self._occ_start[1:]  # else the shard is not read again in the window
        shards, at = shards[found], at[found]
        index = self._occ_keys[at] - shards * n
        order = np.argsort(index, kind="stable")
        return shards[order].tolist(), self._at[index[order]].tolist()

    def _prefetch_one(self, i: int) -> None:
        try:
            self._download(i)
            with self._cond:
                self._stats.prefetched += 1
        except Exception:  # noqa: BLE001 - the collation thread that needs it fetches it again and raises
            pass

    def stats(self, walk: bool = True) -> StorageStats:
        """The counters; cached_bytes from a walk of the cache folder now (walk=False: as this
        process last saw it, without touching the disk)."""
        with self._cond:
            s = StorageStats(**{k: getattr(self._stats, k) for k in StorageStats.__dataclass_fields__})
            s.requests = self.client.requests
            self._scan_locked(fresh=walk)
            s.cached_bytes = self._on_disk_bytes
            if self._active:
                s.fetch_busy_s += time.monotonic() - self._busy_since
        return s


def _start_threads(pool: concurrent.futures.ThreadPoolExecutor, n: int) -> None:
    """Makes the pool start its n threads now: each task waits for the others, so the pool
    starts a thread for each."""
    started = threading.Barrier(n + 1)

    def arrive() -> None:
        try:
            started.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass

    for _ in range(n):
        pool.submit(arrive)
    try:
        started.wait(timeout=5)
    except threading.BrokenBarrierError:
        pass


def _prefetch_loop(ref: "weakref.ref[Fetcher]") -> None:
    """The prefetch thread: holds its fetcher only for a round, so a source dropped by the user
    stops it (and interpreter exit does, through _stop_all)."""
    while True:
        f = ref()
        if f is None or f._stopped:
            return
        try:
            pause = f._prefetch_round()
        except Exception:  # noqa: BLE001 - prefetch is an optimisation: the demand path reports errors
            pause = 0.5
        cond = f._cond
        del f
        with cond:
            cond.wait(pause)


_live: "weakref.WeakSet[Fetcher]" = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for f in list(_live):
        f.stop()
