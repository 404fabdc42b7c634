"""Parquet files as a fastload source: `fl.Parquet(path)` over a file, a directory of part files
(as Spark, Ray, DuckDB, pandas and pyarrow write them) or a list of files. Row groups are the
shards; the source's decode threads decode the row groups that the next batches of the order
need (through pyarrow, which releases the GIL while it decodes) into a bounded cache of decoded
row groups, and the collation threads gather their rows natively from there (decoding a row
group themselves when they reach one nobody decoded yet). pyarrow is imported only here."""
from __future__ import annotations

import os
import weakref
from typing import Any, Mapping, Sequence

import numpy as np

from .. import _C, _lifecycle
from .._machine import helper_threads
from .arrow import plan_columns
from .._columns.arrow_types import ColumnType, column_types
from .hive import NULL_VALUE, Partitions, discover
from .parquet_footer import FooterCheck, import_pyarrow as _import_pyarrow, read_footers
from .._storage.file_set import FileSet, local_pin, redacted

__all__ = ["Parquet"]

_DEFAULT_CACHE_BYTES = 512 << 20
# Decode threads by default, at most this many of the process's CPU share (_machine.helper_threads):
# each decodes one row group at a time (pyarrow use_threads=False), so row groups decode in
# parallel with each other and with the gather.
_DEFAULT_DECODE_THREADS = 4
_DECODE_BATCH_ROWS = 8192


def _decode_pool() -> Any:
    """The memory pool row groups are decoded into: jemalloc where pyarrow has it, else the
    system allocator; not pyarrow's default (mimalloc in recent wheels). With several threads
    decoding 128 MiB row groups at once, mimalloc spent twice the CPU of the decode itself on
    fresh memory (a first epoch at 0.45x the speed of the second; jemalloc and the system
    allocator: 0.85-0.9x). Only the decoded row groups are allocated here: the user's own
    pyarrow calls keep their default pool."""
    import pyarrow as pa  # noqa: PLC0415

    try:
        return pa.jemalloc_memory_pool()
    except (NotImplementedError, AttributeError):  # a pyarrow built without jemalloc
        return pa.system_memory_pool()


def _hidden(name: str) -> bool:
    """Entries a Parquet folder holds beside its data: _SUCCESS, _metadata, .crc files, _temporary/."""
    return name.startswith((".", "_")) or name.endswith(".crc")


class Parquet:
    """Parquet files read natively, row group by row group.

    Row groups are the shards: with ``shuffle=True`` the Loader's default order for a Parquet
    source is ``order="block"`` (windows of row groups, shuffled within), so that each row group
    is decoded about once per epoch; ``order="random"`` is allowed and decodes a row group for
    nearly every row while the cache cannot hold the data (see docs/arrow.md for its cost).
    ``partition="shards"`` gives whole row groups to each rank. Types are as for fl.Arrow; list
    columns need ``max_length`` (their longest row is unknown without decoding).

    Args:
        path: a file, a directory of part files, or a list of them. All files share one schema.
        columns, pad, max_length, fill_null, with_valid: as for fl.Arrow.
        cache_bytes: the budget of decoded row groups kept in memory (default 512 MiB). A
            window of order="block" (at least 4 row groups and 4096 rows) and two row groups
            per collation thread are kept whatever their size; row groups decoded ahead (up to
            half the budget, and at least one window) are kept until a batch has read them.
        decode_threads: threads that decode the row groups the next batches need, ahead of
            the collation threads (default 4, or fewer where the CPUs num_threads defaults to are
            fewer; 0: each row group is decoded by the first collation thread that needs it).
        decode: {column: fl.Image(...)}: an image column (binary, or a Hugging Face Image
            struct of bytes and path) decoded natively per sample, as fl.Arrow's decode=.
        storage_options, cache_dir, cache_limit: for URLs (a prefix such as "s3://bucket/table/",
            listed as a folder, or a list of URLs): client settings, where the cached files live
            and their bound (see docs/object-storage.md). Paths and URLs resolve through one
            FileSet (_storage/file_set.py); row groups are the shards either way.

    A Parquet source pickles (for spawned workers and DDP): the copy opens the files again by
    path, and refuses them if they were rewritten since this source opened them.
    """

    default_order = "block"

    def __init__(self, path: Any, columns: Sequence[str] | None = None, *, pad: Any = None, max_length: Any = None,
                 fill_null: Mapping[str, Any] | None = None, with_valid: bool = False,
                 cache_bytes: int | None = None, decode_threads: int | None = None,
                 decode: Mapping[str, Any] | None = None, storage_options: Mapping[str, Any] | None = None,
                 cache_dir: Any = None, cache_limit: Any = None):
        _import_pyarrow()  # a clear ImportError without pyarrow, before anything is read (or requested)
        import pyarrow as pa  # noqa: PLC0415 - present: _import_pyarrow() passed
        # What a pickle reopens: the path as given (a prefix is listed again: the partition
        # columns come from it), the options without their credentials (the copy reads them from
        # its process's chain).
        self._open_args = {"path": path, "columns": columns, "pad": pad, "max_length": max_length,
                           "fill_null": fill_null, "with_valid": with_valid, "cache_bytes": cache_bytes,
                           "decode_threads": decode_threads, "decode": decode, "storage_options": redacted(storage_options),
                           "cache_dir": cache_dir, "cache_limit": cache_limit}
        self._files = files = FileSet.resolve(path, what="path", kind="Parquet file", skip=_hidden, salt=b"parquet",
                                              storage_options=storage_options, cache_dir=cache_dir,
                                              cache_limit=cache_limit)
        self.cache_dir = files.cache_dir  # URLs: the folder of the cached files
        self._paths = list(files.names)
        self._partitions = discover(self._paths, files.folders)
        self._states = list(files.pins)
        opened = read_footers(files)  # ranged reads of each file's end: no file is fetched to open it
        self._footers = [o for o, _ in opened]
        if files.fetched:  # every download of a file must end with the footer planned from
            files.verify_with([FooterCheck(u, n, f) for u, n, (_, f) in zip(files.urls, files.sizes, opened)])
        if cache_bytes is None:
            cache_bytes = _DEFAULT_CACHE_BYTES
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise ValueError(f"cache_bytes must be a non-negative int, got {cache_bytes!r}")
        if decode_threads is None:
            decode_threads = helper_threads(_DEFAULT_DECODE_THREADS)
        if isinstance(decode_threads, bool) or not isinstance(decode_threads, int) or not 0 <= decode_threads <= 64:
            raise ValueError(f"decode_threads must be an int in [0, 64], got {decode_threads!r}")
        self.decode_threads = decode_threads
        schema = None
        self._groups: list[tuple[int, int]] = []  # (file, row group) of each shard
        rows: list[int] = []
        metas = []
        for k, p in enumerate(self._paths):
            f = self._footers[k]
            if schema is None:
                schema = f.schema_arrow
            elif not f.schema_arrow.equals(schema, check_metadata=False):
                raise ValueError(f"{p} has another schema than {self._paths[0]}: all files of a Parquet source "
                                 f"share one\n{f.schema_arrow}\nvs\n{schema}")
            meta = f.metadata
            metas.append(meta)
            for g in range(meta.num_row_groups):
                self._groups.append((k, g))
                rows.append(meta.row_group(g).num_rows)
        if sum(rows) == 0:  # said before the columns' types are looked at (an empty file's may be null)
            raise ValueError(f"the Parquet files at {path} hold no rows")
        self._schema = _with_partitions(schema, self._partitions)  # the files' columns, then the partitions'
        self._schema_table = _C.ArrowTable.from_stream(empty_table(self._schema).__arrow_c_stream__())
        self._selected, self._requests, self._names = plan_columns(
            self._schema_table, columns, pad, max_length, fill_null, with_valid, longest=None, what="Parquet",
            decode=decode)
        self.string_lists = [r[0] for r in self._requests if r[6]]
        self._read = [f.name for f in schema if any(n == f.name or n.startswith(f.name + ".") for n in self._selected)]
        self._read_schema = pa.schema([schema.field(n) for n in self._read])  # a row group of no rows decodes to this
        # The partition columns read: added to each decoded row group from the file's path.
        self._partitions_read = [j for j, n in enumerate(self._partitions.names) if n in self._selected]
        self._fragments: dict[int, Any] = {}
        self._pool = _decode_pool()
        self._check_null_counts(metas, fill_null or {})
        self._check_null_partitions(fill_null or {})
        self._rows = rows
        self._cache_bytes = cache_bytes
        names = [f"row group {g} of {self._paths[k]}" for k, g in self._groups]
        # order="block" shuffles within windows of consecutive row groups: keep a window decoded
        # whatever the budget (the sampler's own count of the most a window holds).
        window = _C.block_window_shards(rows)
        # The native source calls back through a weak reference: a strong one would make a cycle
        # the garbage collector cannot see (this object -> native source -> this object).
        self._native = _C.RowGroupSource(self._schema_table, self._requests, rows, names,
                                         _weak_decode(weakref.WeakMethod(self._decode)), cache_bytes, window,
                                         decode_threads, (self._schema_table,))
        if files.fetched:
            # The Loader's order speaks row groups (the shards), the fetcher files: each row group
            # reads its file, weighted by its share of the file's compressed bytes (exact for one
            # row group a file).
            file_of_group = np.array([k for k, _ in self._groups], dtype=np.int64)
            weight = np.array([max(1, metas[k].row_group(g).total_byte_size) for k, g in self._groups],
                              dtype=np.float64)
            per_file = np.bincount(file_of_group, weights=weight, minlength=len(files))
            group_bytes = np.ceil(np.asarray(files.sizes, dtype=np.float64)[file_of_group] * weight
                                  / per_file[file_of_group])
            files.shards_read(unit_of_shard=file_of_group, shard_bytes=group_bytes.astype(np.int64))
        _lifecycle.register(self)  # its decode threads stop before the interpreter does

    def _check_null_counts(self, metas: list, fills: Mapping[str, Any]) -> None:
        """Nulls in a flat column are refused here from the row groups' statistics where the
        writer kept them (others are found when their row group is decoded)."""
        flat = {n for n in self._selected if n not in fills and "." not in n}
        if not flat:
            return
        start = 0
        for p, meta in zip(self._paths, metas):
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                for j in range(rg.num_columns):
                    c = rg.column(j)
                    if c.path_in_schema in flat and c.is_stats_set and c.statistics.has_null_count \
                            and c.statistics.null_count > 0:
                        raise ValueError(f"Parquet column {c.path_in_schema!r} holds nulls ({c.statistics.null_count} "
                                         f"in row group {g} of {p}, rows {start}..{start + rg.num_rows - 1}): pass "
                                         f"fill_null={{{c.path_in_schema!r}: value}} or drop it with columns=[...]")
                start += rg.num_rows

    def _check_null_partitions(self, fills: Mapping[str, Any]) -> None:
        """A partition column read is refused at open where a file's rows hold null for it (a
        directory named key=__HIVE_DEFAULT_PARTITION__, or none for the key), unless filled."""
        for j in self._partitions_read:
            name = self._partitions.names[j]
            null = next((k for k, values in enumerate(self._partitions.values) if values[j] is None), None)
            if null is not None and name not in fills:
                raise ValueError(f"Parquet partition column {name!r} is null for the rows of {self._paths[null]} (its "
                                 f"directory is {name}={NULL_VALUE}, or it has no {name}= directory): pass "
                                 f"fill_null={{{name!r}: value}} or drop it with columns=[...]")

    def _fragment(self, k: int) -> Any:
        """File k as a pyarrow dataset fragment. A local file's is made once and kept (its footer
        read once; fragments are immutable: threads share them). A fetched file's is made per
        decode over a mapping of the cached copy taken while the copy is present (an eviction, an
        unlink, leaves the mapping readable; a kept path would keep an evicted file's disk space);
        its footer is parsed again, well under a millisecond."""
        import pyarrow as pa  # noqa: PLC0415 - with pyarrow.parquet
        import pyarrow.dataset as pads  # noqa: PLC0415

        if self._files.fetched:
            mapped = self._files.opened(k, lambda path: pa.memory_map(path).read_buffer())
            return pads.ParquetFileFormat().make_fragment(mapped)
        fragment = self._fragments.get(k)
        if fragment is None:
            import pyarrow.fs as pafs  # noqa: PLC0415

            fragment = pads.ParquetFileFormat().make_fragment(self._paths[k], filesystem=pafs.LocalFileSystem(use_mmap=True))
            fragment.ensure_complete_metadata()
            self._fragments[k] = fragment  # two threads may both read it: the same fragment
        return fragment

    def _decode(self, group: int) -> tuple[Any, int]:
        import pyarrow as pa  # noqa: PLC0415 - imported with pyarrow.parquet by the constructor

        k, g = self._groups[group]
        path = self._paths[k]
        if self._files.current_pin(k) != self._states[k]:
            raise ValueError(f"the Parquet file {path} was rewritten since the source was opened: open it again")
        partitions = self._partitions.columns(k, self._rows[group], self._partitions_read)
        if not self._read:  # only partition columns: constants of the file's path, nothing to decode
            table = pa.table(dict(partitions))
            return table.__arrow_c_stream__(), table.nbytes
        # Decoded in record batches of a few MiB, not in one piece: each is written while it is
        # in the caches, and no buffer grows by reallocation (a whole 128 MiB row group in one
        # read_row_group costs ~1.5x the CPU). One thread per row group: the decode threads
        # decode row groups side by side.
        group_of_file = self._fragment(k).subset(row_group_ids=[g])
        batches = list(group_of_file.to_batches(columns=self._read, batch_size=_DECODE_BATCH_ROWS, use_threads=False,
                                                memory_pool=self._pool))
        table = pa.Table.from_batches(batches) if batches else empty_table(self._read_schema)
        for name, values in partitions:
            table = table.append_column(name, values)
        return table.__arrow_c_stream__(), table.nbytes

    def __len__(self) -> int:
        return sum(self._rows)

    @property
    def names(self) -> list[str]:
        return list(self._names)

    @property
    def shard_rows(self) -> list[int]:
        """Rows per row group, over the files in order."""
        return list(self._rows)

    @property
    def files(self) -> list[str]:
        return list(self._paths)

    @property
    def schema(self) -> dict[str, ColumnType]:
        """{column: (dtype, shape, arrow_type)} of the columns read: the torch dtype and row shape
        of its batch entry (`str`/`bytes` for a list of values), and the Arrow type pyarrow reads
        from the files, unit and time zone included (`timestamp[ms, tz=UTC]`: its int64s are
        milliseconds). Partition columns come last, as pyarrow puts them."""
        return column_types(self._schema_table, self._selected, self._native)

    @property
    def partition_columns(self) -> list[str]:
        """The hive partition keys found in the files' directory names (`year=2024/...`), read or not."""
        return list(self._partitions.names)

    def native_source(self) -> Any:
        return self._native

    def decode_stats(self) -> tuple[int, int, int]:
        """(row groups decoded so far, bytes of decoded row groups cached now, how many of the
        decodes the decode threads did ahead of the batches)."""
        return tuple(_C.row_group_decodes(self._native))  # type: ignore[return-value]

    def close(self) -> None:
        """Stops the decode threads (each finishes the row group it decodes); a batch decodes
        what it needs itself from then on. Called at interpreter exit."""
        _C.row_group_stop(self._native)

    def stored_files(self) -> FileSet | None:
        """The files fetched along the Loader's order (URLs); None for local files, and when
        only partition columns are read (no file is read, so none is fetched)."""
        return self._files if self._files.fetched and self._read else None

    def storage_stats(self) -> Any:
        """Over URLs: bytes fetched, requests, cache hits and misses, time waited, bytes/s, cache use."""
        if not self._files.fetched:
            raise ValueError("storage_stats() is for fl.Parquet over URLs; these files are local")
        return self._files.stats()

    def fingerprint(self) -> Any:
        return list(self._states)

    def check_fingerprint(self, fp: Any) -> None:
        if self._files.fetched:
            # No request here (it runs at every iter()): each download is pinned to the version
            # listed at open, so a rewritten object is refused when it is fetched, never read.
            if [tuple(s) for s in fp] != self._states:
                raise ValueError("the Parquet files of this Loader are not those of its source: build a new Loader")
            return
        for path, size, mtime, inode in fp:
            try:
                now = local_pin(path)
            except OSError as e:
                raise ValueError(f"the Parquet file {path} is gone ({e}): open the files again") from None
            if now != (path, size, mtime, inode):
                raise ValueError(f"the Parquet file {path} was rewritten since the source was opened (size {size} -> "
                                 f"{now[1]}): open it again and build a new Loader")

    def __reduce__(self) -> Any:
        return (_reopen, (self._open_args, self.fingerprint()))

    def __repr__(self) -> str:
        return (f"{'Remote' if self._files.fetched else ''}Parquet({len(self)} rows in {len(self._rows)} row groups of {len(self._paths)} files; "
                f"{', '.join(self._selected)})")


def empty_table(schema: Any) -> Any:
    """A table of no rows with this schema. pyarrow's own schema.empty_table() raises for some
    extension types (a fixed_shape_tensor with a permutation, even the identity that
    FixedShapeTensorArray.from_numpy_ndarray sets): those are made from their storage type."""
    import pyarrow as pa  # noqa: PLC0415 - present: a Parquet source imported it

    def empty(t: Any) -> Any:
        if isinstance(t, pa.BaseExtensionType):
            return pa.ExtensionArray.from_storage(t, empty(t.storage_type))
        return pa.array([], type=t)

    return pa.Table.from_arrays([empty(f.type) for f in schema], schema=schema)


def _with_partitions(schema: Any, partitions: Partitions) -> Any:
    """The files' schema with the partition columns after its own; a key that is also a column of
    the files (or a struct's field flattened, `meta.id`) is refused naming both."""
    if not partitions.names:
        return schema
    leaves = {c["name"] for c in _C.ArrowTable.from_stream(empty_table(schema).__arrow_c_stream__()).columns}
    for name in partitions.names:
        if name in schema.names or name in leaves:
            column = schema.field(name).type if name in schema.names else "a struct field"
            raise ValueError(f"the partition key {name!r} (directories named {name}=...) is also a column of the "
                             f"Parquet files ({name!r}: {column}): which one a batch holds is ambiguous; rename the "
                             "directories or the column")
    import pyarrow as pa  # noqa: PLC0415 - present: the constructor imported it

    for name, t in zip(partitions.names, partitions.types):
        schema = schema.append(pa.field(name, t))
    return schema


def _weak_decode(method: "weakref.WeakMethod[Any]") -> Any:
    def decode(group: int) -> tuple[Any, int]:
        bound = method()
        if bound is None:
            raise ValueError("the fl.Parquet source of this row group was garbage-collected")
        return bound(group)
    return decode


def _reopen(args: dict, fingerprint: Any) -> Parquet:
    """A pickled Parquet source opened again (in another process): the same files by path, refused
    if one was rewritten since the original opened it."""
    source = Parquet(**args)
    if source._files.fetched:
        if source._states != [tuple(s) for s in fingerprint]:
            raise ValueError(f"the Parquet files at {fingerprint[0][0]} ... changed since this source was pickled "
                             "(objects rewritten, added or removed): open them again")
        return source
    source.check_fingerprint(fingerprint)
    if [state[0] for state in fingerprint] != source.files:
        raise ValueError(f"the Parquet files at {args['path']!r} are not the ones the pickled source read: "
                         "files were added or removed since")
    return source
