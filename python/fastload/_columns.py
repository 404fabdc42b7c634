"""Turns user arrays (numpy, np.memmap, CPU torch tensors) into column descriptions for the core.

A description is (name, owner, address, rows, pitch, row_bytes, dlpack_code, bits, row_shape,
shards, ragged): sample i is row_bytes bytes at address + i * pitch, and `owner` keeps that memory
alive. A column of several arrays, or a ragged one, lists its pieces in `shards` instead (see
_shards.py); `ragged` is () for fixed rows.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

# DLPack type codes (the core only moves bytes; the code tells torch what they are).
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 4, 5, 6
_NUMPY_KIND_TO_DL = {"i": _DL_INT, "u": _DL_UINT, "f": _DL_FLOAT, "c": _DL_COMPLEX, "b": _DL_BOOL}

RESERVED_NAMES = ("index", "valid")
# Widths torch.from_dlpack accepts for each code (float8, long double, complex256 it rejects).
_DL_BITS = {_DL_INT: (8, 16, 32, 64), _DL_UINT: (8, 16, 32, 64), _DL_FLOAT: (16, 32, 64),
            _DL_BFLOAT: (16,), _DL_COMPLEX: (32, 64, 128), _DL_BOOL: (8,)}


def _check_bits(what: str, name: str, code: int, bits: int, dtype: Any) -> None:
    if bits not in _DL_BITS[code]:
        raise TypeError(f"{what} {name!r} has unsupported dtype {dtype}; fastload takes bool and numeric dtypes "
                        f"up to 64 bits (128 for complex)")


class ColumnSpec(NamedTuple):
    name: str
    owner: Any
    address: int
    rows: int
    pitch: int
    row_bytes: int
    dl_code: int
    bits: int
    row_shape: tuple[int, ...]
    # ((address, rows, pitch, offsets_address, items), ...) when the column is several arrays.
    shards: tuple = ()
    # (item_bytes, pad element bytes) for a ragged column, whose row_bytes is the padded slot.
    ragged: tuple = ()

    def as_tuple(self) -> tuple:
        return tuple(self)


def _row_is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    if 0 in shape:
        return True  # no bytes to read (numpy reports zero strides for empty arrays)
    expected = itemsize
    for size, stride in zip(reversed(shape[1:]), reversed(strides[1:])):
        if size > 1 and stride != expected:
            return False
        expected *= size
    return True


def describe_array(name: str, array: Any, what: str = "column") -> ColumnSpec:
    """Validates one array and describes its rows without copying it."""
    if isinstance(array, torch.Tensor):
        return _describe_tensor(name, array, what)
    if not isinstance(array, np.ndarray):
        raise TypeError(
            f"{what} {name!r} must be a numpy array, np.memmap or CPU torch.Tensor, "
            f"got {type(array).__name__}"
        )
    if array.ndim == 0:
        raise ValueError(f"{what} {name!r} must have at least one dimension (one row per sample), got a 0-d array")
    dtype = array.dtype
    if dtype.kind not in _NUMPY_KIND_TO_DL or dtype.byteorder == ">":
        raise TypeError(f"{what} {name!r} has unsupported dtype {dtype}; fastload takes bool and numeric dtypes")
    if not _row_is_contiguous(array.shape, array.strides, dtype.itemsize):
        raise ValueError(
            f"{what} {name!r} has rows that are not contiguous in memory (shape {array.shape}, strides "
            f"{array.strides}); pass np.ascontiguousarray({name}) if a copy is acceptable"
        )
    _check_bits(what, name, _NUMPY_KIND_TO_DL[dtype.kind], dtype.itemsize * 8, dtype)
    row_shape = tuple(int(s) for s in array.shape[1:])
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * dtype.itemsize
    address = array.__array_interface__["data"][0]
    return ColumnSpec(name, array, address, int(array.shape[0]), int(array.strides[0]), row_bytes,
                      _NUMPY_KIND_TO_DL[dtype.kind], dtype.itemsize * 8, row_shape)


def _describe_tensor(name: str, t: torch.Tensor, what: str) -> ColumnSpec:
    if t.device.type != "cpu":
        raise ValueError(f"{what} {name!r} must be a CPU tensor, got one on {t.device}")
    if t.dim() == 0:
        raise ValueError(f"{what} {name!r} must have at least one dimension (one row per sample), got a 0-d tensor")
    if t.is_sparse or t.layout != torch.strided:
        raise TypeError(f"{what} {name!r} must be a dense tensor, got layout {t.layout}")
    if t.dtype == torch.bfloat16:
        code = _DL_BFLOAT
    elif t.dtype.is_complex:
        code = _DL_COMPLEX
    elif t.dtype.is_floating_point:
        code = _DL_FLOAT
    elif t.dtype == torch.bool:
        code = _DL_BOOL
    elif t.dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        code = _DL_UINT
    elif t.dtype in (torch.int8, torch.int16, torch.int32, torch.int64):
        code = _DL_INT
    else:
        raise TypeError(f"{what} {name!r} has unsupported dtype {t.dtype}")
    itemsize = t.element_size()
    _check_bits(what, name, code, itemsize * 8, t.dtype)
    if t.is_conj() or t.is_neg():
        # The bytes in memory are not the values: the loader copies bytes.
        raise ValueError(f"{what} {name!r} is a lazily conjugated or negated view; pass "
                         f"{name}.resolve_conj().resolve_neg() if a copy is acceptable")
    strides = tuple(s * itemsize for s in t.stride())
    if not _row_is_contiguous(tuple(t.shape), strides, itemsize):
        raise ValueError(
            f"{what} {name!r} has rows that are not contiguous in memory (shape {tuple(t.shape)}, strides "
            f"{t.stride()}); pass {name}.contiguous() if a copy is acceptable"
        )
    row_shape = tuple(int(s) for s in t.shape[1:])
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * itemsize
    return ColumnSpec(name, t, t.data_ptr(), int(t.shape[0]), strides[0], row_bytes, code, itemsize * 8, row_shape)


def dtype_name(spec: ColumnSpec) -> str:
    kind = {_DL_INT: "int", _DL_UINT: "uint", _DL_FLOAT: "float", _DL_BFLOAT: "bfloat",
            _DL_COMPLEX: "complex", _DL_BOOL: "bool"}[spec.dl_code]
    return kind if spec.dl_code == _DL_BOOL else f"{kind}{spec.bits}"
