"""Window sources: fixed-length windows along the first axis of one array, of several arrays,
or of raw .bin files, each array a shard of one column (a window never crosses a shard end).
Raw files past the mapping budget (_mapping.maps_lazily) are not mapped here but stat'ed
(TokenFiles): the collation threads map them when batches touch them."""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .. import _C
from .._arguments import INT64_MAX
from .._columns.spec import ColumnSpec, describe_array
from .._columns.mapping import LazyTable, array_of, describe_change, map_file, maps_lazily


@dataclass
class WindowLayout:
    spec: ColumnSpec
    num_tokens: int  # rows along the first axis, over all arrays
    unused_tokens: int  # rows after the last window of each array, summed
    unused_per_shard: list[int]
    shard_rows: list[int] | None  # windows per array; None for one array


def _count(rows: int, length: int, stride: int) -> tuple[int, int]:
    """(windows, rows after the last window) over `rows` rows."""
    if rows < length:
        return 0, rows
    n = (rows - length) // stride + 1
    return n, rows - ((n - 1) * stride + length)


def _piece(array: Any, k: int | None) -> ColumnSpec:
    what = "tokens" if k is None else f"tokens[{k}]"
    spec = describe_array("tokens", array, what="tokens")
    inner = spec.row_bytes
    itemsize = spec.bits // 8
    if spec.rows > 1 and spec.pitch != inner:
        if not spec.row_shape:
            raise ValueError(f"{what} must be contiguous (stride {itemsize} bytes), got a stride of {spec.pitch} bytes")
        raise ValueError(f"{what} must be contiguous along the first axis (stride {inner} bytes for rows of shape "
                         f"{spec.row_shape}), got a stride of {spec.pitch} bytes")
    return spec


def _check_pitch(stride: int, spec: ColumnSpec) -> None:
    row_bytes = spec.row_bytes
    if row_bytes and stride * row_bytes > INT64_MAX:
        unit = "the itemsize of the tokens" if not spec.row_shape else "the bytes of one row of tokens"
        raise ValueError(f"stride must be at most (2**63 - 1) // {row_bytes} ({unit}), got {stride}")


def describe_windows(tokens: Any, length: int, stride: int) -> WindowLayout:
    """Sample i is tokens[s : s + length] along the first axis; batches are (B, length, *rest).
    Made from the live arrays each time (it holds their addresses)."""
    if isinstance(tokens, TokenFiles):
        return _describe_token_files(tokens, length, stride)
    arrays = list(tokens) if isinstance(tokens, (list, tuple)) else None
    if arrays is None:
        spec = _piece(tokens, None)
        if length > spec.rows:
            raise ValueError(f"length must be at most the number of tokens ({spec.rows}), got {length}")
        _check_pitch(stride, spec)
        count, unused = _count(spec.rows, length, stride)
        window = spec._replace(rows=count, pitch=stride * spec.row_bytes, row_bytes=length * spec.row_bytes,
                               row_shape=(length,) + spec.row_shape)
        return WindowLayout(window, spec.rows, unused, [unused], None)
    if not arrays:
        raise ValueError("tokens must be an array or a non-empty list of arrays, got an empty list")
    specs = [_piece(a, k) for k, a in enumerate(arrays)]
    first = specs[0]
    for k, s in enumerate(specs):
        if (s.dl_code, s.bits) != (first.dl_code, first.bits):
            raise TypeError(f"tokens[{k}] has another dtype than tokens[0]")
        if s.row_shape != first.row_shape:
            raise ValueError(f"tokens[{k}] has rows of shape {s.row_shape}, tokens[0] {first.row_shape}")
    counts = [_count(s.rows, length, stride) for s in specs]
    total = sum(c for c, _ in counts)
    if total == 0:
        longest = max(s.rows for s in specs)
        raise ValueError(f"length must be at most the tokens of the longest array ({longest}), got {length}")
    inner = first.row_bytes
    _check_pitch(stride, first)
    table = tuple((s.address, c, stride * inner, 0, 0) for s, (c, _) in zip(specs, counts))
    window = first._replace(owner=tuple(s.owner for s in specs), address=0, rows=total, pitch=0, row_bytes=length * inner,
                            row_shape=(length,) + first.row_shape, shards=table)
    unused = [u for _, u in counts]
    return WindowLayout(window, sum(s.rows for s in specs), sum(unused), unused, [c for c, _ in counts])


def _describe_token_files(files: "TokenFiles", length: int, stride: int) -> WindowLayout:
    first = files.template
    counts = [_count(rows, length, stride) for rows in files.rows]
    total = sum(c for c, _ in counts)
    if total == 0:
        raise ValueError(f"length must be at most the tokens of the longest array ({max(files.rows)}), got {length}")
    inner = first.row_bytes
    _check_pitch(stride, first)
    table = tuple((0, c, stride * inner, 0, 0) for c, _ in counts)
    window = first._replace(owner=files.table, address=0, rows=total, pitch=0, row_bytes=length * inner,
                            row_shape=(length,) + first.row_shape, shards=table,
                            lazy=files.table.spec(np.arange(len(files.rows))))
    unused = [u for _, u in counts]
    return WindowLayout(window, sum(files.rows), sum(unused), unused, [c for c, _ in counts])


class TokenFiles:
    """Raw token files past the mapping budget: stat'ed once (their identity recorded), never
    mapped here; the collation threads map each when a batch touches it, checking it is the file
    stat'ed. Any change to a file since (replaced, rewritten, touched, grown or truncated) is an
    error naming it, at the next iter() or where it is mapped: it is never read as other data."""

    def __init__(self, paths: list[str], dtype: np.dtype, row_shape: tuple[int, ...], sizes: Any, identities: Any,
                 stored: Any = None, reduced: tuple | None = None):
        """Files of these sizes and identities (each checked where it is mapped). `stored`: the
        FileSet that fetches them (URLs; their identities are their downloads', given as each is
        mapped) and `reduced` what a pickle of them carries; None for local files."""
        self.paths, self.dtype, self.row_shape = paths, dtype, row_shape
        row_bytes = dtype.itemsize * int(np.prod(row_shape, dtype=np.int64))
        self.rows = [int(n) // row_bytes for n in sizes]
        self.template = describe_array("tokens", np.empty((0,) + row_shape, dtype=dtype), what="tokens")
        self.table = LazyTable(paths, np.zeros(len(paths), dtype=np.int64), sizes, identities)
        self.stored, self._reduced = stored, reduced
        if stored is not None:
            stored.provide_to(self.table.files)

    @classmethod
    def stat(cls, paths: list[str], dtype: np.dtype, row_shape: tuple[int, ...], row_bytes: int) -> "TokenFiles":
        """Local files, stat'ed now (one call, in C++): each must be whole rows."""
        now = _C.FileSet(paths).stat()
        for path, (dev, err, _, size) in zip(paths, now.tolist()):
            if dev == -1:
                if err == errno.EINVAL:
                    raise ValueError(f"{path}: not a regular file; only regular files can be mapped")
                raise OSError(err, os.strerror(err), path)
            if row_bytes == 0 or size % row_bytes:
                raise ValueError(f"{path}: {size} bytes is not a whole number of rows of {row_bytes} bytes "
                                 f"({dtype} x {row_shape})")
        return cls(paths, dtype, row_shape, now[:, 3], now)

    def check(self) -> None:
        """At every iter(): each file is still the one stat'ed (one stat per file, in C++). A
        fetched file's identity is its verified download's, checked where it is mapped."""
        if self.stored is not None:
            return
        changed = self.table.checks.changed()
        if changed:
            i, now = changed[0]
            more = f" (and {len(changed) - 1} more files)" if len(changed) > 1 else ""
            raise ValueError(f"{self.paths[i]}: the token file {describe_change(self.table.identities[i], now)}"
                             f"{more}; call Windows.from_files again and build a new Loader")

    def reduce(self) -> tuple:
        if self._reduced is not None:
            return ("remote_token_files",) + self._reduced
        return ("token_files", list(self.paths), self.dtype.str, self.row_shape)


def token_files(paths: Any, dtype: Any, row_shape: Sequence[int] = (), storage_options: Any = None,
                cache_dir: Any = None, cache_limit: Any = None) -> tuple[Any, list[str]]:
    """Raw token files by path or by URL (a prefix, listed as a folder, or a list of URLs), and
    their names: local files mapped (map_token_files); objects as TokenFiles that the FileSet
    fetches, each pinned to the version seen now (a file rewritten since is an error naming it,
    never its new bytes beside the old ones of the files still cached)."""
    from .._storage.file_set import FileSet, redacted  # noqa: PLC0415

    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a numpy dtype, got {dtype!r}") from None
    # Local paths are kept as given (a list of files, stat'ed and mapped by map_token_files); a
    # prefix or a list of URLs is listed (HEAD) and pinned now.
    files = FileSet.resolve(paths, what="paths", salt=dt.str.encode(), list_folders=False,
                            storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)
    if not files.fetched:
        return map_token_files(paths, dtype, row_shape), [os.fspath(p) for p in paths]
    shape = tuple(int(s) for s in row_shape)
    row = dt.itemsize * int(np.prod(shape, dtype=np.int64))
    for name, size in zip(files.names, files.sizes):
        if row == 0 or size % row:
            raise ValueError(f"{name}: {size} bytes is not a whole number of rows of {row} bytes ({dt} x {shape})")
    n = len(files)
    reduced = (list(files.names), dt.str, shape, redacted(storage_options) or {}, cache_dir, cache_limit,
               [pin[2] for pin in files.pins])
    tokens = TokenFiles(files.paths, dt, shape, np.asarray(files.sizes, dtype=np.int64), np.zeros((n, 4), dtype=np.int64),
                        stored=files, reduced=reduced)
    return tokens, list(files.names)


def restore_token_files(reduced: tuple) -> Any:
    """Token files unpickled or copied: local ones mapped again; remote ones listed (HEAD) again,
    in the same cache folder, and the same versions (a copy must never read other bytes than the
    original), else an error naming the file that changed."""
    if reduced[0] == "token_files":
        _, paths, dtype, row_shape = reduced
        return map_token_files(paths, dtype, row_shape)
    _, urls, dtype, row_shape, options, cache_dir, cache_limit, *versions = reduced
    files, _ = token_files(list(urls), dtype, row_shape, options, cache_dir, cache_limit)
    before, now = (versions[0] if versions else None), files._reduced[-1]
    changed = None if before is None else next((u for u, a, b in zip(urls, before, now) if a != b), None)
    if changed is not None:
        raise ValueError(f"{changed}: the object changed since this source was pickled or copied (its version "
                         "differs); open the token files again")
    return files


def map_token_files(paths: Sequence[Any], dtype: Any, row_shape: Sequence[int] = ()) -> list[np.ndarray] | TokenFiles:
    """Each raw file as a read-only memory map of shape (rows, *row_shape); past the mapping budget,
    the files as TokenFiles (mapped by the collation threads on demand)."""
    if isinstance(paths, (str, os.PathLike)) or not isinstance(paths, Sequence) or len(paths) == 0:
        raise ValueError(f"paths must be a non-empty list of file paths, got {paths!r}")
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be a numpy dtype, got {dtype!r}") from None
    shape = tuple(int(s) for s in row_shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"row_shape must be non-negative sizes, got {tuple(row_shape)}")
    row = dt.itemsize * int(np.prod(shape, dtype=np.int64))
    if maps_lazily(len(paths)):
        # Absolute: the threads map them later, whatever the working directory is then.
        return TokenFiles.stat([os.path.abspath(os.fspath(p)) for p in paths], dt, shape, row)
    arrays = []
    for p in paths:
        # Mapped without keeping a descriptor (fastload._C.FileMapping): np.memmap keeps one per
        # file, and 1,500 files then fail under the usual `ulimit -n 1024`.
        mapping = map_file(os.fspath(p))  # OSError names the file
        size = len(mapping)
        if row == 0 or size % row:
            raise ValueError(f"{os.fspath(p)}: {size} bytes is not a whole number of rows of {row} bytes "
                             f"({dt} x {shape})")
        arrays.append(array_of(mapping, dt, 0, (size // row,) + shape))  # an empty file: no windows
    return arrays
