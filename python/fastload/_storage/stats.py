"""The counters of a remote source (StorageStats): what its fetcher downloaded, how the cache
served the collation threads, and how many times over the source's bytes that was."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StorageStats:
    """Counters of one remote source since it was opened (all processes' downloads are not
    included: a file another process fetched is a hit here)."""
    bytes_fetched: int = 0  # bytes this process downloaded
    requests: int = 0  # GETs sent (retries included)
    hits: int = 0  # files the collation threads found in the cache
    misses: int = 0  # files they had to wait for (a fetch in flight or one they started)
    wait_s: float = 0.0  # time collation threads waited for fetches
    prefetched: int = 0  # files the fetcher downloaded ahead of need
    evictions: int = 0
    cached_bytes: int = 0  # bytes in the cache folder now
    limit: int = 0  # the cache_limit
    fetch_busy_s: float = 0.0  # time at least one download was running
    dataset_bytes: int = 0  # the bytes of every file of the source (a Mix's remote sources: added)

    @property
    def bytes_per_s(self) -> float:
        """Bytes from storage per second while downloads ran."""
        return self.bytes_fetched / self.fetch_busy_s if self.fetch_busy_s > 0 else 0.0

    @property
    def fetched_per_dataset(self) -> float:
        """bytes_fetched over dataset_bytes: 1.0 for an epoch that fetched each byte once, above it
        when a cache smaller than the data fetched shards again (docs/object-storage.md says
        when), 0.0 for an epoch served from the cache."""
        return self.bytes_fetched / self.dataset_bytes if self.dataset_bytes > 0 else 0.0

    def since(self, before: "StorageStats") -> "StorageStats":
        """The counts since `before` (an earlier snapshot); cached_bytes, limit and dataset_bytes
        as they are now."""
        out = StorageStats(**{k: getattr(self, k) for k in StorageStats.__dataclass_fields__})
        for k in _COUNTS:
            setattr(out, k, getattr(self, k) - getattr(before, k))
        return out

    def plus(self, other: "StorageStats") -> "StorageStats":
        """Two sources' counts together (cache use, limits and dataset bytes added too)."""
        return StorageStats(**{k: getattr(self, k) + getattr(other, k) for k in StorageStats.__dataclass_fields__})


_COUNTS = ("bytes_fetched", "requests", "hits", "misses", "wait_s", "prefetched", "evictions", "fetch_busy_s")
