"""The sources a Loader reads: Dataset (named columns, one row per sample) and Windows (token
windows over one long 1-D array)."""
from __future__ import annotations

import operator
from typing import Any, Mapping

from ._columns import RESERVED_NAMES, ColumnSpec, describe_array, dtype_name


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


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
    any bool or numeric dtype and any fixed row shape.
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
        self._specs: list[ColumnSpec] = specs

    def __len__(self) -> int:
        return self._specs[0].rows

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._specs]

    def column_specs(self) -> list[ColumnSpec]:
        return list(self._specs)

    @property
    def shard_rows(self) -> list[int] | None:
        """Samples in each shard, in order; None: no shard structure (one in-memory array)."""
        rows = getattr(self, "_shard_rows", None)
        return None if rows is None else list(rows)

    def __repr__(self) -> str:
        cols = ", ".join(f"{s.name}: {dtype_name(s)}{list(s.row_shape)}" for s in self._specs)
        return f"Dataset({len(self)} samples; {cols})"


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
        spec = describe_array("tokens", tokens, what="tokens")
        if len(spec.row_shape) != 0:
            raise ValueError(f"tokens must be 1-D, got shape {(spec.rows,) + spec.row_shape}")
        itemsize = spec.bits // 8
        if spec.rows > 1 and spec.pitch != itemsize:
            raise ValueError(f"tokens must be contiguous (stride {itemsize} bytes), got a stride of {spec.pitch} bytes")
        if length > spec.rows:
            raise ValueError(f"length must be at most the number of tokens ({spec.rows}), got {length}")
        self.length, self.stride, self.num_tokens = length, stride, spec.rows
        count = (spec.rows - length) // stride + 1
        self._spec = spec._replace(rows=count, pitch=stride * itemsize, row_bytes=length * itemsize,
                                   row_shape=(length,))

    def __len__(self) -> int:
        return self._spec.rows

    @property
    def names(self) -> list[str]:
        return ["tokens"]

    def column_specs(self) -> list[ColumnSpec]:
        return [self._spec]

    @property
    def shard_rows(self) -> list[int] | None:
        """Samples in each shard, in order; None: no shard structure (one in-memory array)."""
        rows = getattr(self, "_shard_rows", None)
        return None if rows is None else list(rows)

    def __repr__(self) -> str:
        return (f"Windows({len(self)} windows of {self.length} {dtype_name(self._spec)} tokens, "
                f"stride {self.stride}, over {self.num_tokens} tokens)")
