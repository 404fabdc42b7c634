"""Each tar shard indexed once (natively: fastload._C.tar_index) and the index kept in a cache
folder, keyed by the shard's path, size and modification time: a rewritten shard has another key
and is indexed again, never read with a stale index. The index holds per sample only what the
reads need (each field's offset and size, the key)."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from .. import _C

__all__ = ["ShardIndex", "default_index_root", "index_shards"]

_VERSION = 1  # of the cached file's layout: another version is another file name


class ShardIndex(NamedTuple):
    path: str
    size: int
    mtime_ns: int
    fields: list[str]           # in order of first occurrence in the shard
    keys: np.ndarray            # uint8: the sample keys back to back
    key_offsets: np.ndarray     # int64, samples + 1
    offsets: np.ndarray         # int64, samples x fields: a member's data offset, -1 if missing
    sizes: np.ndarray           # int64, samples x fields
    skipped_members: int        # members that belong to no sample (no suffix, metadata)

    @property
    def samples(self) -> int:
        return len(self.key_offsets) - 1

    def key(self, i: int) -> str:
        return bytes(self.keys[self.key_offsets[i]:self.key_offsets[i + 1]]).decode("utf-8", "replace")


def default_index_root() -> str:
    """Beside the object-storage cache: XDG_CACHE_HOME (or ~/.cache)/fastload/tar-index."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return os.path.join(os.path.expanduser(base), "fastload", "tar-index")


def _stat(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _cache_name(path: str, size: int, mtime_ns: int) -> tuple[str, str]:
    stem = hashlib.blake2b(os.path.realpath(path).encode("utf-8", "surrogateescape"), digest_size=12).hexdigest()
    return stem, f"{stem}-{size}-{mtime_ns}.v{_VERSION}.npz"


def _load(file: str, path: str, size: int, mtime_ns: int) -> ShardIndex | None:
    try:
        with np.load(file, allow_pickle=False) as z:
            fields = json.loads(bytes(z["fields"]).decode("utf-8"))
            return ShardIndex(path, size, mtime_ns, fields, z["keys"], z["key_offsets"], z["offsets"], z["sizes"],
                              int(z["skipped"]))
    except (OSError, ValueError, KeyError):  # unreadable or cut short: indexed again
        return None


def _save(root: str, stem: str, name: str, ix: ShardIndex) -> None:
    """Written beside, then renamed into place (readers never see half a file); older indexes of
    the same shard are removed. A cache folder that cannot be written costs a re-index next time."""
    try:
        os.makedirs(root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{stem}-", suffix=".tmp", dir=root)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, fields=np.frombuffer(json.dumps(ix.fields).encode("utf-8"), dtype=np.uint8), keys=ix.keys,
                         key_offsets=ix.key_offsets, offsets=ix.offsets, sizes=ix.sizes,
                         skipped=np.int64(ix.skipped_members))
            os.replace(tmp, os.path.join(root, name))
        except BaseException:
            os.unlink(tmp)
            raise
        for old in os.listdir(root):
            if old.startswith(stem + "-") and old != name and old.endswith(".npz"):
                try:
                    os.unlink(os.path.join(root, old))
                except OSError:
                    pass
    except OSError:
        pass


def index_shard(path: str, root: str) -> ShardIndex:
    """The index of one shard: from the cache when it matches the shard's size and time, else built."""
    size, mtime_ns = _stat(path)
    stem, name = _cache_name(path, size, mtime_ns)
    cached = _load(os.path.join(root, name), path, size, mtime_ns)
    if cached is not None:
        return cached
    for _ in range(3):  # a shard rewritten while it was indexed is indexed again
        d = _C.tar_index(path)
        after = _stat(path)
        if after == (size, mtime_ns) and d["size"] == size:
            break
        size, mtime_ns = after
    else:
        raise ValueError(f"tar shard {path!r} kept changing while it was indexed")
    stem, name = _cache_name(path, size, mtime_ns)
    ix = ShardIndex(path, size, mtime_ns, list(d["fields"]), d["keys"], d["key_offsets"], d["offsets"], d["sizes"],
                    int(d["skipped_members"]))
    _save(root, stem, name, ix)
    return ix


def index_shards(paths: list[str], root: str | None) -> list[ShardIndex]:
    """Every shard's index, in order; shards indexed in parallel (natively, the GIL released)."""
    root = os.path.expanduser(root) if root is not None else default_index_root()
    if len(paths) == 1:
        return [index_shard(paths[0], root)]
    with ThreadPoolExecutor(max_workers=min(8, len(paths), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda p: index_shard(p, root), paths))
