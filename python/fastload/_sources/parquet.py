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

from .. import _C, _lifecycle
from .._machine import helper_threads
from .arrow import plan_columns
from .column_types import ColumnType, column_types
from .hive import NULL_VALUE, Partitions, discover

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


def _import_pyarrow() -> Any:
    try:
        import pyarrow.parquet as pq  # noqa: PLC0415 - only Parquet needs it
    except ImportError:
        raise ImportError("fl.Parquet decodes row groups with pyarrow: pip install 'fastload[arrow]'") from None
    return pq


def _hidden(name: str) -> bool:
    return name.startswith((".", "_"))  # _SUCCESS, _metadata, .crc files, _temporary/


def parquet_files(path: Any) -> list[str]:
    """The files of a path (a file, a directory searched recursively in name order, skipping hidden
    and `_`-prefixed entries such as _SUCCESS), or of a list of paths."""
    return [f for f, _ in parquet_files_and_dirs(path)]


def parquet_files_and_dirs(path: Any, in_list: bool = False) -> list[tuple[str, list[str]]]:
    """parquet_files(path), each with the directory names its hive partition values come from
    (hive.py): those below a directory; for a file named in a list, every directory of its path as
    given; none for a single file given alone (pyarrow's rules)."""
    if isinstance(path, (list, tuple)):
        if not path:
            raise ValueError("path must name at least one Parquet file, got an empty list")
        out: list[tuple[str, list[str]]] = []
        for p in path:
            out += parquet_files_and_dirs(p, in_list=True)
        return out
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a file, a directory or a list of them, got {type(path).__name__}")
    path = os.fspath(path)
    if os.path.isfile(path):
        return [(path, _dirs_of(os.path.dirname(path)) if in_list else [])]
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no Parquet file or directory at {path}")
    found = []
    for root, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        below = _dirs_of(os.path.relpath(root, path))
        found += [(os.path.join(root, f), below) for f in sorted(files) if not _hidden(f) and not f.endswith(".crc")]
    if not found:
        raise ValueError(f"the directory {path} holds no Parquet files")
    return found


def _dirs_of(folder: str) -> list[str]:
    return [d for d in folder.replace(os.sep, "/").split("/") if d not in ("", ".")]


# The class fl.Parquet builds for URLs: remote_parquet.py registers its subclass when it is
# imported (fastload's __init__ imports it), so this module never imports it back.
_url_class: type | None = None


def register_url_class(cls: type) -> None:
    global _url_class
    _url_class = cls


def _remote(path: Any) -> bool:
    from .._storage.urls import is_url  # noqa: PLC0415

    return is_url(path) or (isinstance(path, (list, tuple)) and any(is_url(p) for p in path))


def _file_state(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


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

    A Parquet source pickles (for spawned workers and DDP): the copy opens the files again by
    path, and refuses them if they were rewritten since this source opened them.
    """

    default_order = "block"

    def __new__(cls, path: Any = None, *args: Any, **kwargs: Any) -> "Parquet":
        # URLs (s3://, gs://, http(s)://): the files are fetched into a local cache as the plan
        # needs them (remote_parquet.py); the class below only sees _locate/_state/_footer/_file.
        if cls is Parquet and _remote(path):
            if _url_class is None:
                raise ImportError("fl.Parquet over URLs needs fastload._sources.remote_parquet (imported by fastload)")
            cls = _url_class
        return super().__new__(cls)

    def __init__(self, path: Any, columns: Sequence[str] | None = None, *, pad: Any = None, max_length: Any = None,
                 fill_null: Mapping[str, Any] | None = None, with_valid: bool = False,
                 cache_bytes: int | None = None, decode_threads: int | None = None):
        _import_pyarrow()  # a clear ImportError without pyarrow, before anything is read
        import pyarrow as pa  # noqa: PLC0415 - present: _import_pyarrow() passed
        # What a pickle reopens (RemoteParquet keeps its own: its URLs and options without secrets).
        self._open_args = {"path": path, "columns": columns, "pad": pad, "max_length": max_length,
                           "fill_null": fill_null, "with_valid": with_valid, "cache_bytes": cache_bytes,
                           "decode_threads": decode_threads}
        located = self._locate(path)
        self._paths = [p for p, _ in located]
        self._partitions = discover(self._paths, [dirs for _, dirs in located])
        self._states = [self._state(k) for k in range(len(self._paths))]
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
            try:
                f = self._footer(k)
            except Exception as e:  # noqa: BLE001 - pyarrow raises several types for a bad file
                raise ValueError(f"{p} is not a readable Parquet file ({e})") from None
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
            self._schema_table, columns, pad, max_length, fill_null, with_valid, longest=None, what="Parquet")
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

    # Where the files are (overridden by RemoteParquet): their names, each with the directory
    # names its partition values come from, a state that changes when a file is rewritten, a
    # ParquetFile that has read the footer only, and one to decode from.
    def _locate(self, path: Any) -> list[tuple[str, list[str]]]:
        return parquet_files_and_dirs(path)

    def _state(self, k: int) -> Any:
        return _file_state(self._paths[k])

    def _footer(self, k: int) -> Any:
        return _import_pyarrow().ParquetFile(self._paths[k])

    def _fragment(self, k: int) -> Any:
        """File k as a pyarrow dataset fragment whose footer is read once and kept: decoding
        takes a subset of it per row group (a fragment, unlike a ParquetFile, decodes into a
        memory pool of our choosing). Fragments are immutable: threads share them."""
        fragment = self._fragments.get(k)
        if fragment is None:
            import pyarrow.dataset as pads  # noqa: PLC0415 - with pyarrow.parquet
            import pyarrow.fs as pafs  # noqa: PLC0415

            fragment = pads.ParquetFileFormat().make_fragment(self._paths[k], filesystem=pafs.LocalFileSystem(use_mmap=True))
            fragment.ensure_complete_metadata()
            self._fragments[k] = fragment  # two threads may both read it: the same fragment
        return fragment

    def _decode(self, group: int) -> tuple[Any, int]:
        import pyarrow as pa  # noqa: PLC0415 - imported with pyarrow.parquet by the constructor

        k, g = self._groups[group]
        path = self._paths[k]
        if self._state(k) != self._states[k]:
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

    def fingerprint(self) -> Any:
        return list(self._states)

    def check_fingerprint(self, fp: Any) -> None:
        for path, size, mtime, inode in fp:
            try:
                now = _file_state(path)
            except OSError as e:
                raise ValueError(f"the Parquet file {path} is gone ({e}): open the files again") from None
            if now != (path, size, mtime, inode):
                raise ValueError(f"the Parquet file {path} was rewritten since the source was opened (size {size} -> "
                                 f"{now[1]}): open it again and build a new Loader")

    def __reduce__(self) -> Any:
        return (_reopen, (self._open_args, self.fingerprint()))

    def __repr__(self) -> str:
        return (f"Parquet({len(self)} rows in {len(self._rows)} row groups of {len(self._paths)} files; "
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
    source.check_fingerprint(fingerprint)
    if [state[0] for state in fingerprint] != source.files:
        raise ValueError(f"the Parquet files at {args['path']!r} are not the ones the pickled source read: "
                         "files were added or removed since")
    return source
