"""Ragged columns: rows of varying length stored as (values, offsets), gathered by the core into
a padded slot per row plus a `<name>_lengths` column."""
from __future__ import annotations

import copy
import math
import operator
from typing import Any, Sequence

import numpy as np
import torch

from .spec import ColumnSpec, describe_array, reduce_column, restore_column


def _survives(back: Any, value: Any) -> bool:
    """Whether a value read back after its conversion is the value given (NaN counts as itself)."""
    if back == value:
        return True
    return isinstance(back, float) and isinstance(value, float) and math.isnan(back) and math.isnan(value)


def stored_scalar(label: str, value: Any, dtype: Any) -> np.ndarray:
    """`value` as a 0-d numpy array of `dtype`; ValueError naming `label` (e.g. "pad") if it is not
    a scalar or does not survive the conversion (1.5 into an integer column, -1 into an unsigned one)."""
    try:
        a = np.array(value, dtype=dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"{label}={value!r} cannot be stored as {np.dtype(dtype)} ({e})") from None
    if a.ndim != 0:
        raise ValueError(f"{label} must be a scalar, got {value!r}")
    if not _survives(a.item(), value):
        raise ValueError(f"{label}={value!r} cannot be stored as {np.dtype(dtype)} (it becomes {a.item()!r})")
    return a


def pad_bytes(what: str, pad: Any, values: Any) -> bytes:
    """The bytes of one element equal to `pad` in the values' dtype; ValueError if `pad` does not
    survive the conversion (1.5 into an integer column, -1 into an unsigned one)."""
    if not isinstance(values, torch.Tensor):
        return stored_scalar(f"{what}: pad", pad, values.dtype).tobytes()
    dtype = values.dtype
    try:
        t = torch.tensor(pad, dtype=dtype)
    except (TypeError, RuntimeError, OverflowError, ValueError) as e:
        raise ValueError(f"{what}: pad={pad!r} cannot be stored as {dtype} ({e})") from None
    if t.dim() != 0:
        raise ValueError(f"{what}: pad must be a scalar, got {pad!r}")
    if not _survives(t.item(), pad):
        raise ValueError(f"{what}: pad={pad!r} cannot be stored as {dtype} (it becomes {t.item()!r})")
    return t.reshape(1).view(torch.uint8).numpy().tobytes()


def offsets_problem(o: np.ndarray, items: int) -> str | None:
    """The first thing wrong with a ragged shard's offsets over `items` values (they must run
    non-decreasing from 0 to items), naming the row; None if nothing is."""
    if len(o) == 0:
        return "there are no offsets"
    if o[0] != 0:
        return f"row 0 starts at offset {int(o[0])}, not 0"
    bad = np.flatnonzero((o[1:] < o[:-1]) | (o[1:] > items))
    if len(bad):
        r = int(bad[0])
        how = "decreasing" if o[r + 1] < o[r] else f"past the shard's {items} values"
        return f"row {r} has offsets [{int(o[r])}, {int(o[r + 1])}), {how}"
    if o[-1] != items:
        return f"its last row ends at offset {int(o[-1])}, not at its {items} values' end"
    return None


def _offsets_array(what: str, offsets: Any) -> np.ndarray:
    if isinstance(offsets, torch.Tensor):
        offsets = offsets.detach().cpu().numpy()
    o = np.asarray(offsets)
    if o.ndim != 1 or o.dtype.kind not in "iu":
        raise TypeError(f"{what}: offsets must be a 1-D integer array, got dtype {o.dtype} and shape {o.shape}")
    if len(o) == 0:
        raise ValueError(f"{what}: offsets must hold rows + 1 entries (at least one), got an empty array")
    if o.dtype.kind == "u" and len(o) and o.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{what}: offsets exceed int64")
    return np.ascontiguousarray(o, dtype=np.int64)


class Ragged:
    """A column of variable-length rows: row i is values[offsets[i] : offsets[i+1]].

    `values` is an array of items (1-D, or (items, *item_shape)); `offsets` an integer array of
    rows + 1 non-decreasing positions into it (Megatron's and Arrow's layout). Lists of values and
    of offsets make a column of several shards, each with its own offsets. Batches carry the
    rows padded with `pad` to the longest row (cut at `max_length` if given) under the column's
    name, and the lengths written (int64) under `<name>_lengths`.
    """

    def __init__(self, values: Any, offsets: Any, *, pad: Any = 0, max_length: int | None = None):
        # A list of values is a list of shards; offsets may be any integer array-like otherwise.
        values_list = values if isinstance(values, list) else [values]
        offsets_list = offsets if isinstance(values, list) else [offsets]
        if isinstance(values, list) and (not isinstance(offsets, list) or len(offsets) != len(values)):
            raise ValueError("values given as a list of shards need offsets as a list of the same length, got "
                             f"{len(values)} values and {type(offsets).__name__} offsets")
        if not values_list:
            raise ValueError("a ragged column needs at least one shard, got empty lists")
        longest = 0
        checked = []
        for k, (v, o) in enumerate(zip(values_list, offsets_list)):
            what = "ragged column" + (f" shard {k}" if len(values_list) > 1 else "")
            o = _offsets_array(what, o)
            items = len(v)
            if o[0] < 0 or o[-1] > items:
                raise ValueError(f"{what}: offsets must lie in [0, {items}] (the values' length), "
                                 f"got {int(o[0])} .. {int(o[-1])}")
            steps = np.diff(o)
            if len(steps) and steps.min() < 0:
                bad = int(np.argmax(steps < 0))
                raise ValueError(f"{what}: offsets must be non-decreasing, got {int(o[bad])} then {int(o[bad + 1])} "
                                 f"at row {bad}")
            if len(steps):
                longest = max(longest, int(steps.max()))
            checked.append(o)
        self._init(values_list, checked, longest, pad, max_length)

    @classmethod
    def from_rows(cls, rows: Sequence[Any], *, pad: Any = 0, max_length: int | None = None) -> "Ragged":
        """A ragged column from a list of arrays (one per row; copied into one values array)."""
        arrays = [np.asarray(r) for r in rows]
        if not arrays:
            raise ValueError("rows must hold at least one row, got an empty list")
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in arrays], out=offsets[1:])
        return cls(np.concatenate(arrays), offsets, pad=pad, max_length=max_length)

    @classmethod
    def _trusted(cls, values: list[Any], offsets: list[np.ndarray], longest: int, pad: Any,
                 max_length: int | None) -> "Ragged":
        """Shards whose offsets were not read (a dataset directory: the longest row comes from
        its manifest, and the core checks each row's offsets against its values as it reads)."""
        self = cls.__new__(cls)
        self._init(values, offsets, longest, pad, max_length)
        return self

    def _init(self, values: list[Any], offsets: list[np.ndarray], longest: int, pad: Any,
              max_length: int | None) -> None:
        if max_length is not None:
            if isinstance(max_length, bool):
                raise TypeError(f"max_length must be an integer or None, got {max_length!r}")
            try:
                max_length = operator.index(max_length)
            except TypeError:
                raise TypeError(f"max_length must be an integer or None, got {max_length!r}") from None
            if max_length < 0:
                raise ValueError(f"max_length must be non-negative, got {max_length}")
        self._values, self._offsets = values, offsets
        self.longest = longest  # items in the longest row
        self.max_length = max_length
        self.length = longest if max_length is None else min(longest, max_length)  # slot items
        self.pad = pad
        self._rows = [len(o) - 1 for o in offsets]

    def __len__(self) -> int:
        return sum(self._rows)

    def _describe(self, name: str) -> ColumnSpec:
        specs = [describe_array(name, v, what="ragged column values") for v in self._values]
        first = specs[0]
        for k, s in enumerate(specs):
            if (s.dl_code, s.bits, s.row_shape) != (first.dl_code, first.bits, first.row_shape):
                raise TypeError(f"ragged column {name!r}: shard {k} values differ from shard 0 in dtype or item shape")
            if s.rows > 1 and s.pitch != s.row_bytes:
                raise ValueError(f"ragged column {name!r}: values must be contiguous (item stride {s.row_bytes} bytes), "
                                 f"got a stride of {s.pitch} bytes")
        item_bytes = first.row_bytes
        if item_bytes == 0:
            raise ValueError(f"ragged column {name!r}: items of shape {first.row_shape} hold no bytes")
        pad = pad_bytes(f"ragged column {name!r}", self.pad, self._values[0])
        table = tuple((s.address, rows, item_bytes, o.__array_interface__["data"][0], s.rows)
                      for s, o, rows in zip(specs, self._offsets, self._rows))
        owners = (tuple(s.owner for s in specs), tuple(self._offsets))
        return ColumnSpec(name, owners, 0, len(self), 0,
                          self.length * item_bytes, first.dl_code, first.bits, (self.length,) + first.row_shape,
                          shards=table, ragged=(item_bytes, pad))

    def _describe_lazy(self, name: str, rows: Sequence[int], items: Sequence[int], owner: Any,
                       lazy: tuple) -> ColumnSpec:
        """A column of shards the collation threads map on demand (a dataset directory past the
        mapping budget): this Ragged's values only give the dtype and item shape; shard k has
        rows[k] rows over items[k] items, in the files `lazy` names."""
        spec = self._describe(name)  # dtype, item shape, slot and pad, checked as for an eager column
        item_bytes = spec.ragged[0]
        table = tuple((0, r, item_bytes, 0, i) for r, i in zip(rows, items))
        return spec._replace(owner=owner, rows=sum(rows), shards=table, lazy=lazy)

    def _arrays(self, name: str) -> list[tuple[str, Any, str]]:
        """(label, array, what) for every array the column reads: each shard's values and offsets."""
        out = []
        for k, (v, o) in enumerate(zip(self._values, self._offsets)):
            shard = f"[{k}]" if len(self._values) > 1 else ""
            out.append((f"{name}{shard}", v, "ragged column values"))
            out.append((f"{name}{shard}", o, "ragged column offsets"))
        return out

    def _reduce_state(self) -> tuple:
        return ([reduce_column(v) for v in self._values], [reduce_column(o) for o in self._offsets],
                self.longest, self.pad, self.max_length)

    def __reduce__(self) -> tuple:
        # Values and offsets travel like any column: memmaps by file, the rest by value.
        return restore_ragged, (self._reduce_state(),)

    def __deepcopy__(self, memo: dict) -> "Ragged":
        return restore_ragged(copy.deepcopy(self._reduce_state(), memo))

    def __repr__(self) -> str:
        return (f"Ragged({len(self)} rows, longest {self.longest}, slot {self.length}, pad {self.pad!r}, "
                f"{len(self._values)} shard(s))")


def restore_ragged(state: tuple) -> Ragged:
    values, offsets, longest, pad, max_length = state
    return Ragged._trusted([restore_column(v) for v in values], [restore_column(o) for o in offsets], longest,
                           pad, max_length)
