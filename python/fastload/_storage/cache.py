"""The on-disk cache of one remote dataset: a folder of whole objects, each either complete and
verified under its final name or absent. Shared by the processes of a node through the file
system only: a download holds an exclusive flock on the object's lock file, writes a temporary
name, verifies size (and checksum) and renames into place; a process killed mid-download leaves
a temporary file whose lock the kernel released, which the next fetch (or the next open) removes.
No shared-memory segment, no daemon: nothing outlives a crash but files the next run recognises."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from typing import Any, BinaryIO, Callable, Iterator

from .urls import Url

_PART = ".part-"  # <name>.part-<pid>-<random>: a download in progress (or abandoned)
_LOCK = ".lock"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}


def parse_size(value: Any, what: str = "cache_limit") -> int:
    """Bytes from an int or a string such as "50GB", "512MiB", "1.5 TB"."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be bytes (an int) or a size such as '50GB', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"{what} must be positive, got {value}")
        return value
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
        if m and m.group(2).upper() in _UNITS:
            n = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
            if n > 0:
                return n
        raise ValueError(f"{what} must be a size such as '50GB' or '512MiB', got {value!r}")
    raise TypeError(f"{what} must be bytes (an int) or a size such as '50GB', got {type(value).__name__}")


def default_cache_root() -> str:
    """A per-user folder under the platform's cache directory (XDG_CACHE_HOME or ~/.cache);
    never /dev/shm: cached shards are files, not shared-memory segments."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return os.path.join(os.path.expanduser(base), "fastload", "remote")  # a quoted "~/..." in the variable too


def cache_key(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.hexdigest()


def default_limit(folder: str) -> int:
    """Half the free space of the file system that holds the cache (at least 1 GiB)."""
    probe = folder
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "."
    st = os.statvfs(probe)
    return max(1 << 30, st.f_bavail * st.f_frsize // 2)


def cache_too_small(limit: int, need: int, what: str, way_out: str = "") -> ValueError:
    """The one "cache too small" error (at open, for the collation threads, for one step): what
    needs `need` bytes at once against cache_limit, the least to raise it to, and another way out."""
    return ValueError(f"cache_limit is {limit} bytes, {what}: raise cache_limit to at least {need} bytes{way_out}")


class Entry:
    """One object of the dataset: where it comes from, its local name, what verifies it, and the
    version every GET of it is pinned to (the ETag or generation seen at open; None: unpinned)."""

    __slots__ = ("url", "rel", "size", "verify", "version")

    def __init__(self, url: Url, rel: str, size: int, verify: Any = None,  # verify: a client_protocol.BodyCheck
                 version: str | None = None):
        self.url, self.rel, self.size, self.verify, self.version = url, rel, size, verify, version or None


@contextlib.contextmanager
def no_space_explained(folder: str, url: Any, needed: int, limit: int | None) -> Iterator[None]:
    """A full file system (or quota) under the cache is an error that names the folder, the
    space free there, what was being written and cache_limit, not a bare "No space left"."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        try:
            st = os.statvfs(folder)
            free = f"{st.f_bavail * st.f_frsize} bytes free there"
        except OSError:
            free = "its free space unknown"
        bound = "" if limit is None else f"; cache_limit is {limit} bytes"
        raise OSError(e.errno, f"{url}: {os.strerror(e.errno)} in the cache folder {folder} ({free}, {needed} bytes "
                               f"to write{bound}): free space there, lower cache_limit, or pass a cache_dir on a file "
                               "system with room") from None


class ObjectCache:
    """The folder `root` of one dataset's objects (complete, verified files by relative name)."""

    def __init__(self, root: str, limit: int | None = None):
        self.root, self.limit = root, limit  # limit: for the messages of a full file system
        with no_space_explained(os.path.dirname(root) or ".", root, 0, limit):
            os.makedirs(root, exist_ok=True)
        self.removed_partials = self._remove_abandoned()

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel)

    def present(self, entry: Entry) -> os.stat_result | None:
        """The stat of the complete file, or None. A file of the wrong size under the final name
        (a copy made by hand, a disk that lost data) is not the object: removed, fetched again."""
        try:
            st = os.stat(self.path(entry.rel))
        except FileNotFoundError:
            return None
        if st.st_size != entry.size:
            self.remove(entry)
            return None
        return st

    def scan(self) -> dict[str, int]:
        """Relative name -> bytes of every complete object in the folder now (any process's)."""
        # os.scandir and names joined as strings: an eviction walks the folder, and a cache of
        # 10^4 small files (an image folder) made relpath and os.walk most of each eviction's cost.
        out: dict[str, int] = {}
        folders = [("", self.root)]
        while folders:
            rel, folder = folders.pop()
            try:
                entries = list(os.scandir(folder))
            except FileNotFoundError:
                continue
            for e in entries:
                name = e.name
                if e.is_dir():  # as os.walk: a link to a folder is not walked, nor a file
                    if not e.is_symlink():
                        folders.append((rel + name + os.sep, e.path))
                elif not (name.endswith(_LOCK) or _PART in name or name == "manifest.json"):
                    try:
                        out[rel + name] = e.stat().st_size
                    except FileNotFoundError:
                        pass
        return out

    def remove(self, entry: Entry) -> None:
        try:
            os.unlink(self.path(entry.rel))
        except FileNotFoundError:
            pass

    def put(self, rel: str, data: bytes) -> None:
        """A small file written whole (the manifest's copy), by the protocol of a download: under
        the flock of its lock file, to a temporary name, renamed into place. Another process that
        opens the folder meanwhile removes only partial files whose lock nobody holds, so it
        leaves this one alone."""
        path = self.path(rel)
        with no_space_explained(self.root, path, len(data), self.limit), _locked(path):
            _write_renamed(path, lambda out: out.write(data))

    def fetch(self, entry: Entry, get: Callable[..., int]) -> tuple[os.stat_result, int]:
        """Makes the object present: (its stat, bytes this process downloaded: 0 if another
        process had it or fetched it meanwhile). One download per node: the flock on its lock
        file is held while it downloads, verifies and renames."""
        path = self.path(entry.rel)
        pinned = {"version": entry.version} if entry.version else {}
        with no_space_explained(self.root, entry.url, entry.size, self.limit), _locked(path):
            st = self.present(entry)
            if st is not None:
                return st, 0
            self._remove_partials(path)  # the lock is ours: any partial file is abandoned
            # size and checksum checked by get; the version pinned, if any (a rewrite is an error)
            n = _write_renamed(path, lambda out: get(entry.url, out, entry.size, entry.verify, **pinned))
            return os.stat(path), n

    @staticmethod
    def _remove_partials(path: str) -> None:
        folder, base = os.path.split(path)
        for name in os.listdir(folder):
            if name.startswith(base + _PART):
                try:
                    os.unlink(os.path.join(folder, name))
                except FileNotFoundError:
                    pass

    def _remove_abandoned(self) -> int:
        """Partial downloads whose lock no process holds (their writer died): removed at open."""
        removed = 0
        for dirpath, _, names in os.walk(self.root):
            for name in names:
                if _PART not in name:
                    continue
                final = os.path.join(dirpath, name.split(_PART, 1)[0])
                try:
                    fd = os.open(final + _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                except OSError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue  # a live download
                try:
                    os.unlink(os.path.join(dirpath, name))
                    removed += 1
                except FileNotFoundError:
                    pass
                finally:
                    os.close(fd)
        return removed


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """The exclusive flock of `path`'s lock file (waiting for it releases the GIL): whoever holds
    it writes `path`, and its partial files are not abandoned (ObjectCache._remove_abandoned)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock_fd = os.open(path + _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock_fd)  # releases the flock


def _write_renamed(path: str, write: Callable[[BinaryIO], int]) -> int:
    """write(out) into a temporary file beside `path` (a partial file's name), then renamed
    into place; on any failure the temporary file is removed and nothing is at `path`."""
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + f"{_PART}{os.getpid()}-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w+b") as out:
            n = write(out)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return n


def clear(root: str) -> None:
    """Removes one dataset's cache folder (tests, and users who want the space back)."""
    shutil.rmtree(root, ignore_errors=True)
