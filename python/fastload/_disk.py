"""Dataset directories on disk: the manifest format, and opening one as a Dataset whose columns
are lists of memory-mapped .npy shards.

A directory holds manifest.json and, per column, one .npy file per shard (a ragged column: a
values and an offsets file per shard). Opening reads only the manifest and stats the files (no
data pages); the shards are mapped when a Loader first needs them. The opened Dataset keeps the
mapped arrays (never their addresses: descriptions are made from them each time), checks every
file's size at each iter(), and pickles or deep-copies as its path (opened again on arrival).
"""
from __future__ import annotations

import copy
import io
import json
import math
import mmap
import os
import threading
from typing import Any, Mapping

import numpy as np

from . import _C
from ._columns import ColumnSpec, ColumnState, _FileBacking, check_column_state, column_state
from ._ragged import Ragged
from ._columns import array_source
from ._shards import describe_shards, output_names
from ._source import redeclare as _redeclare

MANIFEST = "manifest.json"
FORMAT = "fastload-dataset"
VERSION = 1
CHECKSUM = "fl64"  # fastload._C.Checksum64 of each file's data bytes (after the .npy header), hex
_VERIFY_CHUNK = 16 << 20


class DatasetError(ValueError):
    """A dataset directory that cannot be opened as valid: missing, truncated or corrupt shards,
    a manifest that disagrees with its files, an unknown format version. The message names the file."""


def checksum_file(path: str, offset: int, nbytes: int) -> str:
    h = _C.Checksum64()
    buf = bytearray(min(_VERIFY_CHUNK, max(nbytes, 1)))
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        f.seek(offset)
        left = nbytes
        while left > 0:
            n = f.readinto(view[:min(left, len(buf))])
            if not n:
                break
            h.update(view[:n])
            left -= n
    return h.hexdigest()


class _File:
    """One .npy file of the directory as the manifest describes it."""

    __slots__ = ("path", "offset", "shape", "dtype", "checksum")

    def __init__(self, root: str, entry: Any, dtype: np.dtype, what: str):
        try:
            rel = entry["path"]
            self.offset = int(entry["offset"])
            self.shape = tuple(int(s) for s in entry["shape"])
            self.checksum = entry.get(CHECKSUM)
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{os.path.join(root, MANIFEST)}: malformed entry for {what}: {entry!r} ({e})") from None
        if not isinstance(rel, str) or os.path.isabs(rel) or ".." in rel.split("/"):
            raise DatasetError(f"{os.path.join(root, MANIFEST)}: {what} has a path outside the directory: {rel!r}")
        self.path = os.path.join(root, rel)
        self.dtype = dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def check_size(self) -> None:
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            raise DatasetError(f"{self.path}: shard file is missing") from None
        expected = self.offset + self.nbytes
        if size != expected:
            how = "truncated" if size < expected else "longer than the manifest says"
            raise DatasetError(f"{self.path}: {size} bytes on disk, the manifest expects {expected} "
                               f"({self.shape} {self.dtype} after a {self.offset}-byte header): {how}")

    def check_header(self, head: bytes) -> None:
        try:
            f = io.BytesIO(head)
            version = np.lib.format.read_magic(f)
            reader = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, fortran, dtype = reader(f)
            end = f.tell()
        except Exception as e:  # noqa: BLE001 - any parse failure is a corrupt header
            raise DatasetError(f"{self.path}: not a valid .npy header ({e})") from None
        if tuple(shape) != self.shape or np.dtype(dtype) != self.dtype or (fortran and len(shape) > 1) or end != self.offset:
            raise DatasetError(f"{self.path}: its .npy header says {np.dtype(dtype)} {tuple(shape)} "
                               f"(data at byte {end}), the manifest {self.dtype} {self.shape} (at byte {self.offset})")

    def map(self, check_header: bool = False) -> np.ndarray:
        """The file's array, read-only and memory-mapped (pages are read when touched). The header
        is read only if asked: mapping a thousand shards must not read a thousand pages."""
        fd = os.open(self.path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size != self.offset + self.nbytes:
                self.check_size()
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        if check_header:
            self.check_header(mm[:self.offset])
        count = math.prod(self.shape)
        return np.frombuffer(mm, dtype=self.dtype, count=count, offset=self.offset).reshape(self.shape)

    def verify(self) -> None:
        with open(self.path, "rb") as f:
            self.check_header(f.read(self.offset))
        if self.checksum is None:
            return
        got = checksum_file(self.path, self.offset, self.nbytes)
        if got != self.checksum:
            raise DatasetError(f"{self.path}: checksum mismatch ({CHECKSUM} {got}, the manifest "
                               f"{self.checksum}): the shard is corrupt")


class _Column:
    def __init__(self, name: str, kind: str, dtype: np.dtype, row_shape: tuple[int, ...], longest: int):
        self.name, self.kind, self.dtype, self.row_shape, self.longest = name, kind, dtype, row_shape, longest
        self.files: list[Any] = []  # per shard: _File, or (values _File, offsets _File)


def _per_column(option: str, value: Any, name: str, names: list[str]) -> Any:
    if isinstance(value, Mapping):
        unknown = set(value) - set(names)
        if unknown:
            raise ValueError(f"{option} names columns that are not ragged columns of this dataset: "
                             f"{sorted(unknown)} (ragged: {names})")
        return value.get(name, 0 if option == "pad" else None)
    return value


def read_manifest(root: str) -> dict[str, Any]:
    mpath = os.path.join(root, MANIFEST)
    if not os.path.isdir(root):
        raise FileNotFoundError(f"{root}: no such dataset directory")
    try:
        with open(mpath, "rb") as f:
            manifest = json.loads(f.read())
    except FileNotFoundError:
        raise DatasetError(f"{mpath} is missing: {root} is not a fastload dataset directory, "
                           "or its write never finished") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise DatasetError(f"{mpath}: not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DatasetError(f"{mpath}: not a fastload dataset manifest (format {manifest.get('format') if isinstance(manifest, dict) else None!r})")
    if manifest.get("version") != VERSION:
        raise DatasetError(f"{mpath}: format version {manifest.get('version')!r} is not one this fastload "
                           f"reads (it reads version {VERSION}); upgrade fastload or rewrite the dataset")
    return manifest


class DiskDataset:
    """A dataset directory opened by Dataset.open: a source (fastload.Source) whose columns are the
    directory's shards, memory-mapped when a Loader first needs them. It is a peer of Dataset, not
    a kind of it: it makes the same native array source from its mapped shards."""

    def __init__(self, path: str | os.PathLike, verify: bool = False, pad: Any = 0, max_length: Any = None):
        root = os.fspath(path)
        manifest = read_manifest(root)
        mpath = os.path.join(root, MANIFEST)
        try:
            columns = [_Column(c["name"], c["kind"], np.dtype(c["dtype"]), tuple(int(s) for s in c["row_shape"]),
                               int(c.get("longest", 0))) for c in manifest["columns"]]
            shards = manifest["shards"]
            rows = [int(s["rows"]) for s in shards]
            total = int(manifest["rows"])
        except (KeyError, TypeError, ValueError) as e:
            raise DatasetError(f"{mpath}: malformed manifest ({type(e).__name__}: {e})") from None
        if not columns:
            raise DatasetError(f"{mpath}: the manifest lists no columns")
        if sum(rows) != total or any(r < 0 for r in rows):
            raise DatasetError(f"{mpath}: shard rows {rows[:8]}{'...' if len(rows) > 8 else ''} do not add up to "
                               f"the manifest's {total} rows")
        if total == 0:
            raise DatasetError(f"{mpath}: the dataset is empty (0 rows)")
        for k, shard in enumerate(shards):
            entries = shard.get("columns") if isinstance(shard, dict) else None
            if not isinstance(entries, dict):
                raise DatasetError(f"{mpath}: shard {k} lists no column files")
            for col in columns:
                entry = entries.get(col.name)
                what = f"column {col.name!r} shard {k}"
                if entry is None:
                    raise DatasetError(f"{mpath}: {what} is not in the manifest")
                if col.kind == "fixed":
                    f = _File(root, entry, col.dtype, what)
                    expect = (rows[k],) + col.row_shape
                    if f.shape != expect:
                        raise DatasetError(f"{f.path}: the manifest gives it shape {f.shape}, its shard {expect}")
                    f.check_size()
                    col.files.append(f)
                elif col.kind == "ragged":
                    try:
                        values = _File(root, entry["values"], col.dtype, what + " values")
                        offsets = _File(root, entry["offsets"], np.dtype("<i8"), what + " offsets")
                    except (KeyError, TypeError):
                        raise DatasetError(f"{mpath}: {what} needs values and offsets files") from None
                    if offsets.shape != (rows[k] + 1,) or values.shape[1:] != col.row_shape:
                        raise DatasetError(f"{offsets.path}: shape {offsets.shape} and values {values.shape} do not "
                                           f"fit {rows[k]} rows of items {col.row_shape}")
                    values.check_size()
                    offsets.check_size()
                    col.files.append((values, offsets))
                else:
                    raise DatasetError(f"{mpath}: column {col.name!r} has unknown kind {col.kind!r}")
        self.path = root
        self.manifest = manifest
        self._disk_columns = columns
        self._shard_sizes = rows
        self._rows = total
        ragged = [c.name for c in columns if c.kind == "ragged"]
        self._pad = {n: _per_column("pad", pad, n, ragged) for n in ragged}
        self._max_length = {n: _per_column("max_length", max_length, n, ragged) for n in ragged}
        self._shard_rows = rows if len(rows) > 1 else None
        self._real_shards = self._shard_rows is not None
        # Per column, per shard: the mapped array, or (values, offsets); made at the first need.
        self._maps: list[list[Any]] | None = None
        self._map_lock = threading.Lock()
        if verify:
            self.verify()

    def verify(self) -> None:
        """Reads every file: checks headers and checksums, and a ragged column's offsets; raises
        DatasetError naming the first corrupt file."""
        for col in self._disk_columns:
            for k, f in enumerate(col.files):
                if col.kind == "fixed":
                    f.verify()
                    continue
                values, offsets = f
                values.verify()
                offsets.verify()
                o = offsets.map()
                steps = np.diff(o)
                if o[0] != 0 or o[-1] != values.shape[0] or (len(steps) and steps.min() < 0):
                    raise DatasetError(f"{offsets.path}: offsets are not non-decreasing from 0 to {values.shape[0]}")
                if len(steps) and int(steps.max()) > col.longest:
                    raise DatasetError(f"{offsets.path}: a row of {int(steps.max())} items, longer than the manifest's "
                                       f"longest ({col.longest})")

    def _mapped(self) -> list[list[Any]]:
        with self._map_lock:
            if self._maps is None:
                self._maps = [[f.map() if col.kind == "fixed" else (f[0].map(), f[1].map()) for f in col.files]
                              for col in self._disk_columns]
            return self._maps

    def column_specs(self) -> list[ColumnSpec]:
        """The core's description of every column, made now from the mapped shards."""
        specs = []
        for col, arrays in zip(self._disk_columns, self._mapped()):
            if col.kind == "fixed":
                specs.append(describe_shards(col.name, arrays))
            else:
                ragged = Ragged._trusted([v for v, _ in arrays], [o for _, o in arrays], col.longest,
                                         self._pad[col.name], self._max_length[col.name])
                specs.append(ragged._describe(col.name))
        return specs

    def native_source(self) -> Any:
        """The native source the collation threads gather from (see fastload.Source)."""
        return array_source(self.column_specs())

    @property
    def shard_rows(self) -> list[int] | None:
        """Samples per shard, in order; None for a directory of one shard."""
        rows = getattr(self, "_shard_rows", None)
        return None if rows is None else list(rows)

    def _declared(self) -> list[int] | None:
        return None if self._real_shards else self.shard_rows

    def _files_and_arrays(self) -> list[tuple[str, _File, np.ndarray]]:
        out = []
        for col, arrays in zip(self._disk_columns, self._mapped()):
            for k, (f, a) in enumerate(zip(col.files, arrays)):
                if col.kind == "fixed":
                    out.append((f"{col.name}[{k}]", f, a))
                else:
                    out.append((f"{col.name}[{k}] values", f[0], a[0]))
                    out.append((f"{col.name}[{k}] offsets", f[1], a[1]))
        return out

    def fingerprint(self) -> list[ColumnState]:
        """Every shard file's array and size: a file truncated or replaced under the mapping is
        reported at the next iter() instead of killing the process with SIGBUS."""
        return [column_state(label, a, "shard", backing=_backing(f, a)) for label, f, a in self._files_and_arrays()]

    def check_fingerprint(self, states: list[ColumnState]) -> None:
        for state, (_, _, a) in zip(states, self._files_and_arrays()):
            check_column_state(state, a, "shard")

    def __reduce__(self) -> tuple:
        return _reopen, (self.path, self._pad, self._max_length, self._rows, list(self._shard_sizes),
                         self._declared())

    def __deepcopy__(self, memo: dict) -> "DiskDataset":
        return _reopen(self.path, copy.deepcopy(self._pad, memo), copy.deepcopy(self._max_length, memo), self._rows,
                       list(self._shard_sizes), self._declared())

    def __copy__(self) -> "DiskDataset":
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def shard(self, k: int) -> dict[str, Any]:
        """Shard k's columns as arrays (a ragged column as (values, offsets)), memory-mapped."""
        if not -len(self._shard_sizes) <= k < len(self._shard_sizes):
            raise IndexError(f"shard {k} out of range for {len(self._shard_sizes)} shards")
        out: dict[str, Any] = {}
        for col in self._disk_columns:
            f = col.files[k]
            out[col.name] = f.map(True) if col.kind == "fixed" else (f[0].map(True), f[1].map(True))
        return out

    @property
    def num_shards(self) -> int:
        return len(self._shard_sizes)

    def __len__(self) -> int:
        return self._rows

    @property
    def names(self) -> list[str]:
        return output_names([_NameOnly(c.name, c.kind == "ragged") for c in self._disk_columns])

    def __repr__(self) -> str:
        cols = ", ".join(f"{c.name}: {c.dtype.name}{list(c.row_shape)}{' ragged' if c.kind == 'ragged' else ''}"
                         for c in self._disk_columns)
        return f"Dataset.open({self.path!r}: {len(self)} samples in {len(self._shard_sizes)} shards; {cols})"


def _backing(f: _File, array: np.ndarray) -> _FileBacking:
    """Where a shard's array lies in its file (mapped with mmap.mmap, which np.memmap's
    file_backing does not recognise)."""
    mapping = array
    while not isinstance(mapping, mmap.mmap):
        mapping = mapping.obj if isinstance(mapping, memoryview) else mapping.base
    return _FileBacking(mapping, f.path, "r", f.offset, 0, f.nbytes)


def _reopen(path: str, pad: Any, max_length: Any, rows: int, shard_sizes: list[int],
            declared: list[int] | None = None) -> DiskDataset:
    """An unpickled or deep-copied dataset directory: opened again by path, and refused if the
    directory no longer holds the same shards."""
    ds = DiskDataset(path, pad=pad, max_length=max_length)
    if len(ds) != rows or ds._shard_sizes != shard_sizes:
        raise DatasetError(f"{path}: the dataset directory changed since this Dataset was pickled or copied "
                           f"({rows} rows in {len(shard_sizes)} shards then, {len(ds)} in {ds.num_shards} now)")
    return _redeclare(ds, declared)


class _NameOnly:
    def __init__(self, name: str, ragged: bool):
        self.name, self.ragged = name, (1,) if ragged else ()


def open_dataset(path: str | os.PathLike, verify: bool = False, pad: Any = 0, max_length: Any = None) -> DiskDataset:
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be a bool, got {verify!r}")
    return DiskDataset(path, verify=verify, pad=pad, max_length=max_length)

