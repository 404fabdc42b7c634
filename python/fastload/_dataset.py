"""The sources a Loader reads: Dataset (named columns, one row per sample) and Windows (token
windows over one long 1-D array). A source holds the user's arrays, never addresses: the core's
description of a column is made from the live array when a Loader is built."""
from __future__ import annotations

import copy
from typing import Any, Mapping

from ._arguments import INT64_MAX, _as_int
from ._columns import (RESERVED_NAMES, ColumnSpec, ColumnState, check_column_state, column_state,
                       describe_array, dtype_name, reduce_column, restore_column)

__all__ = ["Dataset", "Windows", "_as_int"]


def _declare_shards(source: Any, rows: Any) -> Any:
    """Declares shard boundaries on an in-memory source (tests, benchmarks): `rows` samples per
    shard, in order, adding up to len(source). Returns the source."""
    rows = [_as_int("shard_rows", r) for r in rows]
    if any(r < 0 for r in rows) or sum(rows) != len(source):
        raise ValueError(f"shard_rows must be non-negative and add up to {len(source)}, got {rows}")
    source._shard_rows = rows
    return source


class Dataset:
    """Named columns of equal leading length; sample i is row i of every column.

    Columns may be numpy arrays, np.memmap (read in place, never copied) or CPU torch tensors, of
    any bool or numeric dtype and any fixed row shape. Pickling (and copy.deepcopy) carries a
    memmap-backed column as its file name and place in the file, re-mapped on arrival, and any
    other column by value.
    """

    def __init__(self, columns: Mapping[str, Any]):
        if not isinstance(columns, Mapping):
            raise TypeError(f"columns must be a mapping of name -> array, got {type(columns).__name__}")
        if not columns:
            raise ValueError("columns must name at least one column, got an empty mapping")
        specs = []
        for name, array in columns.items():
            if not isinstance(name, str):
                raise TypeError(f"column names must be strings, got {name!r}")
            if name in RESERVED_NAMES:
                raise ValueError(f"column name {name!r} is reserved by the loader (reserved: {', '.join(RESERVED_NAMES)})")
            specs.append(describe_array(name, array))
        lengths = {s.name: s.rows for s in specs}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns must have equal leading length, got {lengths}")
        if specs[0].rows == 0:
            raise ValueError("dataset is empty: columns have 0 rows")
        self._columns: dict[str, Any] = dict(columns)
        self._rows = specs[0].rows
        self._summary = [(s.name, dtype_name(s), s.row_shape) for s in specs]

    def __len__(self) -> int:
        return self._rows

    @property
    def names(self) -> list[str]:
        return list(self._columns)

    def column_specs(self) -> list[ColumnSpec]:
        """The core's description of every column, made now from the live arrays."""
        specs = [describe_array(name, array) for name, array in self._columns.items()]
        for s in specs:
            if s.rows != self._rows:
                raise ValueError(f"column {s.name!r} now has {s.rows} rows, but the Dataset was built with "
                                 f"{self._rows}: sources must not be resized while fastload uses them")
        return specs

    def column_states(self) -> list[ColumnState]:
        return [column_state(name, array) for name, array in self._columns.items()]

    def check_column_states(self, states: list[ColumnState]) -> None:
        for state in states:
            check_column_state(state, self._columns[state.name])

    def __reduce__(self) -> tuple:
        return _restore_dataset, ({name: reduce_column(a) for name, a in self._columns.items()},)

    def __deepcopy__(self, memo: dict) -> "Dataset":
        states = {name: reduce_column(a) for name, a in self._columns.items()}
        return _restore_dataset(copy.deepcopy(states, memo))

    def __copy__(self) -> "Dataset":
        new = object.__new__(Dataset)
        new.__dict__.update(self.__dict__)
        new._columns = dict(self._columns)
        return new

    @property
    def shard_rows(self) -> list[int] | None:
        """Samples in each shard, in order; None: no shard structure (one in-memory array)."""
        rows = getattr(self, "_shard_rows", None)
        return None if rows is None else list(rows)

    def __repr__(self) -> str:
        cols = ", ".join(f"{name}: {dtype}{list(shape)}" for name, dtype, shape in self._summary)
        return f"Dataset({len(self)} samples; {cols})"


def _restore_dataset(states: dict[str, tuple]) -> Dataset:
    return Dataset({name: restore_column(s) for name, s in states.items()})


class Windows:
    """Fixed-length windows over a 1-D array: sample i = tokens[i*stride : i*stride + length].

    The LLM pre-training source: a memory-mapped file of token ids read as overlapping or
    disjoint windows (length = context + 1 for next-token targets, stride = context). Batches
    carry the column "tokens" of shape (batch, length) in the tokens' dtype.
    """

    def __init__(self, tokens: Any, length: int, stride: int | None = None):
        length = _as_int("length", length)
        if length <= 0:
            raise ValueError(f"length must be positive, got {length}")
        stride = length if stride is None else _as_int("stride", stride)
        if stride <= 0:
            raise ValueError(f"stride must be positive, got {stride}")
        self._tokens, self.length, self.stride = tokens, length, stride
        spec = self._spec()
        self.num_tokens = self._tokens_spec().rows
        self._count = spec.rows
        self._dtype = dtype_name(spec)

    def _tokens_spec(self) -> ColumnSpec:
        spec = describe_array("tokens", self._tokens, what="tokens")
        if len(spec.row_shape) != 0:
            raise ValueError(f"tokens must be 1-D, got shape {(spec.rows,) + spec.row_shape}")
        itemsize = spec.bits // 8
        if spec.rows > 1 and spec.pitch != itemsize:
            raise ValueError(f"tokens must be contiguous (stride {itemsize} bytes), got a stride of {spec.pitch} bytes")
        return spec

    def _spec(self) -> ColumnSpec:
        spec = self._tokens_spec()
        if self.length > spec.rows:
            raise ValueError(f"length must be at most the number of tokens ({spec.rows}), got {self.length}")
        itemsize = spec.bits // 8
        if self.stride * itemsize > INT64_MAX:
            raise ValueError(f"stride must be at most (2**63 - 1) // {itemsize} (the itemsize of the tokens), "
                             f"got {self.stride}")
        count = (spec.rows - self.length) // self.stride + 1
        return spec._replace(rows=count, pitch=self.stride * itemsize, row_bytes=self.length * itemsize,
                             row_shape=(self.length,))

    def __len__(self) -> int:
        return self._count

    @property
    def names(self) -> list[str]:
        return ["tokens"]

    def column_specs(self) -> list[ColumnSpec]:
        spec = self._spec()
        if spec.rows != self._count:
            raise ValueError(f"tokens now give {spec.rows} windows, but the Windows was built with {self._count}: "
                             f"sources must not be resized while fastload uses them")
        return [spec]

    def column_states(self) -> list[ColumnState]:
        return [column_state("tokens", self._tokens, what="tokens")]

    def check_column_states(self, states: list[ColumnState]) -> None:
        for state in states:
            check_column_state(state, self._tokens, what="tokens")

    def __reduce__(self) -> tuple:
        return _restore_windows, (reduce_column(self._tokens), self.length, self.stride)

    def __deepcopy__(self, memo: dict) -> "Windows":
        return _restore_windows(copy.deepcopy(reduce_column(self._tokens), memo), self.length, self.stride)

    def __copy__(self) -> "Windows":
        new = object.__new__(Windows)
        new.__dict__.update(self.__dict__)
        return new

    @property
    def shard_rows(self) -> list[int] | None:
        """Samples in each shard, in order; None: no shard structure (one in-memory array)."""
        rows = getattr(self, "_shard_rows", None)
        return None if rows is None else list(rows)

    def __repr__(self) -> str:
        return (f"Windows({len(self)} windows of {self.length} {self._dtype} tokens, "
                f"stride {self.stride}, over {self.num_tokens} tokens)")


def _restore_windows(tokens: tuple, length: int, stride: int) -> Windows:
    return Windows(restore_column(tokens), length, stride)
