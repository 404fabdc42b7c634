"""The sources a Loader reads: Dataset (named columns, one row per sample) and Windows (windows
along the first axis of one array or of several). A source holds the user's arrays, never
addresses: the core's description of a column (shard tables and ragged offsets included) is made
from the live arrays when a Loader is built."""
from __future__ import annotations

import copy
import os
from typing import Any, Mapping, Sequence

from .._arguments import as_int
from .._columns.spec import (RESERVED_NAMES, ColumnSpec, ColumnState, array_source, check_column_state, column_state,
                       dtype_name, reduce_column, restore_column)
from .._columns.shards import (check_column_states_of, column_states_of, common_shard_rows, describe_column, output_names,
                      reduce_value, restore_value, stored_column)
from .protocol import declare_shards as _declare_shards  # noqa: F401 - tests declare shards through here
from .protocol import redeclare as _redeclare
from .window_layout import TokenFiles, describe_windows, restore_token_files, token_files

__all__ = ["Dataset", "Windows", "as_int"]


class Dataset:
    """Named columns of equal leading length; sample i is row i of every column.

    Columns may be numpy arrays, np.memmap (read in place, never copied) or CPU torch tensors, of
    any bool or numeric dtype and any fixed row shape; a list of such arrays (shards of one
    column, read in place); or a ragged column, fastload.Ragged or (values, offsets).
    Dataset.open(path) opens a dataset directory (see fastload.write_dataset).

    Pickling (and copy.deepcopy) carries a memmap-backed array as its file name and place in the
    file, re-mapped on arrival, and any other array by value; an opened dataset directory
    travels as its path and is opened again.

    Args:
        columns: a mapping of column name -> column. A column is a numpy array, np.memmap or CPU
            torch tensor whose first axis is the sample (rows contiguous; any leading stride); a
            list of them (shards, concatenated in order); or a ragged column. All columns have
            the same number of samples. The names "index" and "valid" (and "<ragged>_lengths")
            are the loader's. Sources must not be resized or moved while a Loader uses them: each
            iter() checks and raises ValueError naming the column.
    """

    def __init__(self, columns: Mapping[str, Any]):
        if not isinstance(columns, Mapping):
            raise TypeError(f"columns must be a mapping of name -> array, got {type(columns).__name__}")
        if not columns:
            raise ValueError("columns must name at least one column, got an empty mapping")
        stored: dict[str, Any] = {}
        specs = []
        for name, value in columns.items():
            if not isinstance(name, str):
                raise TypeError(f"column names must be strings, got {name!r}")
            if name in RESERVED_NAMES:
                raise ValueError(f"column name {name!r} is reserved by the loader (reserved: {', '.join(RESERVED_NAMES)})")
            stored[name] = stored_column(value)
            specs.append(describe_column(name, stored[name]))
        lengths = {s.name: s.rows for s in specs}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns must have equal leading length, got {lengths}")
        if specs[0].rows == 0:
            raise ValueError("dataset is empty: columns have 0 rows")
        names = output_names(specs)
        if len(set(names)) != len(names):
            raise ValueError(f"a column name clashes with a ragged column's <name>_lengths: {names}")
        self._columns: dict[str, Any] = stored
        self._rows = specs[0].rows
        self._names = names
        self._shard_rows = common_shard_rows(specs)
        self._real_shards = self._shard_rows is not None
        self._summary = [(s.name, dtype_name(s), s.row_shape) for s in specs]

    @classmethod
    def open(cls, path: str | os.PathLike, verify: bool = False, *, pad: Any = 0,
             max_length: Any = None, storage_options: Mapping[str, Any] | None = None, cache_dir: Any = None,
             cache_limit: Any = None) -> "Dataset":
        """A dataset directory written by fastload.write_dataset or DatasetWriter, mapped lazily.

        Args:
            path: the directory (its manifest.json names every shard).
            verify: read every shard and check its checksum (else only sizes are checked).
            pad: the pad value of ragged columns (one for all, or a dict by column name).
            max_length: cap on a ragged row's length (one for all, or a dict by column name).
            storage_options, cache_dir, cache_limit: for a URL (s3://bucket/prefix, https://...):
                client settings (endpoint_url, ...), where the local cache of its shards lives, and
                its bound in bytes or as "50GB" (see docs/object-storage.md).
        """
        from .directory_source import open_dataset  # noqa: PLC0415 - builds on the column modules this one uses

        return open_dataset(path, verify=verify, pad=pad, max_length=max_length,  # type: ignore[return-value]
                            storage_options=storage_options, cache_dir=cache_dir, cache_limit=cache_limit)

    @property
    def shard_rows(self) -> list[int] | None:
        """Samples per shard, in order, when the columns are lists of arrays (or files); None for
        one in-memory array per column (no shard structure)."""
        rows = getattr(self, "_shard_rows", None)
        return None if rows is None else list(rows)

    def __len__(self) -> int:
        return self._rows

    @property
    def names(self) -> list[str]:
        return list(self._names)

    def column_specs(self) -> list[ColumnSpec]:
        """The core's description of every column, made now from the live arrays."""
        specs = [describe_column(name, value) for name, value in self._columns.items()]
        for s in specs:
            if s.rows != self._rows:
                raise ValueError(f"column {s.name!r} now has {s.rows} rows, but the Dataset was built with "
                                 f"{self._rows}: sources must not be resized while fastload uses them")
        if self._real_shards and common_shard_rows(specs) != self._shard_rows:
            raise ValueError(f"the columns' shards now hold {common_shard_rows(specs)} rows, but the Dataset was "
                             f"built with {self._shard_rows}: sources must not be resized while fastload uses them")
        return specs

    def native_source(self) -> Any:
        """The native source the collation threads gather from (see fastload.Source)."""
        return array_source(self.column_specs())

    def fingerprint(self) -> list[ColumnState]:
        """Where every array's bytes are (each shard's, a ragged column's values and offsets)."""
        return column_states_of(list(self._columns.items()))

    def check_fingerprint(self, states: list[ColumnState]) -> None:
        check_column_states_of(list(self._columns.items()), states)

    def _declared(self) -> list[int] | None:
        return None if self._real_shards else self.shard_rows

    def __reduce__(self) -> tuple:
        return _restore_dataset, ({name: reduce_value(v) for name, v in self._columns.items()}, self._declared())

    def __deepcopy__(self, memo: dict) -> "Dataset":
        states = {name: reduce_value(v) for name, v in self._columns.items()}
        return _restore_dataset(copy.deepcopy(states, memo), self._declared())

    def __copy__(self) -> "Dataset":
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new._columns = dict(self._columns)
        return new

    def __repr__(self) -> str:
        cols = ", ".join(f"{name}: {dtype}{list(shape)}" for name, dtype, shape in self._summary)
        return f"Dataset({len(self)} samples; {cols})"


def _restore_dataset(states: dict[str, tuple], declared: list[int] | None = None) -> Dataset:
    return _redeclare(Dataset({name: restore_value(s) for name, s in states.items()}), declared)


class Windows:
    """Fixed-length windows along the first axis: sample i = tokens[i*stride : i*stride + length].

    The LLM pre-training source: a memory-mapped file of token ids read as overlapping or
    disjoint windows (length = context + 1 for next-token targets, stride = context). Batches
    carry the column "tokens" of shape (batch, length) in the tokens' dtype. An N-D array (a time
    series (T, C, H, W)) gives batches (batch, length, C, H, W). A list of arrays (or
    Windows.from_files) is one source whose windows never cross an array's end; the rows left
    after each array's last window are counted in `unused_tokens`. Pickling carries memmaps (and
    from_files' files) by file name, other arrays by value.

    Args:
        tokens: an array, np.memmap or CPU tensor contiguous along its first axis (1-D tokens, or
            N-D rows such as a time series), or a list of them (files or shards).
        length: rows per window (context + 1 for next-token targets).
        stride: rows between consecutive window starts; default `length` (disjoint windows).
    """

    def __init__(self, tokens: Any, length: int, stride: int | None = None):
        length = as_int("length", length)
        if length <= 0:
            raise ValueError(f"length must be positive, got {length}")
        stride = length if stride is None else as_int("stride", stride)
        if stride <= 0:
            raise ValueError(f"stride must be positive, got {stride}")
        # A list is copied (its arrays are the user's): the shard structure is fixed from here on.
        self._tokens = list(tokens) if isinstance(tokens, (list, tuple)) else tokens
        self.length, self.stride = length, stride
        layout = describe_windows(self._tokens, length, stride)
        self.num_tokens = layout.num_tokens
        self.unused_tokens = layout.unused_tokens  # rows after the last window of each array
        self.unused_per_file = layout.unused_per_shard
        self.files: list[str] | None = None
        self._count = layout.spec.rows
        self._shard_rows = layout.shard_rows
        self._real_shards = self._shard_rows is not None
        self._row_shape = layout.spec.row_shape
        self._dtype = dtype_name(layout.spec)

    @classmethod
    def from_files(cls, paths: Sequence[str | os.PathLike], dtype: Any, length: int, stride: int | None = None,
                   row_shape: Sequence[int] = (), *, storage_options: Mapping[str, Any] | None = None,
                   cache_dir: Any = None, cache_limit: Any = None) -> "Windows":
        """Windows over raw binary files (nanoGPT/Megatron token .bin files, or time-series rows of
        shape row_shape), each memory-mapped read-only: one source, no window crossing a file end.

        Args:
            paths: the files, in order.
            dtype: their element type (e.g. np.uint16 for GPT-2 tokens).
            length, stride: as for Windows.
            row_shape: the shape of one row for N-D data (a file is then rows of that shape).
            storage_options, cache_dir, cache_limit: for URLs (a prefix "s3://bucket/tokens/", whose
                objects are read in name order, or a list of URLs): see docs/object-storage.md.
        """
        tokens, names = token_files(paths, dtype, row_shape, storage_options, cache_dir, cache_limit)
        source = cls(tokens, length, stride)
        source.files = names
        return source

    def stored_files(self) -> Any:
        """The FileSet of token files in object storage, which follows the run's order (None for
        local data)."""
        return self._tokens.stored if isinstance(self._tokens, TokenFiles) else None

    def storage_stats(self) -> Any:
        """For token files in object storage: bytes fetched, requests, hits, misses, waits."""
        files = self.stored_files()
        if files is None:
            raise ValueError("storage_stats() is for Windows.from_files over URLs; these tokens are local")
        return files.stats()

    @property
    def shard_rows(self) -> list[int] | None:
        """Windows per array (file) in order for a list of arrays; None for one array (no shard
        structure)."""
        rows = getattr(self, "_shard_rows", None)
        return None if rows is None else list(rows)

    def __len__(self) -> int:
        return self._count

    @property
    def names(self) -> list[str]:
        return ["tokens"]

    def _arrays(self) -> list[tuple[str, Any]]:
        if isinstance(self._tokens, TokenFiles):
            return []  # no arrays: files the collation threads map (TokenFiles.check checks them)
        if isinstance(self._tokens, list):
            return [(f"tokens[{k}]", a) for k, a in enumerate(self._tokens)]
        return [("tokens", self._tokens)]

    def column_specs(self) -> list[ColumnSpec]:
        """The core's description of the windows, made now from the live arrays."""
        layout = describe_windows(self._tokens, self.length, self.stride)
        if layout.spec.rows != self._count or (self._real_shards and layout.shard_rows != self._shard_rows):
            raise ValueError(f"tokens now give {layout.spec.rows} windows, but the Windows was built with "
                             f"{self._count}: sources must not be resized while fastload uses them")
        return [layout.spec]

    def native_source(self) -> Any:
        """The native source the collation threads gather from (see fastload.Source)."""
        return array_source(self.column_specs())

    def fingerprint(self) -> list[ColumnState]:
        if isinstance(self._tokens, TokenFiles):  # from_files past the mapping budget: identities
            self._tokens.check()
            return [self._tokens]  # type: ignore[list-item]
        if self.files is not None:  # from_files: fastload's own mappings; one batched stat per check
            from .._columns.mapping import TruncationCheck  # noqa: PLC0415

            check = TruncationCheck(self._arrays(), "tokens")
            check.check()
            return [check]  # type: ignore[list-item]
        return [column_state(label, a, what="tokens") for label, a in self._arrays()]

    def check_fingerprint(self, states: list[ColumnState]) -> None:
        if states and isinstance(states[0], TokenFiles):
            states[0].check()
            return
        if self.files is not None and states and not isinstance(states[0], ColumnState):
            states[0].check()  # type: ignore[attr-defined]
            return
        for state, (_, a) in zip(states, self._arrays()):
            check_column_state(state, a, what="tokens")

    def _state(self) -> tuple:
        if isinstance(self._tokens, TokenFiles):  # stat'ed (and mapped lazily or not) again on arrival
            tokens: Any = self._tokens.reduce()
        elif isinstance(self._tokens, list):
            tokens = [reduce_column(a) for a in self._tokens]
        else:
            tokens = reduce_column(self._tokens)
        declared = None if self._real_shards else self.shard_rows
        return (tokens, self.length, self.stride, self.files, declared)

    def __reduce__(self) -> tuple:
        return _restore_windows, self._state()

    def __deepcopy__(self, memo: dict) -> "Windows":
        return _restore_windows(*copy.deepcopy(self._state(), memo))

    def __copy__(self) -> "Windows":
        new = object.__new__(Windows)
        new.__dict__.update(self.__dict__)
        if isinstance(self._tokens, list):
            new._tokens = list(self._tokens)
        return new

    def __repr__(self) -> str:
        rest = f" x {list(self._row_shape[1:])}" if len(self._row_shape) > 1 else ""
        files = f" in {len(self._shard_rows)} arrays" if self._real_shards else ""
        return (f"Windows({len(self)} windows of {self.length}{rest} {self._dtype} tokens, "
                f"stride {self.stride}, over {self.num_tokens} tokens{files})")


def _restore_windows(tokens: Any, length: int, stride: int, files: list[str] | None = None,
                     declared: list[int] | None = None) -> Windows:
    # A from_files Windows travels by its files (memmaps by name); each is mapped again here.
    if isinstance(tokens, tuple) and tokens[0] in ("token_files", "remote_token_files"):
        arrays: Any = restore_token_files(tokens)
    else:
        arrays = [restore_column(t) for t in tokens] if isinstance(tokens, list) else restore_column(tokens)
    w = Windows(arrays, length, stride)
    w.files = files
    return _redeclare(w, declared)
