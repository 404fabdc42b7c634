"""Writing dataset directories: write_dataset for data in memory, DatasetWriter for data that
arrives in chunks. Everything goes into a temporary directory beside the target, which is
renamed into place only after the last shard and the manifest are on disk: an interrupted write
leaves no directory that opens as valid."""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

import numpy as np
import torch

from .. import _C
from .._arguments import as_int
from .._sources.directory import CHECKSUM, FORMAT, MANIFEST, VERSION
from .._sources.manifest import Bad, check_names
from .._columns.ragged import Ragged
from .replace import check_replaceable, clean_leftovers, publish, temporary_name

_SHARD_BYTES = 64 << 20  # default shard size when rows_per_shard is not given
_BUFFER = 1 << 20
_OVERLAP_BYTES = 1 << 20  # writes at least this large are hashed on the helper thread
_SAFE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_PLACEHOLDER = 10**15  # reserves header room for a values file whose length is not known yet


def _npy_header(dtype: np.dtype, shape: tuple[int, ...], total: int | None = None) -> bytes:
    """A version 1.0 .npy header, padded with spaces to `total` bytes (or to a multiple of 64), so
    that a file can be rewritten in place with its final shape."""
    d = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (np.lib.format.dtype_to_descr(dtype), tuple(shape))
    body = d.encode("latin1")
    fixed = 10  # magic, version, header length
    size = total if total is not None else -(-(fixed + len(body) + 1) // 64) * 64
    pad = size - fixed - len(body) - 1
    if pad < 0 or size - fixed > 0xFFFF:
        raise ValueError(f"an .npy header for {dtype} {shape} does not fit {size} bytes")
    return b"\x93NUMPY\x01\x00" + (size - fixed).to_bytes(2, "little") + body + b" " * pad + b"\n"


def _as_numpy(name: str, value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        if value.device.type != "cpu":
            raise ValueError(f"column {name!r} must be on the CPU to be written, got a tensor on {value.device}")
        if value.dtype == torch.bfloat16:
            raise TypeError(f"column {name!r}: bfloat16 has no .npy dtype; write it as .view(torch.int16)")
        value = value.detach().resolve_conj().resolve_neg().numpy()
    a = np.asarray(value)
    if a.ndim == 0:
        raise ValueError(f"column {name!r} must have one row per sample, got a 0-d value")
    if a.dtype.kind not in "iufcb":
        raise TypeError(f"column {name!r} has unsupported dtype {a.dtype}; fastload takes bool and numeric dtypes")
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a


def _as_ragged(name: str, value: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """(values, offsets) if the chunk's value is a ragged column, else None."""
    if isinstance(value, Ragged):
        if len(value._values) != 1:
            raise ValueError(f"column {name!r}: write a sharded Ragged one shard at a time")
        return _as_numpy(name, value._values[0]), value._offsets[0]
    if isinstance(value, tuple) and len(value) == 2:
        r = Ragged(value[0], value[1])
        return _as_numpy(name, r._values[0]), r._offsets[0]
    if isinstance(value, list) and value and np.ndim(value[0]) >= 1:  # a list of rows
        r = Ragged.from_rows(value)
        return r._values[0], r._offsets[0]
    return None


class _OpenFile:
    """One .npy file being written: header reserved, data appended, checksum running (the core's
    Checksum64, several GB/s; zlib's crc32 ran at 1.5-2 GB/s here). A large write is hashed on a
    helper thread while this thread copies the same bytes into the page cache (both release the
    GIL); the hash is done before write() returns, since the caller may reuse its buffer."""

    def __init__(self, root: str, rel: str, dtype: np.dtype, shape_hint: tuple[int, ...], syncer: "_Syncer | None",
                 checksum: bool, hasher: ThreadPoolExecutor | None = None):
        self.rel, self.path, self.dtype = rel, os.path.join(root, rel), dtype
        self.header_len = len(_npy_header(dtype, shape_hint))
        self.f = open(self.path, "wb", buffering=_BUFFER)
        self.f.write(b"\0" * self.header_len)
        self.hash = _C.Checksum64() if checksum else None
        self.syncer, self.hasher = syncer, hasher
        self.count = 0  # leading-axis entries written

    def write(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a)
        view = memoryview(a).cast("B") if a.nbytes else b""
        if self.hash is not None and self.hasher is not None and len(view) >= _OVERLAP_BYTES:
            done = self.hasher.submit(self.hash.update, view)
            try:
                self.f.write(view)
            finally:
                done.result()
        else:
            if self.hash is not None:
                self.hash.update(view)
            self.f.write(view)
        self.count += len(a)

    def finish(self, shape: tuple[int, ...]) -> dict[str, Any]:
        self.f.seek(0)
        self.f.write(_npy_header(self.dtype, shape, self.header_len))
        self.f.flush()
        if self.syncer is not None:
            self.syncer.sync_and_close(self.f)
        else:
            self.f.close()
        entry: dict[str, Any] = {"path": self.rel, "offset": self.header_len, "shape": list(shape)}
        if self.hash is not None:
            entry[CHECKSUM] = self.hash.hexdigest()
        return entry

    def abandon(self) -> None:
        try:
            self.f.close()
        except OSError:
            pass


def _fsync_close(f: Any) -> None:
    try:
        os.fsync(f.fileno())
    finally:
        f.close()


class _Syncer:
    """fsyncs finished shards on a helper thread while the next shards are written, so the disk
    writes back one shard while the page cache fills with the next (an fsync on the writing thread
    would leave the disk idle during every write); at most `ahead` shards wait for theirs."""

    def __init__(self, ahead: int = 2):
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fastload-fsync")
        self._pending: list[Any] = []
        self._ahead = ahead

    def sync_and_close(self, f: Any) -> None:
        self._pending.append(self._pool.submit(_fsync_close, f))
        while len(self._pending) > self._ahead:
            self._pending.pop(0).result()

    def drain(self) -> None:
        """Waits for every pending fsync; raises the first failure."""
        try:
            while self._pending:
                self._pending.pop(0).result()
        finally:
            self._pool.shutdown(wait=True)

    def abandon(self) -> None:
        for fut in self._pending:
            try:
                fut.result()
            except OSError:
                pass
        self._pending = []
        self._pool.shutdown(wait=True)


def _directories(names: list[str]) -> list[str]:
    """A directory per column: its name where that is a plain file name, else column<k>; never the
    manifest's name, and never two that differ only in case (one directory on a case-insensitive
    filesystem)."""
    used = {MANIFEST.casefold()}
    out = []
    for k, name in enumerate(names):
        base = name if _SAFE.match(name) and name not in (".", "..") else f"column{k}"
        d, n = base, 1
        while d.casefold() in used:
            d, n = f"{base}-{n}", n + 1
        used.add(d.casefold())
        out.append(d)
    return out


class _Column:
    def __init__(self, name: str, directory: str, sample: Any):
        self.name = name
        self.dir = directory
        ragged = _as_ragged(name, sample)
        self.ragged = ragged is not None
        a = ragged[0] if ragged is not None else _as_numpy(name, sample)
        self.dtype, self.row_shape = a.dtype, tuple(int(s) for s in a.shape[1:])
        self.longest = 0
        self.files: list[_OpenFile] = []

    def row_bytes_hint(self, chunk_value: Any) -> float:
        if not self.ragged:
            return self.dtype.itemsize * float(np.prod(self.row_shape))
        values, offsets = _as_ragged(self.name, chunk_value)  # type: ignore[misc]
        rows = max(len(offsets) - 1, 1)
        return values.nbytes / rows + 8

    def describe(self) -> dict[str, Any]:
        d = {"name": self.name, "kind": "ragged" if self.ragged else "fixed", "dtype": self.dtype.str,
             "row_shape": list(self.row_shape)}
        if self.ragged:
            d["longest"] = self.longest
        return d


class DatasetWriter:
    """Writes a dataset directory from chunks of any size:

        with fl.DatasetWriter("data/train", rows_per_shard=100_000) as w:
            for chunk in chunks:            # {"x": (n, 32) float32, "tokens": (values, offsets), ...}
                w.append(chunk)

    Columns, dtypes and row shapes come from the first chunk; every chunk names the same columns.
    A ragged column is given as fastload.Ragged, (values, offsets) or a list of 1-D arrays. The
    directory appears at `path` when the `with` block ends without an exception (or at close());
    until then, and forever if the write fails or is interrupted, there is only a hidden temporary
    directory beside it.
    """

    def __init__(self, path: str | os.PathLike, rows_per_shard: int | None = None, *, overwrite: bool = False,
                 checksum: bool = True, fsync: bool = True):
        self.path = os.path.abspath(os.fspath(path))
        if rows_per_shard is not None:
            rows_per_shard = as_int("rows_per_shard", rows_per_shard)
            if rows_per_shard <= 0:
                raise ValueError(f"rows_per_shard must be positive, got {rows_per_shard}")
        for n, flag in (("overwrite", overwrite), ("checksum", checksum), ("fsync", fsync)):
            if not isinstance(flag, bool):
                raise TypeError(f"{n} must be a bool, got {flag!r}")
        parent, base = os.path.split(self.path)
        if not os.path.isdir(parent):
            raise FileNotFoundError(f"{parent}: the parent directory of the dataset does not exist")
        if not base:
            raise ValueError(f"refusing to write a dataset at {self.path}: it is the filesystem root")
        clean_leftovers(parent, base, self.path)
        if os.path.lexists(self.path) and not overwrite:
            raise FileExistsError(f"{self.path} exists; pass overwrite=True to replace it")
        if overwrite:
            check_replaceable(self.path)  # before writing anything: only a dataset is ever replaced
        self.rows_per_shard = rows_per_shard
        self._overwrite, self._checksum, self._fsync = overwrite, checksum, fsync
        self._tmp = temporary_name(parent, base)
        os.mkdir(self._tmp)
        self._columns: list[_Column] | None = None
        self._shards: list[dict[str, Any]] = []
        self._shard_rows = 0  # rows in the open shard
        self._rows = 0
        self._state = "open"
        self._syncer = _Syncer() if fsync else None
        self._hasher = ThreadPoolExecutor(1, thread_name_prefix="fastload-hash") if checksum else None

    # ------------------------------------------------------------------ appending
    def append(self, chunk: Mapping[str, Any]) -> None:
        """Appends rows: chunk maps every column name to that many rows (any number, 0 included)."""
        if self._state != "open":
            raise RuntimeError(f"this DatasetWriter is {self._state}")
        if not isinstance(chunk, Mapping) or not chunk:
            raise TypeError(f"chunk must be a non-empty mapping of column name -> rows, got {type(chunk).__name__}")
        try:
            self._append(chunk)
        except BaseException:
            self.abort()
            raise

    def _append(self, chunk: Mapping[str, Any]) -> None:
        if self._columns is None:
            for name in chunk:
                if not isinstance(name, str) or not name:
                    raise TypeError(f"column names must be non-empty strings, got {name!r}")
            dirs = _directories(list(chunk))
            self._columns = [_Column(name, d, v) for d, (name, v) in zip(dirs, chunk.items())]
            try:  # the rule Dataset and Dataset.open apply: a batch key must mean one thing
                check_names([c.name for c in self._columns], [c.ragged for c in self._columns])
            except Bad as e:
                raise ValueError(f"column name {e.message}") from None
            for c in self._columns:
                os.mkdir(os.path.join(self._tmp, c.dir))
            if self.rows_per_shard is None:
                row = sum(c.row_bytes_hint(chunk[c.name]) for c in self._columns)
                self.rows_per_shard = max(1, int(_SHARD_BYTES // max(row, 1.0)))
        names = [c.name for c in self._columns]
        if list(chunk) != names and set(chunk) != set(names):
            raise ValueError(f"chunk columns {list(chunk)} differ from the first chunk's {names}")
        data: list[Any] = []
        rows = None
        for c in self._columns:
            v = chunk[c.name]
            if c.ragged:
                r = _as_ragged(c.name, v)
                if r is None:
                    raise TypeError(f"column {c.name!r} is ragged: give Ragged, (values, offsets) or a list of arrays")
                values, offsets = r
                n, shape, dtype = len(offsets) - 1, values.shape[1:], values.dtype
            else:
                if _as_ragged(c.name, v) is not None:
                    raise TypeError(f"column {c.name!r} was fixed-size in the first chunk, got a ragged value")
                values = _as_numpy(c.name, v)
                n, shape, dtype, offsets = len(values), values.shape[1:], values.dtype, None
            if dtype != c.dtype or tuple(shape) != c.row_shape:
                raise ValueError(f"column {c.name!r}: chunk has {dtype} rows of shape {tuple(shape)}, the first "
                                 f"chunk {c.dtype} {c.row_shape}")
            if rows is not None and n != rows:
                raise ValueError(f"chunk columns must have equal rows, got {c.name!r} with {n} and others with {rows}")
            rows = n
            data.append((values, offsets))
        done = 0
        while done < rows:
            if self._shard_rows == 0:
                self._open_shard()
            take = min(rows - done, self.rows_per_shard - self._shard_rows)
            for c, (values, offsets) in zip(self._columns, data):
                if not c.ragged:
                    c.files[0].write(values[done:done + take])
                    continue
                first, last = int(offsets[done]), int(offsets[done + take])
                vfile, ofile = c.files
                base = vfile.count
                c.files[0].write(values[first:last])
                ofile.write(offsets[done + 1:done + take + 1] - first + base)
                if take:
                    c.longest = max(c.longest, int(np.diff(offsets[done:done + take + 1]).max()))
            done += take
            self._shard_rows += take
            self._rows += take
            if self._shard_rows == self.rows_per_shard:
                self._close_shard()

    def _open_shard(self) -> None:
        k = len(self._shards)
        for c in self._columns:
            if c.ragged:
                c.files = [_OpenFile(self._tmp, f"{c.dir}/{k:06d}.values.npy", c.dtype, (_PLACEHOLDER,) + c.row_shape,
                                     self._syncer, self._checksum, self._hasher),
                           _OpenFile(self._tmp, f"{c.dir}/{k:06d}.offsets.npy", np.dtype("<i8"), (_PLACEHOLDER,),
                                     self._syncer, self._checksum, self._hasher)]
                c.files[1].write(np.zeros(1, dtype=np.int64))
            else:
                c.files = [_OpenFile(self._tmp, f"{c.dir}/{k:06d}.npy", c.dtype, (self.rows_per_shard,) + c.row_shape,
                                     self._syncer, self._checksum, self._hasher)]

    def _close_shard(self) -> None:
        entries: dict[str, Any] = {}
        rows = self._shard_rows
        for c in self._columns:
            if c.ragged:
                vfile, ofile = c.files
                entries[c.name] = {"values": vfile.finish((vfile.count,) + c.row_shape),
                                   "offsets": ofile.finish((rows + 1,))}
            else:
                entries[c.name] = c.files[0].finish((rows,) + c.row_shape)
            c.files = []
        self._shards.append({"rows": rows, "columns": entries})
        self._shard_rows = 0

    # ------------------------------------------------------------------ finishing
    def close(self) -> None:
        """Finishes the last shard, writes the manifest and moves the directory into place."""
        if self._state == "closed":
            return
        if self._state != "open":
            raise RuntimeError(f"this DatasetWriter is {self._state}")
        try:
            if self._shard_rows:
                self._close_shard()
            if self._rows == 0:
                raise ValueError("nothing was appended: a dataset needs at least one row")
            if self._syncer is not None:
                self._syncer.drain()  # every shard is on disk before the manifest names it
            # id: this write, whatever its contents (a pickled Dataset checks it reopens this one).
            manifest = {"format": FORMAT, "version": VERSION, "id": secrets.token_hex(16), "rows": self._rows, "checksum":
                        CHECKSUM if self._checksum else None, "rows_per_shard": self.rows_per_shard,
                        "columns": [c.describe() for c in self._columns], "shards": self._shards}
            mpath = os.path.join(self._tmp, MANIFEST)
            with open(mpath, "w") as f:
                json.dump(manifest, f, separators=(",", ":"))
                f.flush()
                if self._fsync:
                    os.fsync(f.fileno())
            self._sync_dirs()
            self._publish()
        except BaseException:
            self.abort()
            raise
        self._state = "closed"
        self._stop_hasher()

    def _stop_hasher(self) -> None:
        if self._hasher is not None:
            self._hasher.shutdown(wait=True)
            self._hasher = None

    def _sync_dirs(self) -> None:
        if not self._fsync:
            return
        for d in [os.path.join(self._tmp, c.dir) for c in self._columns] + [self._tmp]:
            fd = os.open(d, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def _publish(self) -> None:
        publish(self._tmp, self.path, self._overwrite, self._fsync)

    def abort(self) -> None:
        """Discards everything written; `path` is left as it was."""
        if self._state != "open":
            return
        self._state = "aborted"
        for c in self._columns or []:
            for f in c.files:
                f.abandon()
        if self._syncer is not None:
            self._syncer.abandon()
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._stop_hasher()

    def __enter__(self) -> "DatasetWriter":
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self) -> None:
        try:
            self.abort()  # never closed: nothing appears at path
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def __repr__(self) -> str:
        return f"DatasetWriter({self.path!r}, {self._rows} rows in {len(self._shards)} shards so far, {self._state})"


def write_dataset(path: str | os.PathLike, columns: Mapping[str, Any], rows_per_shard: int | None = None, *,
                  overwrite: bool = False, checksum: bool = True, fsync: bool = True) -> None:
    """Writes in-memory columns (arrays, CPU tensors, ragged columns) as a dataset directory of
    .npy shards with rows_per_shard rows each (default: about 64 MiB per shard)."""
    if not isinstance(columns, Mapping) or not columns:
        raise TypeError(f"columns must be a non-empty mapping of name -> array, got {type(columns).__name__}")
    with DatasetWriter(path, rows_per_shard, overwrite=overwrite, checksum=checksum, fsync=fsync) as w:
        w.append(columns)
