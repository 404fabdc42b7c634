"""What each column of an Arrow or Parquet source becomes in a batch, and the Arrow type it came
from: `source.schema`. Dates, times, timestamps and durations are spelled as pyarrow spells them,
unit and time zone included (`timestamp[ms, tz=UTC]`, `date32[day]`, `duration[ns]`): they arrive
as their stored integers, which mean nothing without it. Other types as the native reader names
them in its messages (`list<int32>`, `fixed_size_list<float32, 2>`, `dictionary<string>`)."""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

__all__ = ["ColumnType", "column_types"]

_TORCH = {(0, 8): torch.int8, (0, 16): torch.int16, (0, 32): torch.int32, (0, 64): torch.int64,
          (1, 8): torch.uint8, (1, 16): torch.uint16, (1, 32): torch.uint32, (1, 64): torch.uint64,
          (2, 16): torch.float16, (2, 32): torch.float32, (2, 64): torch.float64, (4, 16): torch.bfloat16,
          (6, 8): torch.bool}


class ColumnType(NamedTuple):
    """One column of a source as its batches hold it.

    dtype: the torch dtype of the batch entry; `str` or `bytes` for a string or binary column
        given as a Python list of the batch's values.
    shape: one row's shape (the entry is (batch, *shape)); () for a list of values.
    arrow_type: the Arrow type read (`timestamp[us, tz=Europe/Paris]`, `list<int32>`).
    """
    dtype: Any
    shape: tuple
    arrow_type: str


def column_types(table: Any, selected: list[str], native: Any) -> dict[str, ColumnType]:
    """{column: ColumnType} of the columns read, in order: the Arrow type from `table` (a native
    ArrowTable of the source's schema), dtype and shape from the native source's batch layout."""
    infos = {c["name"]: c for c in table.columns}
    parts = {name: (tuple(code_bits), tuple(shape)) for name, code_bits, shape, _ in native.schema}
    out = {}
    for name in selected:
        # An image column (decode=) is named for its column; a Hugging Face Image's bytes are its field.
        arrow = (infos.get(name) or infos[name + ".bytes"])["type"]
        if name in parts:
            code_bits, shape = parts[name]
            out[name] = ColumnType(_TORCH.get(code_bits, code_bits), shape, arrow)
        else:  # a string or binary column given as a list: no part in the native layout
            out[name] = ColumnType(bytes if "binary" in arrow else str, (), arrow)
    return out
