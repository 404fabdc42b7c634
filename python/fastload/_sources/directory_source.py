"""A dataset directory opened by Dataset.open, local or in object storage: one source built on the
FileSet of its files (_storage/file_set.py), as fl.Parquet and fl.Tar are.

Opening reads only the manifest and checks the files (no data pages): a local directory's are
stat'ed through one descriptor of the directory (directory.LocalDirectory), a prefix's listed and
pinned to their versions (remote.ObjectDirectory). The source never asks which: it reads its
files through the FileSet. Local files are mapped when a Loader first needs them and kept mapped
(never their addresses: descriptions are made from them each time), and every file's identity is
checked at each iter(). Files past the mapping budget (_mapping.maps_lazily), and fetched files
(which the cache may evict after use, so no mapping is kept), are mapped by the collation threads
when batches touch them, a bounded number at a time; a fetched file after the fetcher made it
present, along the run's order (the source's stored_files()). A pickle or deep copy travels as its
path or URL and is opened again on arrival, refused if the dataset changed meanwhile.
"""
from __future__ import annotations

import copy
import os
import threading
from typing import Any, Mapping

import numpy as np

from .._storage.file_set import FileSet, is_remote
from .._columns.spec import ColumnSpec, ColumnState, array_source
from .directory import Column, DatasetError, LazyShards, LocalDirectory, check_offsets, cut_is_asked, files_of
from .directory import NameOnly, per_column
from .._columns.mapping import FileChecks, describe_change, maps_lazily
from .._columns.ragged import Ragged
from .._columns.shards import describe_shards, output_names
from .protocol import redeclare

__all__ = ["DiskDataset", "open_dataset"]


def directory_at(path: Any, storage_options: Mapping[str, Any] | None = None, cache_dir: Any = None,
                 cache_limit: Any = None) -> Any:
    """Where a dataset directory is: a local directory, or a prefix in object storage (the same
    test FileSet.resolve makes). Object storage's clients are imported only for a URL."""
    if not is_remote(path):
        if storage_options is not None or cache_dir is not None or cache_limit is not None:
            raise ValueError("storage_options, cache_dir and cache_limit are for URLs (s3://, https://); "
                             f"{os.fspath(path)!r} is a local path")
        return LocalDirectory(path)
    from .remote import ObjectDirectory  # noqa: PLC0415 - loads a storage client

    return ObjectDirectory(path, storage_options, cache_dir, cache_limit)


class DiskDataset:
    """A dataset directory opened by Dataset.open (a path, or a URL of a prefix in object storage):
    a source (fastload.Source) whose columns are the directory's shards, memory-mapped when a
    Loader needs them. It is a peer of Dataset, not a kind of it: it makes the same native array
    source from its mapped shards."""

    def __init__(self, path: str | os.PathLike, verify: bool = False, pad: Any = 0, max_length: Any = None, *,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: Any = None, cache_limit: Any = None):
        self._where = directory_at(path, storage_options, cache_dir, cache_limit)
        layout = self._where.load()
        self.path = self._where.name  # an absolute path, or the URL
        self.manifest = layout.manifest
        self._digest = layout.digest
        self._files: FileSet = layout.files
        self.cache_dir = self._files.cache_dir  # fetched files: the folder of their cached copies
        self._disk_columns: list[Column] = layout.columns
        self._all = files_of(layout.columns)  # in the order of self._files
        self._shard_sizes = layout.rows
        self._rows = layout.total
        ragged = [c.name for c in layout.columns if c.kind == "ragged"]
        self._pad = {n: per_column("pad", pad, n, ragged) for n in ragged}
        self._max_length = {n: per_column("max_length", max_length, n, ragged) for n in ragged}
        rows = layout.rows
        self._shard_rows = rows if len(rows) > 1 else None
        self._real_shards = self._shard_rows is not None
        # Per column, per shard: the mapped array, or (values, offsets); made at the first need. Or,
        # past the mapping budget or fetched, a LazyShards: the files, mapped by the collation threads.
        self._maps: list[list[Any]] | LazyShards | None = None
        self._checks: Any = None  # local files: their identities, checked at every iter()
        self._map_lock = threading.Lock()
        if verify:
            self.verify()

    @property
    def url(self) -> str:
        """The name a dataset in object storage had (its URL); the same as path."""
        return self.path

    @property
    def _fetcher(self) -> Any:
        return self._files.fetcher

    def verify(self) -> None:
        """Reads every file (a fetched one: its cached copy, fetched first if need be, every
        download being checked too): headers and checksums, and a ragged column's offsets; raises
        DatasetError naming the first corrupt file."""
        index = {id(f): i for i, f in enumerate(self._all)}

        def check(f: Any) -> None:
            try:
                self._files.opened(index[id(f)], lambda _: f.verify())
            except DatasetError as e:
                raise self._where.corrupt(index[id(f)], e) from None

        for col in self._disk_columns:
            for k, f in enumerate(col.files):
                if col.kind == "fixed":
                    check(f)
                    continue
                values, offsets = f
                check(values)
                check(offsets)
                o = self._files.opened(index[id(offsets)], lambda _: offsets.map())
                check_offsets(col, k, offsets, o, values.shape[0], "")

    def _mapped(self) -> list[list[Any]] | LazyShards:
        with self._map_lock:
            if self._maps is None:
                self._where.check_same()
                files = self._all
                if self._files.fetched or maps_lazily(len(files)):
                    lazy = LazyShards(self._disk_columns, files)
                    if self._files.fetched:  # the collation threads map each file once the fetcher made it present
                        self._files.provide_to(lazy.table.files)
                    else:
                        self._checks = lazy.table.checks
                    self._maps = lazy
                    return lazy
                try:
                    maps = [[f.map() if col.kind == "fixed" else (f[0].map(), f[1].map()) for f in col.files]
                            for col in self._disk_columns]
                except DatasetError:
                    self._where.check_same()  # an overwrite meanwhile: say that, not which file it hit first
                    raise
                for col, arrays in zip(self._disk_columns, maps):
                    if col.kind == "ragged":
                        self._check_longest(col, arrays)
                self._checks = FileChecks([f.path for f in files], [f.identity for f in files])
                self._maps = maps
            return self._maps

    def _check_longest(self, col: Column, arrays: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """The slot of a ragged column is the manifest's `longest` unless max_length cuts below it:
        then a longer row would be cut without a word. The offsets (8 bytes a row) are read once,
        when the shards are first mapped, to rule that out; a max_length at or below `longest`
        makes every cut the user's and skips the read."""
        cap = self._max_length[col.name]
        if cut_is_asked(col, cap):
            return
        for k, ((values, offsets_file), (_, o)) in enumerate(zip(col.files, arrays)):
            check_offsets(col, k, offsets_file, o, values.shape[0], " (found when the shards were mapped)")

    def column_specs(self) -> list[ColumnSpec]:
        """The core's description of every column, made now from the mapped shards."""
        maps = self._mapped()
        if isinstance(maps, LazyShards):
            return [maps.spec(col, k, self._shard_sizes, self._pad, self._max_length)
                    for k, col in enumerate(self._disk_columns)]
        specs = []
        for col, arrays in zip(self._disk_columns, maps):
            if col.kind == "fixed":
                specs.append(describe_shards(col.name, arrays))
            else:
                ragged = Ragged._trusted([v for v, _ in arrays], [o for _, o in arrays], col.longest,
                                         self._pad[col.name], self._max_length[col.name])
                # The gather names a corrupt row's shard and file (the offsets are read per row).
                specs.append(ragged._describe(col.name)._replace(shard_labels=tuple(o.path for _, o in col.files)))
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

    def fingerprint(self) -> list[ColumnState]:
        """The shards as mapped: checked at every iter() that no local file was truncated, replaced
        or rewritten since open() (reading a truncated one would kill the process with SIGBUS). A
        fetched file is checked where it is mapped: the identity of its verified download."""
        self._mapped()
        self.check_fingerprint([])
        return []

    def check_fingerprint(self, states: list[ColumnState]) -> None:
        """Every local file still has the identity (device, inode, mtime, size) recorded when the
        dataset was opened: one stat per file in C++ (19,000 files: about 16 ms), no Python per file."""
        self._mapped()
        self._where.check_same()
        changed = self._checks.changed() if self._checks is not None else []
        if changed:
            self._where.check_same()  # an overwrite meanwhile: say that, not which file it hit first
            i, now = changed[0]
            f = self._all[i]
            more = f" (and {len(changed) - 1} more files)" if len(changed) > 1 else ""
            what = describe_change(f.identity, now)
            if now[0] != -1 and now[3] < f.identity[3]:
                what = (f"is {int(now[3])} bytes on disk, the manifest expects {f.identity[3]}: truncated since "
                        "the dataset was opened (reading it would kill the process with SIGBUS)")
            raise DatasetError(f"{f.path}: the shard {what}{more}; open the dataset again and build a new Loader")

    def stored_files(self) -> FileSet | None:
        """The files fetched along the run's order (the Source protocol); None for local files."""
        return self._files if self._files.fetched else None

    def storage_stats(self) -> Any:
        """In object storage: bytes fetched, requests, cache hits and misses, time waited, bytes/s,
        cache use."""
        if not self._files.fetched:
            raise ValueError("storage_stats() is for a dataset directory in object storage; this one is local")
        return self._files.stats()

    def _reopened_with(self, for_pickle: bool, pad: Any, max_length: Any) -> tuple:
        return (self.path, pad, max_length, self._rows, list(self._shard_sizes), self._declared(), self._digest,
                self._where.reopen_options(for_pickle), self._where.versions)

    def __reduce__(self) -> tuple:
        return reopen, self._reopened_with(True, self._pad, self._max_length)

    def __deepcopy__(self, memo: dict) -> "DiskDataset":
        return reopen(*self._reopened_with(False, copy.deepcopy(self._pad, memo), copy.deepcopy(self._max_length, memo)))

    def __copy__(self) -> "DiskDataset":
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def shard(self, k: int) -> dict[str, Any]:
        """Shard k's columns as arrays (a ragged column as (values, offsets)), memory-mapped (a
        fetched file: fetched if need be and mapped from the cache; an eviction later leaves the
        mapping valid)."""
        if not -len(self._shard_sizes) <= k < len(self._shard_sizes):
            raise IndexError(f"shard {k} out of range for {len(self._shard_sizes)} shards")
        index = {id(f): i for i, f in enumerate(self._all)}

        def mapped(f: Any) -> np.ndarray:
            return self._files.opened(index[id(f)], lambda _: f.map(True))

        out: dict[str, Any] = {}
        for col in self._disk_columns:
            f = col.files[k]
            out[col.name] = mapped(f) if col.kind == "fixed" else (mapped(f[0]), mapped(f[1]))
        return out

    @property
    def num_shards(self) -> int:
        return len(self._shard_sizes)

    def __len__(self) -> int:
        return self._rows

    @property
    def names(self) -> list[str]:
        return output_names([NameOnly(c.name, c.kind == "ragged") for c in self._disk_columns])

    def __repr__(self) -> str:
        cols = ", ".join(f"{c.name}: {c.dtype.name}{list(c.row_shape)}{' ragged' if c.kind == 'ragged' else ''}"
                         for c in self._disk_columns)
        return f"Dataset.open({self.path!r}: {len(self)} samples in {len(self._shard_sizes)} shards; {cols})"


def reopen(path: str, pad: Any, max_length: Any, rows: int, shard_sizes: list[int], declared: list[int] | None = None,
           digest: str | None = None, options: dict | None = None, versions: list[str] | None = None) -> DiskDataset:
    """An unpickled or deep-copied dataset directory: opened again by path or URL, and refused if it
    is no longer the dataset pickled. Its manifest tells (the checksum of every file, and the id
    each write records): a rewrite with the same shapes would otherwise be read as the old dataset,
    and a copy of the directory elsewhere (another machine) is still recognised. In object storage,
    each object's version must be the one pickled too."""
    ds = DiskDataset(path, pad=pad, max_length=max_length, **(options or {}))
    if digest is not None and ds._digest != digest:
        raise DatasetError(f"{path}: the dataset directory changed since this Dataset was pickled or copied (it "
                           "was rewritten: its manifest.json differs); open it again")
    if len(ds) != rows or ds._shard_sizes != shard_sizes:
        raise DatasetError(f"{path}: the dataset directory changed since this Dataset was pickled or copied "
                           f"({rows} rows in {len(shard_sizes)} shards then, {len(ds)} in {ds.num_shards} now)")
    if versions is not None and ds._where.versions is not None:
        changed = next((n for n, a, b in zip(ds._files.names, versions, ds._where.versions) if a != b), None)
        if changed is not None:
            raise DatasetError(f"{changed}: the object changed since this Dataset was pickled or copied (its version "
                               "differs); open the dataset again")
    return redeclare(ds, declared)


def open_dataset(path: str | os.PathLike, verify: bool = False, pad: Any = 0, max_length: Any = None, *,
                 storage_options: Mapping[str, Any] | None = None, cache_dir: Any = None,
                 cache_limit: Any = None) -> DiskDataset:
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be a bool, got {verify!r}")
    return DiskDataset(path, verify=verify, pad=pad, max_length=max_length, storage_options=storage_options,
                       cache_dir=cache_dir, cache_limit=cache_limit)
