"""Which Arrow columns a source reads and how: names checked (clashes refused), extension types
interpreted or refused by name, declared shapes (`arrow.fixed_shape_tensor`, Hugging Face
ArrayND), pads, cuts and null fills turned into the native requests. Shared by fl.Arrow and
fl.Parquet."""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np

from .. import _C
from .hugging_face import HF_ARRAY_EXTENSION, hf_array_shapes
from .._images.columns import decoded_request, image_columns, refuse_undecoded_images
from .._columns.ragged import stored_scalar

__all__ = ["plan_columns"]

_RESERVED = tuple(_C.RESERVED_NAMES)
_WAY_OUT = ("drop it with columns=[...] (fl.Arrow(data, columns=[...]) or fl.Parquet(path, columns=[...])), or "
            "pass the data as a Python dataset (an object with __getitem__, e.g. the Hugging Face dataset wrapped "
            "in a class that decodes it)")
_DTYPES = {(0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64, (1, 8): np.uint8,
           (1, 16): np.uint16, (1, 32): np.uint32, (1, 64): np.uint64, (2, 16): np.float16, (2, 32): np.float32,
           (2, 64): np.float64, (6, 8): np.bool_}
# Extension types whose storage, read as it is, is what they mean: a UUID's 16 bytes, JSON text.
_READ_AS_STORED = ("arrow.uuid", "arrow.json")


def _by_column(option: str, value: Any, names: Sequence[str]) -> dict[str, Any]:
    """One value for every column, or a dict by column name (unknown names refused)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(f"{option} names columns {unknown} that are not read; columns read: {list(names)}")
        return dict(value)
    return {n: value for n in names}


def _scalar_bytes(option: str, name: str, value: Any, dtype: Any, shape: Sequence[int] = ()) -> bytes:
    """`value` stored as `dtype` (broadcast over `shape`); ValueError if it does not survive."""
    return np.broadcast_to(stored_scalar(f"{option}[{name!r}]", value, dtype), tuple(shape)).tobytes()


def _field(info: dict) -> str:
    path = info["field_path"]
    if len(path) == 1:
        return f"the column {path[0]!r}"
    return f"the field {path[-1]!r} of the struct {'.'.join(path[:-1])!r} (field path {path})"


def _refuse_clashes(columns: list[dict], selected: Sequence[str], what: str) -> None:
    """Two columns flattened to one name (a column 'meta.id' beside a struct 'meta' with a field
    'id'; two fields of one name): one of them would be dropped, so both are named instead."""
    by_name: dict[str, list[dict]] = {}
    for c in columns:
        by_name.setdefault(c["name"], []).append(c)
    for name in selected:
        same = by_name.get(name, [])
        if len(same) > 1:
            raise ValueError(f"{what} columns clash: {' and '.join(_field(c) for c in same)} are all named {name!r} "
                             "once struct fields are flattened to parent.child: rename one (e.g. "
                             "table.rename_columns(...), ds.rename_column(...)), or drop them with columns=[...]")


def _extension_shape(info: dict, hf_shapes: dict[str, tuple[int, ...]], what: str) -> tuple[tuple, tuple]:
    """(shape, list_shape) of a column from its extension type or declared feature; refuses an
    extension type that fastload would read without its meaning, naming it."""
    name, ext = info["name"], info["extension"]
    if ext == "arrow.fixed_shape_tensor":
        meta = json.loads(info["extension_metadata"] or b"{}")
        shape = tuple(int(d) for d in meta.get("shape", ()))
        permutation = meta.get("permutation")
        if permutation is not None and list(permutation) != list(range(len(shape))):
            raise ValueError(f"{what} column {name!r} is an arrow.fixed_shape_tensor of shape {list(shape)} with the "
                             f"permutation {list(permutation)} (its elements are stored in another dimension order), "
                             "which fastload does not reorder: store it without a permutation (e.g. "
                             "pa.FixedShapeTensorArray.from_numpy_ndarray of a C-contiguous array), or "
                             f"{_WAY_OUT}")
        if info["kind"] not in ("fixed", "bool"):
            raise ValueError(f"{what} column {name!r} is an arrow.fixed_shape_tensor of storage {info['type']}, not "
                             f"a fixed-size list: {_WAY_OUT}")
        return shape, ()
    if ext.startswith(HF_ARRAY_EXTENSION[0]) and ext.endswith(HF_ARRAY_EXTENSION[1]) and name not in hf_shapes:
        raise ValueError(f"{what} column {name!r} is a Hugging Face {ext.rsplit('.', 1)[-1]} whose shape cannot be "
                         f"read from its metadata {info['extension_metadata']!r}: {_WAY_OUT}")
    if ext and ext not in _READ_AS_STORED and name not in hf_shapes:
        raise ValueError(f"{what} column {name!r} is of the extension type {ext!r} ({info['type']}), which fastload "
                         "does not read natively: its stored values would be read without their meaning. Cast it to "
                         f"its storage type (e.g. table.cast(...)) to read the stored values, or {_WAY_OUT}")
    if name in hf_shapes and info["kind"] == "list":
        shape = hf_shapes[name]
        if len(shape) != 1 + info["inner_lists"]:
            raise ValueError(f"{what} column {name!r} is declared of shape {list(shape)} (a Hugging Face ArrayND "
                             f"feature) but stored as {info['type']}: {_WAY_OUT}")
        return (), shape
    return (), ()


def plan_columns(table: Any, columns: Sequence[str] | None, pad: Any, max_length: Any, fill_null: Any,
                 with_valid: bool, longest: Any = None, what: str = "Arrow",
                 decode: Any = None) -> tuple[list[str], list[tuple], list[str]]:
    """The columns read (leaf names; an image column of `decode` by its own name, in place of its
    stored leaves), the native requests for them, and the batch's part names. `longest(name)`
    gives a list column's longest row when no max_length is given (None: refused)."""
    if not isinstance(with_valid, bool):
        raise TypeError(f"with_valid must be a bool, got {with_valid!r}")
    if fill_null is not None and not isinstance(fill_null, Mapping):
        raise TypeError(f"fill_null must be a dict of column -> value, got {type(fill_null).__name__}")
    all_columns = table.columns
    infos = {c["name"]: c for c in all_columns}
    selected = _select(columns, infos)
    _refuse_clashes(all_columns, selected, what)
    images = image_columns(decode, infos, what)
    refuse_undecoded_images(table.metadata, selected, images, what)
    selected = _with_images(selected, images)
    hf_shapes = hf_array_shapes(table.metadata, all_columns)
    declared = {n: _extension_shape(infos[n], hf_shapes, what) for n in selected if n not in images}
    # Lists of a declared fixed length (HF Array2D) are not padded: one pad or max_length for all
    # leaves them out.
    ragged = [n for n in selected if n not in images and infos[n]["kind"] in ("list", "bytes")
              and not (declared[n][1] and declared[n][1][0] >= 0)]
    # One pad or max_length for all means all list and string columns; a dict names any column read.
    pads = _by_column("pad", pad, selected) if isinstance(pad, Mapping) else _by_column("pad", pad, ragged)
    lengths = (_by_column("max_length", max_length, selected) if isinstance(max_length, Mapping)
               else _by_column("max_length", max_length, ragged))
    fills = _by_column("fill_null", fill_null, selected)
    requests, names = [], []
    for name in selected:
        if name in images:
            for option, given in (("pad", pads), ("max_length", lengths), ("fill_null", fills)):
                if name in given:
                    raise ValueError(f"{option}[{name!r}]: {name!r} is an image column (decode=), whose rows are "
                                     "decoded images: it takes no pad, max_length or fill_null")
            requests.append(decoded_request(name, decode[name], images[name]))
            names.append(name)
            continue
        info = infos[name]
        shape, list_shape = declared[name]
        if info["unsupported"]:
            raise ValueError(f"{what} column {name!r} of type {info['type']} is not read natively "
                             f"({info['unsupported']}): {_WAY_OUT}")
        if info["inner_lists"] and not list_shape:
            raise ValueError(f"{what} column {name!r} of type {info['type']} is not read natively (a list of lists "
                             "is read only with a declared shape, as a Hugging Face Array2D/Array3D feature gives "
                             f"it): {_WAY_OUT}")
        if info["first_null"] >= 0 and name not in fills:
            raise ValueError(f"{what} column {name!r} holds nulls (the first at row {info['first_null']}): pass "
                             f"fill_null={{{name!r}: value}} (with_valid=True adds {name + '_valid'!r}), or "
                             "drop it with columns=[...]")
        request = _request(name, info, shape, list_shape, pads, lengths, fills, with_valid, longest, what)
        requests.append(request)
        names.append(name)
        exact = bool(list_shape) and list_shape[0] >= 0
        if info["kind"] in ("list", "bytes") and not request[6] and not exact:
            names.append(_C.ragged_lengths_name(name))
        if with_valid and name in fills:
            names.append(name + "_valid")
    for n in names:
        if n in _RESERVED:
            raise ValueError(f"{what} column {n!r} has a name the loader reserves ({', '.join(_RESERVED)}): "
                             "rename it in the table, or drop it with columns=[...]")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"{what} columns clash with a list column's <name>_lengths or a filled column's "
                         f"<name>_valid: {repeated} would be given twice (parts: {names}); rename the column, or "
                         "drop one with columns=[...]")
    return selected, requests, names


def _with_images(selected: list[str], images: dict[str, tuple[str, str | None]]) -> list[str]:
    """`selected` with each image column in place of its stored leaves (bytes, path)."""
    out: list[str] = []
    for name, (data, path) in images.items():
        if data not in selected:
            raise ValueError(f"decode names the column {name!r}, which columns= leaves out: add it to columns")
    leaves = {leaf: name for name, pair in images.items() for leaf in pair if leaf}
    for n in selected:
        n = leaves.get(n, n)
        if n not in out:
            out.append(n)
    return out


def _select(columns: Sequence[str] | None, infos: dict[str, Any]) -> list[str]:
    if columns is None:
        return list(infos)
    if isinstance(columns, str):
        raise TypeError(f"columns must be a list of column names, got the string {columns!r}")
    selected: list[str] = []
    for c in columns:
        found = [n for n in infos if n == c or n.startswith(c + ".")]
        if not found:
            raise ValueError(f"the data has no column {c!r}; it has {list(infos)}")
        selected += [n for n in found if n not in selected]
    if not selected:
        raise ValueError("columns must name at least one column")
    return selected


def _is_text(info: dict) -> bool:
    return "binary" not in info["type"]


def _string_fill(name: str, value: Any, info: dict) -> bytes | None:
    """A string column's fill value as its bytes (None: the row stays None in a list of values)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple, str, bytes)) and len(value) == 0:
        return b""
    if _is_text(info) and isinstance(value, str):
        return value.encode()
    if not _is_text(info) and isinstance(value, (bytes, bytearray)):
        return bytes(value)
    want = "a str" if _is_text(info) else "bytes"
    raise ValueError(f"fill_null[{name!r}]: column {name!r} is {info['type']}: give {want} (the value of a null row), "
                     f"None, or [] (an empty row), got {value!r}")


def _list_fill(name: str, value: Any, dtype: Any, item_shape: Sequence[int], exact: int | None) -> bytes:
    """A list column's fill value: the items of a null row (an exact list: the whole row, a scalar
    broadcast to it)."""
    if exact is not None:
        return np.broadcast_to(_array_fill(name, value, dtype), (exact, *item_shape)).tobytes()
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return b""
    items = _array_fill(name, value, dtype)
    if items.ndim == 0 or items.shape[1:] != tuple(item_shape):
        raise ValueError(f"fill_null[{name!r}]: a null row of a list column becomes the items given: give [] (an "
                         f"empty row) or a list of items of shape {tuple(item_shape)}, got {value!r}")
    return items.tobytes()


def _array_fill(name: str, value: Any, dtype: Any) -> np.ndarray:
    try:
        a = np.asarray(value)
        items = a.astype(dtype) if a.size else np.zeros(a.shape, dtype)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"fill_null[{name!r}]={value!r} cannot be stored as {np.dtype(dtype)} ({e})") from None
    if a.size and not np.array_equal(items.astype(a.dtype), a, equal_nan=a.dtype.kind == "f"):
        raise ValueError(f"fill_null[{name!r}]={value!r} cannot be stored as {np.dtype(dtype)}")
    return items


def _request(name: str, info: dict, shape: tuple, list_shape: tuple, pads: dict, lengths: dict, fills: dict,
             with_valid: bool, longest: Any, what: str) -> tuple:
    """(name, max_items, pad bytes, fill, fill bytes, with_valid, as_list, shape, list_shape, fill_none):
    the native ArrowColumnRequest."""
    dtype = _DTYPES[tuple(info["dtype"])]
    kind = info["kind"]
    fill = name in fills
    valid = with_valid and fill
    if kind in ("list", "bytes"):
        inner = tuple(list_shape[1:]) + tuple(info["item_shape"])
        exact = list_shape[0] if list_shape and list_shape[0] >= 0 else None
        if name in lengths:
            if exact is not None:
                raise ValueError(f"max_length[{name!r}]: column {name!r} has the fixed shape {list(list_shape)}")
            n = lengths[name]
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
                raise ValueError(f"max_length[{name!r}] must be a positive int, got {n!r}")
        elif kind == "bytes":  # a Python list of the batch's values (str, or bytes for binary)
            value = _string_fill(name, fills[name], info) if fill else None
            return (name, 0, b"\0", fill, value or b"", valid, True, (), (), fill and value is None)
        elif exact is not None:
            n = exact
        elif longest is None:
            raise ValueError(f"{what} column {name!r} is a {info['type']}: pass max_length={{{name!r}: n}} (its "
                             "longest row is not known without decoding every row group), or drop it with "
                             "columns=[...]")
        else:
            n = max(1, longest(name))
        pad_bytes = _scalar_bytes("pad", name, pads.get(name, 0), dtype)
        if not fill:
            fill_bytes = b""
        elif kind == "bytes":
            fill_bytes = _string_fill(name, fills[name], info) or b""
        else:
            fill_bytes = _list_fill(name, fills[name], dtype, inner, exact)
        return (name, int(n), pad_bytes, fill, fill_bytes, valid, False, (), tuple(list_shape), False)
    if name in lengths:
        raise ValueError(f"max_length[{name!r}]: column {name!r} is {info['type']}, not a list or string")
    row_shape = shape or info["item_shape"]
    fill_bytes = _scalar_bytes("fill_null", name, fills[name], dtype, row_shape) if fill else b""
    return (name, 0, b"\0", fill, fill_bytes, valid, False, tuple(shape), (), False)
