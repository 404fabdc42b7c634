"""What a column is to fastload: user arrays (numpy, np.memmap, CPU torch tensors) validated and
described for the core, checked for changes since a Loader was built, and copied or pickled.

A description is (name, owner, address, rows, pitch, row_bytes, dlpack_code, bits, row_shape,
shards, ragged): sample i is row_bytes bytes at address + i * pitch, and `owner` keeps that memory
alive. A column of several arrays, or a ragged one, lists its pieces in `shards` instead (see
shards.py); `ragged` is () for fixed rows. A description is made from the live arrays each time
it is needed and never stored: an address copied from another object (a deepcopy, an unpickled
Dataset) would point at memory that object no longer owns.
"""
from __future__ import annotations

import math
import mmap
import os
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import _C
from .._arguments import INT64_MAX

# DLPack type codes (the core only moves bytes; the code tells torch what they are).
_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 4, 5, 6
_NUMPY_KIND_TO_DL = {"i": _DL_INT, "u": _DL_UINT, "f": _DL_FLOAT, "c": _DL_COMPLEX, "b": _DL_BOOL}

RESERVED_NAMES: tuple[str, ...] = tuple(_C.RESERVED_NAMES)  # the parts the loader adds
# Widths torch.from_dlpack accepts for each code (float8, long double, complex256 it rejects).
_DL_BITS = {_DL_INT: (8, 16, 32, 64), _DL_UINT: (8, 16, 32, 64), _DL_FLOAT: (16, 32, 64),
            _DL_BFLOAT: (16,), _DL_COMPLEX: (32, 64, 128), _DL_BOOL: (8,)}
_SOURCES_IN_USE = ("sources must not be resized, moved (share_memory_, set_, .data =) or freed while a "
                   "Loader uses them; build a new Loader after changing one")


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
    # Shards mapped by the collation threads on demand (_mapping.LazyTable): (fastload._C.LazyFiles,
    # file per shard, offsets file per shard (ragged), longest row allowed (ragged; -1: any));
    # the shard table's addresses are then 0.
    lazy: tuple = ()
    # Per shard: where its data come from (a ragged shard's offsets file), named in messages.
    shard_labels: tuple = ()



def _row_is_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    if 0 in shape:
        return True  # no bytes to read (numpy reports zero strides for empty arrays)
    expected = itemsize
    for size, stride in zip(reversed(shape[1:]), reversed(strides[1:])):
        if size > 1 and stride != expected:
            return False
        expected *= size
    return True


def _check_extent(what: str, name: str, rows: int, pitch: int, row_bytes: int) -> None:
    # The core addresses rows as base + i * pitch in int64, and torch/numpy sizes are int64 too.
    logical = rows * row_bytes
    span = abs(pitch) * (rows - 1) + row_bytes
    if max(logical, span, abs(pitch)) > INT64_MAX:
        raise ValueError(f"{what} {name!r} is too large to address: {rows} rows x {row_bytes} bytes per row = "
                         f"{logical} bytes (row pitch {pitch}), more than 2**63 - 1")


def describe_array(name: str, array: Any, what: str = "column") -> ColumnSpec:
    """Validates one array and describes its rows as they are now, without copying it."""
    if isinstance(array, torch.Tensor):
        return _describe_tensor(name, array, what)
    if isinstance(array, np.ma.MaskedArray):
        raise TypeError(f"{what} {name!r} is a numpy masked array; fastload copies the data and would ignore "
                        f"the mask: pass {name}.filled(value), or np.ma.getdata({name}) and the mask as its own column")
    if not isinstance(array, np.ndarray):
        raise TypeError(
            f"{what} {name!r} must be a numpy array, np.memmap or CPU torch.Tensor, "
            f"got {type(array).__name__}"
        )
    if array.ndim == 0:
        raise ValueError(f"{what} {name!r} must have at least one dimension (one row per sample), got a 0-d array")
    dtype = array.dtype
    code = numpy_dl_code(dtype)
    if code is None:
        raise TypeError(f"{what} {name!r} has unsupported dtype {dtype}; fastload takes bool and numeric dtypes "
                        f"(bfloat16 from ml_dtypes included)")
    if not _row_is_contiguous(array.shape, array.strides, dtype.itemsize):
        raise ValueError(
            f"{what} {name!r} has rows that are not contiguous in memory (shape {array.shape}, strides "
            f"{array.strides}); pass np.ascontiguousarray({name}) if a copy is acceptable"
        )
    _check_bits(what, name, code, dtype.itemsize * 8, dtype)
    row_shape = tuple(int(s) for s in array.shape[1:])
    row_bytes = math.prod(row_shape) * dtype.itemsize
    rows, pitch = int(array.shape[0]), int(array.strides[0])
    _check_extent(what, name, rows, pitch, row_bytes)
    return ColumnSpec(name, array, _np_address(array), rows, pitch, row_bytes, code, dtype.itemsize * 8, row_shape)


def numpy_dl_code(dtype: np.dtype) -> int | None:
    """The DLPack type code of a numpy dtype fastload can move, or None."""
    if dtype.byteorder == ">" or dtype.fields is not None:
        return None
    # numpy has no bfloat16 of its own; ml_dtypes (JAX, TensorFlow) registers one as an opaque
    # 2-byte type, which torch imports as torch.bfloat16.
    if dtype.kind == "V" and dtype.name == "bfloat16" and dtype.itemsize == 2:
        return _DL_BFLOAT
    return _NUMPY_KIND_TO_DL.get(dtype.kind)


def _describe_tensor(name: str, t: torch.Tensor, what: str) -> ColumnSpec:
    if t.is_nested:
        raise TypeError(f"{what} {name!r} is a nested tensor; fastload takes dense tensors with one fixed row "
                        f"shape (pad the rows, or store values and offsets as two columns)")
    if isinstance(t, torch.masked.MaskedTensor):
        raise TypeError(f"{what} {name!r} is a MaskedTensor; fastload copies the data and would ignore the mask")
    if t.device.type != "cpu":
        raise ValueError(f"{what} {name!r} must be a CPU tensor, got one on {t.device}")
    if t.is_sparse or t.layout != torch.strided:
        raise TypeError(f"{what} {name!r} must be a dense tensor, got layout {t.layout}")
    if t.dim() == 0:
        raise ValueError(f"{what} {name!r} must have at least one dimension (one row per sample), got a 0-d tensor")
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
    row_bytes = math.prod(row_shape) * itemsize
    rows = int(t.shape[0])
    _check_extent(what, name, rows, strides[0], row_bytes)
    # The threads read through an alias: t.set_(...) or t.data = ... on the user's tensor then
    # cannot free the memory an epoch in progress reads (the next iter() reports the change).
    return ColumnSpec(name, t.detach(), t.data_ptr(), rows, strides[0], row_bytes, code, itemsize * 8, row_shape)


def array_source(specs: list[ColumnSpec]) -> Any:
    """The native source over these columns (fastload._C.BatchSource); it keeps their owners, and
    so their memory, alive."""
    return _C.ArraySource(list(specs), tuple(s.owner for s in specs))


def dtype_name(spec: ColumnSpec) -> str:
    kind = {_DL_INT: "int", _DL_UINT: "uint", _DL_FLOAT: "float", _DL_BFLOAT: "bfloat",
            _DL_COMPLEX: "complex", _DL_BOOL: "bool"}[spec.dl_code]
    return kind if spec.dl_code == _DL_BOOL else f"{kind}{spec.bits}"


# ---------------------------------------------------------------------------- memory and files
def _np_address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])


def _extent(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> tuple[int, int]:
    """[lo, hi): the bytes an array reads, relative to its data pointer."""
    if 0 in shape:
        return 0, 0
    lo = sum((n - 1) * s for n, s in zip(shape, strides) if s < 0)
    hi = sum((n - 1) * s for n, s in zip(shape, strides) if s > 0) + itemsize
    return lo, hi


class _FileBacking(NamedTuple):
    mapping: Any         # mmap.mmap or _C.FileMapping: size() is the mapped file's size now
    filename: str | None
    mode: str
    offset: int          # file offset of the array's data pointer
    lo: int              # the bytes the array reads: [offset + lo, offset + hi) of the file
    hi: int


def file_backing(array: np.ndarray) -> _FileBacking | None:
    """Where a memmap-backed array (a np.memmap, a view of one, np.asarray of one, or an array
    over a fastload._C.FileMapping) lies in its file, or None for memory that is not a mapped file."""
    root = array
    while isinstance(root, np.ndarray) and not isinstance(root.base, (mmap.mmap, memoryview)):
        root = root.base
    if isinstance(root, np.ndarray) and isinstance(root.base, memoryview) and isinstance(root.base.obj, _C.FileMapping):
        m = root.base.obj  # np.frombuffer keeps a memoryview of the mapping
        if len(m) == 0:
            return None  # an empty file: no bytes to read, nothing to check
        lo, hi = _extent(array.shape, array.strides, array.dtype.itemsize)
        return _FileBacking(m, m.path, "r", _np_address(array) - m.address, lo, hi)
    if not isinstance(root, np.memmap) or root.base is None:
        return None
    # np.memmap maps from a page boundary and puts its data pointer at file offset `root.offset`.
    offset = int(root.offset) + _np_address(array) - _np_address(root)
    lo, hi = _extent(array.shape, array.strides, array.dtype.itemsize)
    return _FileBacking(root.base, root.filename, root.mode, offset, lo, hi)


def _file_size(backing: _FileBacking) -> int | None:
    try:
        return backing.mapping.size()
    except (OSError, ValueError):
        pass
    try:
        return os.stat(backing.filename).st_size if backing.filename else None
    except OSError:
        return None


def _check_file(what: str, name: str, backing: _FileBacking) -> None:
    size = _file_size(backing)
    if size is not None and size < backing.offset + backing.hi:
        raise ValueError(
            f"the file {backing.filename!r} behind memmap {what} {name!r} is {size} bytes, but the {what} reads "
            f"up to byte {backing.offset + backing.hi}: it was truncated after the array was mapped (reading it "
            f"would kill the process with SIGBUS); map the file again and build a new Dataset and Loader")


# ---------------------------------------------------------------------------- change detection
class ColumnState(NamedTuple):
    """Where a column's bytes were when a Loader was built: compared (cheaply, reading no data)
    at every iter()/split()."""
    name: str
    fields: tuple[tuple[str, Any], ...]
    backing: _FileBacking | None


def _locate(array: Any) -> tuple[tuple[str, Any], ...]:
    if isinstance(array, torch.Tensor):
        storage = array.untyped_storage()
        return (("data_ptr", array.data_ptr()), ("storage data_ptr", storage.data_ptr()),
                ("storage nbytes", storage.nbytes()), ("shape", tuple(array.shape)),
                ("strides", tuple(array.stride())), ("storage_offset", array.storage_offset()),
                ("dtype", array.dtype))
    root = array
    while isinstance(root.base, np.ndarray):
        root = root.base
    # A view's own address cannot change, but the array owning its memory can be resized.
    return (("address", _np_address(array)), ("shape", array.shape), ("strides", array.strides),
            ("dtype", array.dtype), ("owner address", _np_address(root)), ("owner nbytes", root.nbytes))


def column_state(name: str, array: Any, what: str = "column", backing: _FileBacking | None = None) -> ColumnState:
    """`backing`: where the array lies in its file, when file_backing cannot tell (a mapping made
    with mmap.mmap rather than np.memmap)."""
    if backing is None and not isinstance(array, torch.Tensor):
        backing = file_backing(array)
    if backing is not None:
        _check_file(what, name, backing)
    return ColumnState(name, _locate(array), backing)


def check_column_state(state: ColumnState, array: Any, what: str = "column") -> None:
    now = _locate(array)
    if now != state.fields:
        changed = ", ".join(f"{k} {_show(a)} -> {_show(b)}" for (k, a), (_, b) in zip(state.fields, now) if a != b)
        raise ValueError(f"{what} {state.name!r} changed since the Loader was built ({changed}); {_SOURCES_IN_USE}")
    if state.backing is not None:
        _check_file(what, state.name, state.backing)


def _show(value: Any) -> str:
    return hex(value) if isinstance(value, int) and value > 4096 else str(value)


# ---------------------------------------------------------------------------- copies and pickles
# A column travels as a small tuple: a memmap-backed array as its file and place in it (re-mapped
# on arrival, so a 100 GB file is never copied), anything else by value. Tensors go through numpy
# so that a multiprocessing pickler never moves the user's storage to shared memory behind the
# Loader's back (torch's reducer would call share_memory_() on it).
_TORCH_VIA = {torch.bfloat16: torch.int16, torch.complex32: torch.int32}  # no numpy equivalent


def reduce_column(array: Any) -> tuple:
    if isinstance(array, torch.Tensor):
        t = array.detach()
        t = t.view(_TORCH_VIA.get(t.dtype, t.dtype))
        return ("torch", str(array.dtype).removeprefix("torch."), _reduce_values(t.numpy()))
    backing = file_backing(array)
    if backing is not None and backing.filename is not None and backing.hi > backing.lo:
        mode = "r+" if backing.mode == "w+" else backing.mode  # "w+" would truncate the file
        if isinstance(backing.mapping, _C.FileMapping):
            mode = "mapped"
        return ("file", backing.filename, mode, backing.offset + backing.lo, backing.hi - backing.lo,
                -backing.lo, array.dtype, array.shape, array.strides)
    return ("numpy", _reduce_values(array))


def _reduce_values(a: np.ndarray) -> tuple:
    if a.ndim > 0 and a.shape[0] > 1 and a.strides[0] == 0:
        return ("broadcast", np.array(a[:1]), a.shape[0])  # one row, not rows x the same row
    return ("dense", np.ascontiguousarray(a))


def _restore_values(state: tuple) -> np.ndarray:
    if state[0] == "broadcast":
        _, row, rows = state
        return np.broadcast_to(row, (rows,) + row.shape[1:])
    return state[1]


def restore_column(state: tuple) -> Any:
    kind = state[0]
    if kind == "file":
        _, filename, mode, offset, nbytes, start, dtype, shape, strides = state
        if mode == "mapped":  # was a FileMapping: mapped again the same way, holding no descriptor
            whole = np.frombuffer(_C.FileMapping(filename), dtype=np.uint8)
            if offset + nbytes > len(whole):
                raise ValueError(f"{filename}: {len(whole)} bytes, but the array reads up to byte {offset + nbytes}: "
                                 "the file was truncated since it was pickled")
            return np.ndarray(shape, dtype, buffer=whole[offset:offset + nbytes], offset=start, strides=strides)
        mapped = np.memmap(filename, dtype=np.uint8, mode=mode, offset=offset, shape=(nbytes,))
        return np.ndarray(shape, dtype, buffer=mapped, offset=start, strides=strides)
    if kind == "numpy":
        return _restore_values(state[1])
    if kind == "torch":
        dtype = getattr(torch, state[1])
        values = state[2]
        if values[0] == "broadcast":
            _, row, rows = values
            t = torch.from_numpy(row).expand((rows,) + row.shape[1:])
        else:
            t = torch.from_numpy(values[1])
        return t.view(dtype)
    raise ValueError(f"unknown column state {kind!r}")
