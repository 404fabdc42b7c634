"""What the loader is doing: counters kept natively (always on, a few adds per batch), read by
Loader.stats() into a small dataclass whose repr is a table."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any



@dataclass(frozen=True)
class StageStats:
    """Per-batch times of one stage. busy_s: summed over batches (over all threads, so it can
    exceed wall time); p50_s/p99_s: per batch (within 12.5%)."""

    count: int = 0
    busy_s: float = 0.0
    p50_s: float = 0.0
    p99_s: float = 0.0


@dataclass(frozen=True)
class SourceStats:
    """One source of a step-based loader (a Mix, or steps=): samples this loader handed out from
    it in the current run (all its devices; this rank only), and where the whole stream (every
    rank) stands in it at the next step: its stream position and the epochs of it completed."""

    samples: int = 0
    epochs: int = 0
    position: int = 0


@dataclass(frozen=True)
class PackingStats:
    """fl.Pack's packing of one epoch (all ranks; the empty rows even= adds are not counted): the
    documents and how many were empty (skipped), the packed rows, the tokens they hold and those
    cut by split="truncate", and efficiency = tokens / (rows x length), the share of the rows'
    tokens that are not padding. planning_s: the wall time it took to plan the epoch (once per
    epoch, on the loader's threads). For steps=, the epoch the next step is in."""

    epoch: int = 0
    documents: int = 0
    empty_documents: int = 0
    rows: int = 0
    tokens: int = 0
    truncated_tokens: int = 0
    longest_segment: int = 0
    efficiency: float = 0.0
    planning_s: float = 0.0
    length: int = 0
    window: int = 0


@dataclass(frozen=True)
class LoaderStats:
    """Counters of the current epoch (since its iter()/split()), and the memory the loader holds.

    - batches, samples, bytes: handed out to the training loop (all devices after split()).
    - wait_s: time the loop spent inside next() waiting for data; wait_share = wait_s / wall_s,
      wall_s being the time since iter().
    - ready_mean: batches already waiting when next() was called (near 0: the loop is waiting
      for the loader; near prefetch: the loader is ahead).
    - collation: building each batch (sampling and gathering, on one thread).
    - user_s: of the collation time, the time inside a Python dataset's own code (__getitem__,
      __getitems__, collate_fn), summed over the worker threads; 0 for array sources.
    - copy: per GPU output, the GPU time of each batch's host-to-device copies (timed on the
      GPU between an event after the copies' waits and one after the copies).
    - release_wait: per GPU output, the time the copies waited for your work on the GPU (the
      training step queued ahead of them) to release the memory they write: the training
      step's time, not the loader's.
    - num_threads, prefetch, copy_streams: the settings the epoch runs with (copy_streams: host-to-
      device copy streams per GPU; ``streams`` is its old name, deprecated).
    - pinned_bytes, device_bytes, host_bytes: memory the loader's pools hold (batches you keep
      included); host_allocations, device_allocations: buffers allocated so far.
    - left_behind_threads: collation threads left behind so far (whole loader), stuck in a Python
      dataset's code when an epoch stopped (see timeout= in the README); each ends when its
      call returns, and is never waited for.
    - sources: a step-based loader's (a Mix, or steps=) per-source counts, by source name (see
      SourceStats); empty otherwise.
    - storage: for sources in object storage (s3://, https://), their counters since iter() (a
      Mix's remote sources added together): bytes_fetched, requests, hits and misses (files the
      collation threads found cached, or waited for), wait_s (time they waited for fetches),
      bytes_per_s (from storage while downloads ran), prefetched, evictions; cached_bytes of
      limit now; dataset_bytes and fetched_per_dataset (bytes_fetched over the source's bytes:
      1.0 when an epoch fetched each byte once). None when every source is local.
    - packing: for an fl.Pack source, the epoch's packing (PackingStats: rows, efficiency, ...);
      None otherwise.
    """

    epoch: int
    batches: int
    samples: int
    bytes: int
    wait_s: float
    wall_s: float
    ready_mean: float
    collation: StageStats
    copy: dict[str, StageStats] = field(default_factory=dict)
    release_wait: dict[str, float] = field(default_factory=dict)
    num_threads: int = 0
    prefetch: int = 0
    copy_streams: int = 0
    pinned_bytes: int = 0
    device_bytes: int = 0
    host_bytes: int = 0
    host_allocations: int = 0
    device_allocations: int = 0
    user_s: float = 0.0
    sources: dict[str, SourceStats] = field(default_factory=dict)
    left_behind_threads: int = 0
    storage: Any = None  # _storage/stats.py's StorageStats, or None: nothing read from object storage
    packing: PackingStats | None = None

    @property
    def streams(self) -> int:
        """The old name of copy_streams."""
        warnings.warn("LoaderStats.streams is renamed copy_streams", FutureWarning, stacklevel=2)
        return self.copy_streams

    @property
    def wait_share(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @classmethod
    def _from_native(cls, run: dict[str, Any], memory: dict[str, int],
                     sources: dict[str, SourceStats] | None = None, storage: Any = None,
                     packing: PackingStats | None = None) -> "LoaderStats":
        return cls(epoch=run["epoch"], batches=run["batches"], samples=run["samples"], bytes=run["bytes"],
                   wait_s=run["wait_s"], wall_s=run["wall_s"], ready_mean=run["ready_mean"],
                   collation=StageStats(**run["collation"]),
                   copy={k: StageStats(**v) for k, v in run["copy"].items()},
                   release_wait=dict(run.get("release_wait", {})),
                   num_threads=run["num_threads"], prefetch=run["prefetch"], copy_streams=run["copy_streams"],
                   pinned_bytes=memory["pinned_bytes"], device_bytes=memory["device_bytes"],
                   host_bytes=memory["host_bytes"], host_allocations=memory["host_allocations"],
                   device_allocations=memory["device_allocations"], user_s=run.get("user_s", 0.0),
                   sources=dict(sources or {}), left_behind_threads=run.get("left_behind_threads", 0),
                   storage=storage, packing=packing)

    def __str__(self) -> str:
        def ms(s: float) -> str:
            return f"{s * 1e3:.3f} ms"

        rows = [
            ("epoch", f"{self.epoch}"),
            ("handed out", f"{self.batches:,} batches, {self.samples:,} samples, {self.bytes / 1e6:,.1f} MB"),
            ("throughput", f"{self.samples_per_s:,.0f} samples/s over {self.wall_s:.2f} s"),
            ("data wait", f"{self.wait_s:.3f} s = {100 * self.wait_share:.1f}% of wall time"),
            ("ready at next()", f"{self.ready_mean:.2f} batches on average (prefetch {self.prefetch})"),
            ("collation", f"{self.collation.busy_s:.3f} s busy on {self.num_threads} threads; "
                          f"p50 {ms(self.collation.p50_s)}, p99 {ms(self.collation.p99_s)} per batch"),
        ]
        if self.user_s > 0:
            rows.append(("user code", f"{self.user_s:.3f} s in the dataset's __getitem__ "
                                      f"({100 * self.user_s / max(self.collation.busy_s, 1e-12):.0f}% of collation)"))
        for device, c in self.copy.items():
            rows.append((f"copy {device}", f"{c.busy_s:.3f} s; p50 {ms(c.p50_s)}, p99 {ms(c.p99_s)} per batch "
                                           f"({self.copy_streams} copy streams)"))
            waited = self.release_wait.get(device, 0.0)
            if waited > 0:
                rows.append((f"GPU step {device}", f"{waited:.3f} s: copies waited for your GPU work to release "
                                                   "batch memory"))
        for name, src in self.sources.items():
            rows.append((f"source {name}", f"{src.samples:,} samples handed out; {src.epochs:,} epochs completed "
                                           f"(position {src.position:,})"))
        st = self.storage
        if st is not None:
            rows.append(("storage", f"{st.bytes_fetched / 1e6:,.1f} MB fetched ({st.fetched_per_dataset:.2f}x the "
                                    f"dataset) in {st.requests:,} requests at {st.bytes_per_s / 1e6:,.1f} MB/s; "
                                    f"{st.prefetched:,} files prefetched"))
            rows.append(("storage cache", f"{st.hits:,} hits, {st.misses:,} misses; collation waited {st.wait_s:.3f} s "
                                          f"for fetches; {st.evictions:,} evictions; {st.cached_bytes / 1e6:,.1f} MB "
                                          f"cached of {st.limit / 1e6:,.1f} MB"))
        pk = self.packing
        if pk is not None:
            rows.append(("packing", f"epoch {pk.epoch}: {pk.documents:,} documents in {pk.rows:,} rows of {pk.length:,} "
                                    f"tokens, {100 * pk.efficiency:.2f}% tokens (not padding); planned in "
                                    f"{pk.planning_s:.3f} s"))
        rows.append(("memory", f"pinned {self.pinned_bytes / 1e6:,.1f} MB, device {self.device_bytes / 1e6:,.1f} MB, "
                               f"host {self.host_bytes / 1e6:,.1f} MB"))
        rows.append(("allocations", f"host {self.host_allocations}, device {self.device_allocations}"))
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def __repr__(self) -> str:
        return "LoaderStats(\n" + str(self) + "\n)"
