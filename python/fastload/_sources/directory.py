"""Dataset directories: the manifest's layout (columns, shards, their .npy files, every field
checked), a directory's shards as lazily mapped files (LazyShards), and the opening of a local
directory (LocalDirectory). The source itself, one class for local paths and URLs, is
directory_source.py; a directory in object storage is opened by remote.py.

A directory holds manifest.json and, per column, one .npy file per shard (a ragged column: a
values and an offsets file per shard). Opening reads only the manifest and stats the files (no
data pages), all through one open descriptor of the directory.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import stat
from typing import Any, Mapping, NamedTuple

import numpy as np

from .. import _C
from .._columns.spec import ColumnSpec, describe_array
from .manifest import CHECKSUM, FORMAT, MANIFEST, VERSION, Bad, DatasetError, read_regular
from .manifest import check_names, parse, want, want_dtype, want_int, want_shape
from .._storage.file_set import FileSet
from .._columns.mapping import LazyTable, array_of, describe_change, map_file
from .._columns.ragged import Ragged, offsets_problem

__all__ = ["CHECKSUM", "FORMAT", "MANIFEST", "VERSION", "DatasetError", "DirectoryLayout", "LocalDirectory",
           "LazyShards", "files_of", "read_manifest", "read_layout"]
_VERIFY_CHUNK = 16 << 20
_MAX_MANIFEST_BYTES = 1 << 30  # ~100 bytes a shard file; far above any real manifest


def _checksum(f: Any, offset: int, nbytes: int) -> str:
    """Checksum64 of the bytes [offset, offset + nbytes) of the open file f."""
    h = _C.Checksum64()
    buf = bytearray(min(_VERIFY_CHUNK, max(nbytes, 1)))
    view = memoryview(buf)
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
    """One .npy file of the directory as the manifest describes it, and the identity (device,
    inode, mtime, size) it had when the directory was opened: a file swapped, rewritten or
    truncated since is an error where it is mapped and at every iter(), never silently read."""

    __slots__ = ("path", "rel", "offset", "shape", "dtype", "checksum", "identity")

    def __init__(self, root: str, entry: Any, dtype: np.dtype, field: str):
        want(entry, dict, field, "an object with path, offset and shape")
        rel = want(entry.get("path"), str, f"{field}.path", "a relative path")
        if not rel or os.path.isabs(rel) or ".." in rel.split("/") or "\0" in rel:
            raise Bad(f"{field}.path", f"is a path outside the directory: {rel!r}")
        self.offset = want_int(entry.get("offset"), f"{field}.offset")
        self.shape = want_shape(entry.get("shape"), f"{field}.shape")
        self.checksum = entry.get(CHECKSUM)
        if self.checksum is not None:
            want(self.checksum, str, f"{field}.{CHECKSUM}", "a hex string")
        self.path = os.path.join(root, rel)
        self.rel = rel
        self.dtype = dtype
        self.identity: tuple[int, int, int, int] | None = None

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def _size_error(self, size: int, when: str = "") -> DatasetError:
        expected = self.offset + self.nbytes
        how = "truncated" if size < expected else "longer than the manifest says"
        return DatasetError(f"{self.path}: it is {size} bytes on disk, the manifest expects {expected} "
                            f"({self.shape} {self.dtype} after a {self.offset}-byte header): {how}{when}")

    def stat_at_open(self, dir_fd: int) -> None:
        """Records the file's identity, relative to the directory opened as dir_fd (so a directory
        replaced during open() cannot mix two datasets); raises if its size is not the manifest's."""
        try:
            st = os.stat(self.rel, dir_fd=dir_fd)
        except FileNotFoundError:
            raise DatasetError(f"{self.path}: shard file is missing") from None
        except OSError as e:
            raise DatasetError(f"{self.path}: cannot stat the shard file ({e.strerror})") from None
        if not _is_regular(st.st_mode):
            raise DatasetError(f"{self.path}: the shard is not a regular file")
        if st.st_size != self.offset + self.nbytes:
            raise self._size_error(st.st_size)
        self.identity = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)

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
        """The file's array, read-only and memory-mapped (pages are read when touched), holding no
        file descriptor. The header is read only if asked: mapping a thousand shards must not read
        a thousand pages. The mapped file must be the one stat'ed at open."""
        try:
            mapping = map_file(self.path)
        except FileNotFoundError:
            raise DatasetError(f"{self.path}: shard file is missing (deleted since the dataset was opened)") from None
        except (OSError, ValueError) as e:
            raise DatasetError(f"{self.path}: cannot map the shard ({getattr(e, 'strerror', None) or e})") from None
        now = tuple(mapping.identity)
        if self.identity is not None and now != self.identity:
            if len(mapping) != self.offset + self.nbytes:
                raise self._size_error(len(mapping), " (changed since the dataset was opened)")
            raise DatasetError(f"{self.path}: the shard {describe_change(self.identity, now)}; open the dataset "
                               "again")
        if len(mapping) != self.offset + self.nbytes:
            raise self._size_error(len(mapping))
        a = array_of(mapping, self.dtype, self.offset, self.shape)
        if check_header:
            self.check_header(bytes(memoryview(mapping)[:self.offset]))
        return a

    def _open_as_opened(self) -> int:
        """A descriptor of the file, which must still be the one stat'ed at open: what a path names
        now (another file swapped in, a FIFO that would block a plain open()) is named, never read."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise DatasetError(f"{self.path}: shard file is missing (deleted since the dataset was opened)") from None
        except OSError as e:
            raise DatasetError(f"{self.path}: cannot open the shard ({e.strerror or e})") from None
        st = os.fstat(fd)
        now = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        if not _is_regular(st.st_mode) or (self.identity is not None and now != self.identity):
            os.close(fd)
            what = describe_change(self.identity, now) if _is_regular(st.st_mode) else "is no longer a regular file"
            raise DatasetError(f"{self.path}: the shard {what}; open the dataset again")
        return fd

    def verify(self) -> None:
        """Reads the file opened (its header, and its checksum if the manifest has one)."""
        with open(self._open_as_opened(), "rb", buffering=0) as f:
            self.check_header(f.read(self.offset))
            if self.checksum is None:
                return
            got = _checksum(f, self.offset, self.nbytes)
        if got != self.checksum:
            raise DatasetError(f"{self.path}: checksum mismatch ({CHECKSUM} {got}, the manifest "
                               f"{self.checksum}): the shard is corrupt")


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def check_offsets(col: "Column", k: int, offsets_file: Any, o: np.ndarray, items: int, when: str) -> None:
    """A ragged shard's offsets run non-decreasing from 0 to its values' rows, and no row is longer
    than the manifest's `longest`; DatasetError naming the column, the shard, the row and the file."""
    where = f"ragged column {col.name!r}, shard {k} ({offsets_file.path})"
    problem = offsets_problem(o, items)
    if problem:
        raise DatasetError(f"{where}: offsets are not non-decreasing from 0 to {items}: {problem}{when}")
    steps = np.diff(o)
    if len(steps) and int(steps.max()) > col.longest:
        row = int(np.argmax(steps))
        raise DatasetError(f"{where}: row {row} holds {int(steps[row])} items, longer than the manifest's "
                           f"columns[].longest ({col.longest}): its rows would be cut without a word; fix the manifest "
                           f"or pass max_length{when}")


class Column:
    def __init__(self, name: str, kind: str, dtype: np.dtype, row_shape: tuple[int, ...], longest: int):
        self.name, self.kind, self.dtype, self.row_shape, self.longest = name, kind, dtype, row_shape, longest
        self.files: list[Any] = []  # per shard: _File, or (values _File, offsets _File)


def cut_is_asked(col: Column, cap: Any) -> bool:
    """Whether `cap`, a column's max_length, is at or below its manifest's `longest`: then every
    row it cuts is cut because the user asked (a max_length the Ragged refuses is not)."""
    return cap is not None and not isinstance(cap, bool) and isinstance(cap, int) and 0 <= cap <= col.longest


def per_column(option: str, value: Any, name: str, names: list[str]) -> Any:
    if isinstance(value, Mapping):
        unknown = set(value) - set(names)
        if unknown:
            raise ValueError(f"{option} names columns that are not ragged columns of this dataset: "
                             f"{sorted(unknown)} (ragged: {names})")
        return value.get(name, 0 if option == "pad" else None)
    return value


def read_manifest(root: str) -> dict[str, Any]:
    """The manifest of the dataset directory `root` (every field checked)."""
    return _load(root)[0]


def _load(root: str, attempts: int = 10) -> "_Opened":
    """_load_once, again if `root` was replaced by an overwrite while it was being read (the
    directory read, swapped out, is being deleted): a reader gets the new dataset, not an error."""
    for attempt in range(attempts):
        try:
            return _load_once(root)
        except _Replaced:
            continue
    return _load_once(root, retry=False)


class _Replaced(Exception):
    pass


class _Opened(NamedTuple):
    manifest: dict[str, Any]
    columns: list[Column]
    rows: list[int]  # per shard
    total: int
    directory: tuple[int, int]  # the directory's (st_dev, st_ino)
    digest: str  # of the manifest's bytes: what a pickle or copy checks it reopens


def _load_once(root: str, retry: bool = True) -> _Opened:
    """Reads and checks the manifest and stats every file it names, all relative to one open
    descriptor of `root`. Raises DatasetError naming the file and the field."""
    mpath = os.path.join(root, MANIFEST)
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"{root}: no such dataset directory") from None
    except NotADirectoryError:
        raise DatasetError(f"{root}: not a directory, so not a fastload dataset directory") from None
    try:
        st = os.fstat(dir_fd)
        directory = (st.st_dev, st.st_ino)
        try:
            text = read_regular(dir_fd, MANIFEST, _MAX_MANIFEST_BYTES)
            manifest = parse(text)
            columns, rows, total = read_layout(root, manifest, lambda f: f.stat_at_open(dir_fd))
        except FileNotFoundError:
            raise DatasetError(f"{mpath} is missing: {root} is not a fastload dataset directory, "
                               "or its write never finished") from None
        except Bad as e:
            where = f" field {e.field}:" if e.field else ""
            raise DatasetError(f"{mpath}:{where} {e.message}") from None
        except OSError as e:
            raise DatasetError(f"{mpath}: cannot read it ({e.strerror or e})") from None
    except (DatasetError, FileNotFoundError):
        if retry and _identity(root) != directory:
            raise _Replaced() from None
        raise
    finally:
        os.close(dir_fd)
    return _Opened(manifest, columns, rows, total, directory, hashlib.blake2b(text, digest_size=16).hexdigest())


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def read_layout(root: str, manifest: dict[str, Any], stat_file: Any) -> tuple[list[Column], list[int], int]:
    """The columns and shards the manifest describes, every field checked (raises Bad), each file
    passed to stat_file as soon as its entry is read."""
    total = want_int(manifest.get("rows"), "rows", low=1)
    if "id" in manifest:  # written by every writer since it was added; older directories lack it
        want(manifest["id"], str, "id", "a string")
    specs = want(manifest.get("columns"), list, "columns", "a list of columns")
    if not specs:
        raise Bad("columns", "lists no columns")
    columns = []
    for k, c in enumerate(specs):
        field = f"columns[{k}]"
        want(c, dict, field, "an object")
        name = want(c.get("name"), str, f"{field}.name", "a column name")
        if not name:
            raise Bad(f"{field}.name", "must be a non-empty string")
        kind = c.get("kind")
        if kind not in ("fixed", "ragged"):
            raise Bad(f"{field}.kind", f"must be 'fixed' or 'ragged', got {kind!r}")
        longest = want_int(c.get("longest"), f"{field}.longest") if kind == "ragged" else 0
        columns.append(Column(name, kind, want_dtype(c.get("dtype"), f"{field}.dtype"),
                               want_shape(c.get("row_shape"), f"{field}.row_shape"), longest))
    check_names([c.name for c in columns], [c.kind == "ragged" for c in columns])
    shards = want(manifest.get("shards"), list, "shards", "a list of shards")
    if not shards:
        raise Bad("shards", "lists no shards")
    rows = []
    for k, shard in enumerate(shards):
        want(shard, dict, f"shards[{k}]", "an object with rows and columns")
        rows.append(want_int(shard.get("rows"), f"shards[{k}].rows"))
    if sum(rows) != total:
        raise Bad("rows", f"shard rows {rows[:8]}{'...' if len(rows) > 8 else ''} do not add up to the manifest's "
                          f"{total} rows")
    for k, shard in enumerate(shards):
        entries = want(shard.get("columns"), dict, f"shards[{k}].columns", "an object of column files")
        unknown = set(entries) - {c.name for c in columns}
        if unknown:
            raise Bad(f"shards[{k}].columns", f"names columns the manifest does not list: {sorted(unknown)}")
        for col in columns:
            field = f"shards[{k}].columns.{col.name}"
            entry = entries.get(col.name)
            if entry is None:
                raise Bad(field, f"is missing: column {col.name!r} shard {k} is not in the manifest")
            if col.kind == "fixed":
                f = _File(root, entry, col.dtype, field)
                expect = (rows[k],) + col.row_shape
                if f.shape != expect:
                    raise Bad(f"{field}.shape", f"is {list(f.shape)} for {f.path}, but its shard has {expect[0]} "
                                                f"rows of {col.row_shape}")
                stat_file(f)
                col.files.append(f)
                continue
            want(entry, dict, field, "an object with values and offsets files")
            values = _File(root, entry.get("values"), col.dtype, f"{field}.values")
            offsets = _File(root, entry.get("offsets"), np.dtype("<i8"), f"{field}.offsets")
            if offsets.shape != (rows[k] + 1,) or values.shape[1:] != col.row_shape or len(values.shape) < 1:
                raise Bad(f"{field}.offsets.shape", f"{list(offsets.shape)} and values {list(values.shape)} do not "
                                                    f"fit {rows[k]} rows of items {col.row_shape}")
            stat_file(values)
            stat_file(offsets)
            col.files.append((values, offsets))
    return columns, rows, total


class _LazyShards:
    """A directory's shards past the mapping budget: every file in one LazyTable (in the order of
    files_of), and per column the file of each shard (a ragged one: values, offsets)."""

    def __init__(self, columns: list[Column], files: list[_File]):
        # A fetched file has no identity until it is downloaded: its provider gives it when mapped.
        self.table = LazyTable([f.path for f in files], [f.offset for f in files], [f.nbytes for f in files],
                               [f.identity or (0, 0, 0, 0) for f in files])
        self.ids: list[Any] = []
        k = 0
        for col in columns:
            per = 1 if col.kind == "fixed" else 2
            n = len(col.files)
            self.ids.append(np.arange(k, k + per * n, dtype=np.int32).reshape(n, per))
            k += per * n

    def spec(self, col: Column, k: int, shard_rows: list[int], pad: dict, max_length: dict) -> ColumnSpec:
        ids = self.ids[k]
        empty = np.empty((0,) + col.row_shape, dtype=col.dtype)  # the dtype and row shape, no data
        if col.kind == "fixed":
            base = describe_array(col.name, empty)
            table = tuple((0, rows, base.row_bytes, 0, 0) for rows in shard_rows)
            return base._replace(owner=self.table, address=0, rows=sum(shard_rows), pitch=0, shards=table,
                                 lazy=self.table.spec(ids[:, 0]))
        cap = max_length[col.name]
        cut_asked = cut_is_asked(col, cap)  # as in _check_longest: no row is cut without a word
        template = Ragged._trusted([empty], [np.zeros(1, dtype=np.int64)], col.longest, pad[col.name], cap)
        items = [values.shape[0] for values, _ in col.files]
        lazy = self.table.spec(ids[:, 0], ids[:, 1], -1 if cut_asked else col.longest)
        return template._describe_lazy(col.name, shard_rows, items, self.table, lazy)


# A dataset's lazily mapped shards by a public name (the class keeps its name: repr and tests show it).
LazyShards = _LazyShards


class NameOnly:
    def __init__(self, name: str, ragged: bool):
        self.name, self.ragged = name, (1,) if ragged else ()




def files_of(columns: list[Column]) -> list[Any]:
    """Every file of the columns, column by column, shard by shard (a ragged shard: values, then
    offsets): the order of a directory's FileSet and of its LazyShards."""
    return [one for col in columns for f in col.files for one in (f if isinstance(f, tuple) else (f,))]


class DirectoryLayout(NamedTuple):
    """A dataset directory as opened, local or in object storage: what its source is built on."""
    manifest: dict[str, Any]
    columns: list[Column]
    rows: list[int]  # per shard
    total: int
    digest: str  # of the manifest's bytes: what a pickle or copy checks it reopens
    files: FileSet  # every file, in the order of files_of(columns)


class LocalDirectory:
    """A dataset directory on disk, as its source opens it: the manifest read and every file
    stat'ed through one open descriptor of the directory (an overwrite meanwhile gives the old
    dataset or the new one, never a mix), the files a FileSet of local paths. Resolved to an
    absolute path once: a chdir after open() or a process with another working directory
    (pickling) reads this same directory."""

    versions = None  # a local dataset is recognised by its manifest's digest alone (a copy elsewhere too)

    def __init__(self, path: str | os.PathLike):
        self.name = os.path.abspath(os.fspath(path))
        self._directory: tuple[int, int] | None = None

    def load(self) -> DirectoryLayout:
        manifest, columns, rows, total, self._directory, digest = _load(self.name)
        files = files_of(columns)
        paths = [f.path for f in files]
        pins = [(f.path, f.identity[3], f.identity[2], f.identity[1]) for f in files]  # FileSet's local pin
        return DirectoryLayout(manifest, columns, rows, total, digest,
                               FileSet(paths, [f.offset + f.nbytes for f in files], pins, [[] for _ in files], paths))

    def check_same(self) -> None:
        """`path` still names the directory opened: an overwrite swaps in another one, whose files
        must not be mixed with (or mistaken for) the opened one's."""
        now = _identity(self.name)
        if now != self._directory:
            raise DatasetError(f"{self.name}: the dataset directory was {'removed' if now is None else 'replaced'} "
                               "(overwritten?) since it was opened; open it again and build a new Loader")

    def corrupt(self, k: int, error: DatasetError) -> DatasetError:
        """The error of a file that verify() found corrupt: as it is (it names the file)."""
        return error

    def reopen_options(self, for_pickle: bool) -> dict[str, Any]:
        return {}
