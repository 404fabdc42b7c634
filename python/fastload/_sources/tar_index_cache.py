"""Each tar shard indexed once (natively: fastload._C.tar_index) and the index kept in a cache
folder, keyed by the shard's pin: a local file's path, size, modification time and inode, an
object's URL, size and version. A rewritten shard has another key and is indexed again, never
read with a stale index. The index holds per sample only what the reads need (each field's
offset and size, the key)."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import numpy as np

from .. import _C

__all__ = ["ShardIndex", "default_index_root", "index_shards"]

_VERSION = 1  # of the cached file's layout: another version is another file name


class ShardIndex(NamedTuple):
    name: str                   # the path or URL, as the user named it
    file: int                   # its place in the FileSet
    size: int
    pin: tuple                  # FileSet's pin: (path, size, mtime_ns, inode) or (url, size, version)
    identity: tuple             # (st_dev, st_ino, st_mtime_ns, st_size) of a local file; zeros for an object
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


def _cache_name(first: str, pin: tuple) -> tuple[str, str]:
    """(the shard's stem: the same for every version of it, the file name of this version)."""
    stem = hashlib.blake2b(first.encode("utf-8", "surrogateescape"), digest_size=12).hexdigest()
    version = hashlib.blake2b(repr(tuple(pin[1:])).encode(), digest_size=8).hexdigest()
    return stem, f"{stem}-{version}.v{_VERSION}.npz"


def _load(file: str) -> dict | None:
    try:
        with np.load(file, allow_pickle=False) as z:
            return {"fields": json.loads(bytes(z["fields"]).decode("utf-8")), "keys": z["keys"],
                    "key_offsets": z["key_offsets"], "offsets": z["offsets"], "sizes": z["sizes"],
                    "skipped_members": int(z["skipped"])}
    except (OSError, ValueError, KeyError):  # unreadable or cut short: indexed again
        return None


def _save(root: str, stem: str, name: str, d: dict) -> None:
    """Written beside, then renamed into place (readers never see half a file); older indexes of
    the same shard are removed. A cache folder that cannot be written costs a re-index next time."""
    try:
        os.makedirs(root, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{stem}-", suffix=".tmp", dir=root)
        try:
            with os.fdopen(fd, "wb") as f:
                np.savez(f, fields=np.frombuffer(json.dumps(list(d["fields"])).encode("utf-8"), dtype=np.uint8),
                         keys=d["keys"], key_offsets=d["key_offsets"], offsets=d["offsets"], sizes=d["sizes"],
                         skipped=np.int64(d["skipped_members"]))
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


def _identity(path: str) -> tuple:
    st = os.stat(path)
    return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)


def index_shard(files: Any, k: int, root: str) -> ShardIndex:
    """The index of file k of a FileSet: from the cache when its pin matches, else built (an
    object is fetched into the cache for it)."""
    name = files.names[k]
    if files.fetched:
        pin, identity = tuple(files.pins[k]), (0, 0, 0, 0)
        stem, file = _cache_name(name, pin)
        d = _load(os.path.join(root, file))
        if d is None:
            d = files.opened(k, _C.tar_index)
            _save(root, stem, file, d)
    else:
        identity = _identity(name)
        for _ in range(3):  # a shard rewritten while it was indexed is indexed again
            pin = (os.path.realpath(name), identity[3], identity[2], identity[1])
            stem, file = _cache_name(pin[0], pin)
            d = _load(os.path.join(root, file))
            if d is not None:
                break
            d = _C.tar_index(name)
            now = _identity(name)
            if now == identity and d["size"] == identity[3]:
                _save(root, stem, file, d)
                break
            identity = now
        else:
            raise ValueError(f"tar shard {name!r} kept changing while it was indexed")
    return ShardIndex(name, k, int(pin[1]), pin, identity, list(d["fields"]), d["keys"], d["key_offsets"],
                      d["offsets"], d["sizes"], int(d["skipped_members"]))


def index_shards(files: Any, root: str | None) -> list[ShardIndex]:
    """Every shard's index, in order; shards indexed in parallel (natively, the GIL released)."""
    root = os.path.expanduser(root) if root is not None else default_index_root()
    if len(files) == 1:
        return [index_shard(files, 0, root)]
    with ThreadPoolExecutor(max_workers=min(8, len(files), os.cpu_count() or 1)) as pool:
        return list(pool.map(lambda k: index_shard(files, k, root), range(len(files))))
