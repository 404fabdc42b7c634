"""Columns made of several arrays (shards): one column to the core, described by a shard table
that the collation threads search (csrc/core/gather.h), plus the column kinds a Dataset takes:
how each is stored, described from its live arrays, checked for changes, and copied or pickled."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from .. import _C
from .spec import ColumnSpec, ColumnState, check_column_state, column_state, describe_array, reduce_column, restore_column

# The shard table entry of a fixed-row shard: (address, rows, pitch, offsets_address, items).
ShardEntry = tuple


def _same_kind(what: str, name: str, first: ColumnSpec, spec: ColumnSpec, k: int) -> None:
    if (spec.dl_code, spec.bits) != (first.dl_code, first.bits):
        raise TypeError(f"{what} {name!r}: shard {k} has another dtype than shard 0 "
                        f"(code {spec.dl_code}/{spec.bits} bits vs {first.dl_code}/{first.bits} bits)")
    if spec.row_shape != first.row_shape:
        raise ValueError(f"{what} {name!r}: shard {k} has rows of shape {spec.row_shape}, shard 0 {first.row_shape}")


def describe_shards(name: str, arrays: Sequence[Any], what: str = "column") -> ColumnSpec:
    """One column over several arrays of the same dtype and row shape, in order: sample ids run
    through shard 0, then shard 1, ... The owner is the tuple of arrays."""
    if len(arrays) == 0:
        raise ValueError(f"{what} {name!r} is an empty list of arrays; give at least one")
    for a in arrays:
        if not isinstance(a, (np.ndarray, torch.Tensor)):
            raise TypeError(f"{what} {name!r} must be a numpy array, np.memmap or CPU torch.Tensor, or a list of them "
                            f"(shards), got list of {type(a).__name__}; pass np.asarray() for a list of values")
    specs = [describe_array(name, a, what=what) for a in arrays]
    for k, s in enumerate(specs):
        _same_kind(what, name, specs[0], s, k)
    first = specs[0]
    table = tuple((s.address, s.rows, s.pitch, 0, 0) for s in specs)
    # The owners describe_array chose (a tensor's alias), so that the threads' memory stays alive.
    return first._replace(owner=tuple(s.owner for s in specs), address=0, rows=sum(s.rows for s in specs),
                          pitch=0, shards=table)


def stored_column(value: Any) -> Any:
    """What a Dataset keeps of a column: the array itself, a list of arrays copied (the shard
    structure is fixed when the Dataset is built; the arrays are the user's), a ragged column as
    fastload.Ragged."""
    from .ragged import Ragged  # noqa: PLC0415 - ragged imports this module

    if isinstance(value, tuple) and len(value) == 2:
        return Ragged(*value)
    if isinstance(value, list):
        return list(value)
    return value


def describe_column(name: str, value: Any) -> ColumnSpec:
    """A Dataset column: an array, a list of arrays (shards), or a ragged column
    (fastload.Ragged, or a (values, offsets) tuple), described from its live arrays."""
    from .ragged import Ragged  # noqa: PLC0415 - ragged imports this module

    value = stored_column(value)
    if isinstance(value, Ragged):
        return value._describe(name)
    if isinstance(value, list):
        return describe_shards(name, value)
    return describe_array(name, value)


def column_arrays(name: str, value: Any) -> list[tuple[str, Any, str]]:
    """(label, array, what) for every array a stored column reads, in a fixed order."""
    from .ragged import Ragged  # noqa: PLC0415

    if isinstance(value, Ragged):
        return value._arrays(name)
    if isinstance(value, list):
        return [(f"{name}[{k}]", a, "column") for k, a in enumerate(value)]
    return [(name, value, "column")]


def column_states_of(columns: Sequence[tuple[str, Any]]) -> list[ColumnState]:
    return [column_state(label, a, what) for name, value in columns for label, a, what in column_arrays(name, value)]


def check_column_states_of(columns: Sequence[tuple[str, Any]], states: Sequence[ColumnState]) -> None:
    arrays = [entry for name, value in columns for entry in column_arrays(name, value)]
    for state, (_, array, what) in zip(states, arrays):
        check_column_state(state, array, what)


def reduce_value(value: Any) -> tuple:
    """A stored column as a picklable state: arrays by file or value (see reduce_column)."""
    from .ragged import Ragged  # noqa: PLC0415

    if isinstance(value, Ragged):
        return ("ragged", value._reduce_state())
    if isinstance(value, list):
        return ("shards", [reduce_column(a) for a in value])
    return ("array", reduce_column(value))


def restore_value(state: tuple) -> Any:
    from .ragged import restore_ragged  # noqa: PLC0415

    kind, inner = state
    if kind == "ragged":
        return restore_ragged(inner)
    if kind == "shards":
        return [restore_column(s) for s in inner]
    if kind == "array":
        return restore_column(inner)
    raise ValueError(f"unknown column state {kind!r}")


def shard_rows_of(spec: ColumnSpec) -> list[int] | None:
    """Samples per shard of a column given as several arrays, else None."""
    if len(spec.shards) > 1:
        return [int(s[1]) for s in spec.shards]
    return None


def common_shard_rows(specs: Sequence[ColumnSpec]) -> list[int] | None:
    """The shard boundaries of a source: those of its sharded columns, which must agree; None if
    no column has more than one shard."""
    found: tuple[str, list[int]] | None = None
    for s in specs:
        rows = shard_rows_of(s)
        if rows is None:
            continue
        if found is None:
            found = (s.name, rows)
        elif rows != found[1]:
            raise ValueError(f"columns given as lists of arrays must have the same rows per shard: "
                             f"{found[0]!r} has {found[1]}, {s.name!r} has {rows}")
    return None if found is None else found[1]


def output_names(specs: Sequence[ColumnSpec]) -> list[str]:
    """The batch's column names: each column, and after a ragged one its `<name>_lengths`."""
    names: list[str] = []
    for s in specs:
        names.append(s.name)
        if s.ragged:
            names.append(_C.ragged_lengths_name(s.name))
    return names
