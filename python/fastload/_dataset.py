"""The sources a Loader reads: Dataset (named columns, one row per sample) and Windows (windows
along the first axis of one array or of several)."""
from __future__ import annotations

import operator
import os
from typing import Any, Mapping, Sequence

from ._columns import RESERVED_NAMES, ColumnSpec, dtype_name
from ._shards import common_shard_rows, describe_column, output_names
from ._windows import describe_windows, map_token_files


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None


class Dataset:
    """Named columns of equal leading length; sample i is row i of every column.

    Columns may be numpy arrays, np.memmap (read in place, never copied) or CPU torch tensors, of
    any bool or numeric dtype and any fixed row shape; a list of such arrays (shards of one
    column, read in place); or a ragged column, fastload.Ragged or (values, offsets).
    Dataset.open(path) opens a dataset directory (see fastload.write_dataset).
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
            specs.append(describe_column(name, array))
        lengths = {s.name: s.rows for s in specs}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"columns must have equal leading length, got {lengths}")
        if specs[0].rows == 0:
            raise ValueError("dataset is empty: columns have 0 rows")
        names = output_names(specs)
        if len(set(names)) != len(names):
            raise ValueError(f"a column name clashes with a ragged column's <name>_lengths: {names}")
        self._shard_rows = common_shard_rows(specs)
        self._specs: list[ColumnSpec] = specs

    @classmethod
    def open(cls, path: str | os.PathLike, verify: bool = False, *, pad: Any = 0,
             max_length: Any = None) -> "Dataset":
        """A dataset directory written by fastload.write_dataset or DatasetWriter, mapped lazily.
        verify=True reads every shard and checks its checksum. pad and max_length apply to its
        ragged columns (a value for all, or a dict by column name)."""
        from ._disk import open_dataset  # noqa: PLC0415 - _disk subclasses Dataset

        return open_dataset(path, verify=verify, pad=pad, max_length=max_length)

    @property
    def shard_rows(self) -> list[int] | None:
        """Samples per shard in order when the columns are lists of arrays (or files); None for
        in-memory arrays."""
        return None if self._shard_rows is None else list(self._shard_rows)

    def __len__(self) -> int:
        return self._specs[0].rows

    @property
    def names(self) -> list[str]:
        return output_names(self._specs)

    def column_specs(self) -> list[ColumnSpec]:
        return list(self._specs)

    def __repr__(self) -> str:
        cols = ", ".join(f"{s.name}: {dtype_name(s)}{list(s.row_shape)}" for s in self._specs)
        return f"Dataset({len(self)} samples; {cols})"


class Windows:
    """Fixed-length windows along the first axis: sample i = tokens[i*stride : i*stride + length].

    The LLM pre-training source: a memory-mapped file of token ids read as overlapping or
    disjoint windows (length = context + 1 for next-token targets, stride = context). Batches
    carry the column "tokens" of shape (batch, length) in the tokens' dtype. An N-D array (a time
    series (T, C, H, W)) gives batches (batch, length, C, H, W). A list of arrays (or
    Windows.from_files) is one source whose windows never cross an array's end; the rows left
    after each array's last window are counted in `unused_tokens`.
    """

    def __init__(self, tokens: Any, length: int, stride: int | None = None):
        length = _as_int("length", length)
        if length <= 0:
            raise ValueError(f"length must be positive, got {length}")
        stride = length if stride is None else _as_int("stride", stride)
        if stride <= 0:
            raise ValueError(f"stride must be positive, got {stride}")
        layout = describe_windows(tokens, length, stride)
        self.length, self.stride, self.num_tokens = length, stride, layout.num_tokens
        self.unused_tokens = layout.unused_tokens  # rows after the last window of each array
        self.unused_per_file = layout.unused_per_shard
        self.files: list[str] | None = None
        self._shard_rows = layout.shard_rows
        self._spec = layout.spec

    @classmethod
    def from_files(cls, paths: Sequence[str | os.PathLike], dtype: Any, length: int, stride: int | None = None,
                   row_shape: Sequence[int] = ()) -> "Windows":
        """Windows over raw binary files (nanoGPT/Megatron token .bin files, or time-series rows of
        shape row_shape), each memory-mapped read-only: one source, no window crossing a file end."""
        source = cls(map_token_files(paths, dtype, row_shape), length, stride)
        source.files = [os.fspath(p) for p in paths]
        return source

    @property
    def shard_rows(self) -> list[int] | None:
        """Windows per array (file) in order for a list of arrays; None for one array."""
        return None if self._shard_rows is None else list(self._shard_rows)

    def __len__(self) -> int:
        return self._spec.rows

    @property
    def names(self) -> list[str]:
        return ["tokens"]

    def column_specs(self) -> list[ColumnSpec]:
        return [self._spec]

    def __repr__(self) -> str:
        rest = f" x {list(self._spec.row_shape[1:])}" if len(self._spec.row_shape) > 1 else ""
        files = f" in {len(self._shard_rows)} arrays" if self._shard_rows is not None else ""
        return (f"Windows({len(self)} windows of {self.length}{rest} {dtype_name(self._spec)} tokens, "
                f"stride {self.stride}, over {self.num_tokens} tokens{files})")
