"""Arrow data as a fastload source: `fl.Arrow` over a pyarrow Table, any object exposing the Arrow
PyCapsule interface (`__arrow_c_stream__` / `__arrow_c_array__`: Polars, DuckDB, pyarrow) or a
Hugging Face `datasets.Dataset` (its Arrow table, and its indices mapping after `select` or
`shuffle`). The buffers are read in place by the native gather; nothing is copied at
construction."""
from __future__ import annotations

import os
import pickle
from typing import Any, Mapping, Sequence

import numpy as np

from .. import _C
from .ragged import stored_scalar

__all__ = ["Arrow", "is_arrow_data", "plan_columns"]

_RESERVED = tuple(_C.RESERVED_NAMES)
_WAY_OUT = ("drop it with columns=[...] (fl.Arrow(data, columns=[...]) or fl.Parquet(path, columns=[...])), or "
            "pass the data as a Python dataset (an object with __getitem__, e.g. the Hugging Face dataset wrapped "
            "in a class that decodes it)")
_DTYPES = {(0, 8): np.int8, (0, 16): np.int16, (0, 32): np.int32, (0, 64): np.int64, (1, 8): np.uint8,
           (1, 16): np.uint16, (1, 32): np.uint32, (1, 64): np.uint64, (2, 16): np.float16, (2, 32): np.float32,
           (2, 64): np.float64, (6, 8): np.bool_}


def _is_hf_dataset(obj: Any) -> bool:
    return type(obj).__name__ == "Dataset" and type(obj).__module__.startswith("datasets") and hasattr(obj, "_data")


def is_arrow_data(obj: Any) -> bool:
    """Whether the Loader reads `obj` as Arrow: a Hugging Face Dataset, or an object exposing the
    Arrow PyCapsule stream or array interface."""
    return _is_hf_dataset(obj) or hasattr(obj, "__arrow_c_stream__") or hasattr(obj, "__arrow_c_array__")


def _table_of(obj: Any) -> Any:
    """A native ArrowTable moved out of obj's capsules (a stream preferred: it keeps the chunks)."""
    if hasattr(obj, "__arrow_c_stream__"):
        return _C.ArrowTable.from_stream(obj.__arrow_c_stream__())
    if hasattr(obj, "__arrow_c_array__"):
        schema, array = obj.__arrow_c_array__()
        return _C.ArrowTable.from_array(schema, array)
    raise TypeError(f"expected Arrow data (__arrow_c_stream__ or __arrow_c_array__), got {type(obj).__name__}")


def _hf_parts(ds: Any) -> tuple[Any, Any, list[str]]:
    """A Hugging Face Dataset's Arrow table, its indices table (or None) and its cache files."""
    table = ds.data.table if hasattr(ds.data, "table") else ds.data
    indices = getattr(ds, "_indices", None)
    if indices is not None:
        indices = indices.table if hasattr(indices, "table") else indices
    files = [f["filename"] for f in getattr(ds, "cache_files", None) or [] if "filename" in f]
    return table, indices, files


def _file_state(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


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


def plan_columns(table: Any, columns: Sequence[str] | None, pad: Any, max_length: Any, fill_null: Any,
                 with_valid: bool, longest: Any = None, what: str = "Arrow") -> tuple[list[str], list[tuple], list[str]]:
    """The columns read (leaf names), the native requests for them, and the batch's part names.
    `longest(name)` gives a list column's longest row when no max_length is given (None: refused)."""
    if not isinstance(with_valid, bool):
        raise TypeError(f"with_valid must be a bool, got {with_valid!r}")
    if fill_null is not None and not isinstance(fill_null, Mapping):
        raise TypeError(f"fill_null must be a dict of column -> value, got {type(fill_null).__name__}")
    infos = {c["name"]: c for c in table.columns}
    selected = _select(columns, infos)
    ragged = [n for n in selected if infos[n]["kind"] in ("list", "bytes")]
    # One pad or max_length for all means all list and string columns; a dict names any column read.
    pads = _by_column("pad", pad, selected) if isinstance(pad, Mapping) else _by_column("pad", pad, ragged)
    lengths = (_by_column("max_length", max_length, selected) if isinstance(max_length, Mapping)
               else _by_column("max_length", max_length, ragged))
    fills = _by_column("fill_null", fill_null, selected)
    requests, names = [], []
    for name in selected:
        info = infos[name]
        if info["unsupported"]:
            raise ValueError(f"{what} column {name!r} of type {info['type']} is not read natively "
                             f"({info['unsupported']}): {_WAY_OUT}")
        if info["first_null"] >= 0 and name not in fills:
            raise ValueError(f"{what} column {name!r} holds nulls (the first at row {info['first_null']}): pass "
                             f"fill_null={{{name!r}: value}} (with_valid=True adds {name + '_valid'!r}), or "
                             "drop it with columns=[...]")
        request = _request(name, info, pads, lengths, fills, with_valid, longest, what)
        requests.append(request)
        names.append(name)
        if request[6]:  # a list of values: no lengths, None where a null was
            continue
        if info["kind"] in ("list", "bytes"):
            names.append(_C.ragged_lengths_name(name))
        if with_valid and name in fills:
            names.append(name + "_valid")
    for n in names:
        if n in _RESERVED:
            raise ValueError(f"{what} column {n!r} has a name the loader reserves ({', '.join(_RESERVED)}): "
                             "rename it in the table, or drop it with columns=[...]")
    if len(set(names)) != len(names):
        raise ValueError(f"{what} columns clash with a list column's <name>_lengths or <name>_valid: {names}")
    return selected, requests, names


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


def _request(name: str, info: dict, pads: dict, lengths: dict, fills: dict, with_valid: bool, longest: Any,
             what: str) -> tuple:
    dtype = _DTYPES[tuple(info["dtype"])]
    kind = info["kind"]
    fill = name in fills
    if kind in ("list", "bytes"):
        if fill and fills[name] not in ([], "", b"", None):  # noqa: PLR6201
            raise ValueError(f"fill_null[{name!r}]: a null row of a list or string column becomes an empty row "
                             f"(lengths 0): give [], got {fills[name]!r}")
        if name in lengths:
            n = lengths[name]
            if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
                raise ValueError(f"max_length[{name!r}] must be a positive int, got {n!r}")
        elif kind == "bytes":  # a Python list of the batch's values (str, or bytes for binary)
            return (name, 0, b"\0", fill, b"", False, True)
        elif longest is None:
            raise ValueError(f"{what} column {name!r} is a {info['type']}: pass max_length={{{name!r}: n}} (its "
                             "longest row is not known without decoding every row group), or drop it with "
                             "columns=[...]")
        else:
            n = max(1, longest(name))
        pad_bytes = _scalar_bytes("pad", name, pads.get(name, 0), dtype)
        return (name, int(n), pad_bytes, fill, b"", with_valid and fill, False)
    if name in lengths:
        raise ValueError(f"max_length[{name!r}]: column {name!r} is {info['type']}, not a list or string")
    fill_bytes = _scalar_bytes("fill_null", name, fills[name], dtype, info["item_shape"]) if fill else b""
    return (name, 0, b"\0", fill, fill_bytes, with_valid and fill, False)


class Arrow:
    """Arrow data read natively: a pyarrow Table, any `__arrow_c_stream__` / `__arrow_c_array__`
    producer (Polars, DuckDB, pyarrow), or a Hugging Face `datasets.Dataset`.

    Rows are gathered from the Arrow buffers by the collation threads (chunks are shards); a
    Hugging Face dataset after `select` / `shuffle` is read through its indices mapping, and its
    `with_format(...)` is ignored. Column types (see docs/arrow.md): fixed-width numbers and bool
    -> (batch,); fixed-size lists (nested) -> (batch, n, ...); list / large_list -> padded to the
    longest row (or `max_length`) with `<name>_lengths`; string / binary -> a Python list of the
    batch's values (str / bytes, built natively once per batch), or with `max_length` the UTF-8
    bytes padded as uint8 with `<name>_lengths`; struct columns flatten to `parent.child`;
    dictionary columns are decoded.

    Args:
        data: the Arrow data.
        columns: the columns to read (a struct's name selects all its fields); default all.
        pad: the pad value of list and string columns (one for all, or a dict by column).
        max_length: the padded length of list and string columns (one for all, or a dict by
            column; rows are cut to it). A string column with it gives padded bytes instead of
            a list; a list column without it is padded to its longest row, which reads its
            offsets once here.
        fill_null: {column: value} for columns holding nulls (a null list or padded string
            becomes an empty row: give []; a string given as a list has None there). A column
            with nulls and no fill is refused.
        with_valid: add `<name>_valid` (bool, False where the row was null) for every column in
            fill_null.
    """

    def __init__(self, data: Any, columns: Sequence[str] | None = None, *, pad: Any = None, max_length: Any = None,
                 fill_null: Mapping[str, Any] | None = None, with_valid: bool = False):
        if isinstance(data, Arrow):
            raise TypeError("data is already an fl.Arrow: pass it to the Loader as it is")
        self._args = {"columns": columns, "pad": pad, "max_length": max_length, "fill_null": fill_null,
                      "with_valid": with_valid}
        self._files: list[str] = []
        indices = None
        if _is_hf_dataset(data):
            table_obj, indices_obj, self._files = _hf_parts(data)
            table = _table_of(table_obj)
            indices = _table_of(indices_obj) if indices_obj is not None else None
        elif is_arrow_data(data):
            table = _table_of(data)
        else:
            raise TypeError(f"fl.Arrow reads Arrow data (a pyarrow Table, an object with __arrow_c_stream__ or "
                            f"__arrow_c_array__, or a Hugging Face Dataset), got {type(data).__name__}")
        self._producer = data
        self._table, self._indices = table, indices
        self._selected, self._requests, names = plan_columns(table, columns, pad, max_length, fill_null, with_valid,
                                                             longest=table.longest)
        self._names = names
        self._rows = indices.rows if indices is not None else table.rows
        if self._rows == 0:
            raise ValueError("the Arrow data has no rows")
        self._fingerprint_files = [_file_state(f) for f in self._files]
        self.string_lists = [r[0] for r in self._requests if r[6]]
        self._native = _C.ArrowSource(self._table, self._requests, self._indices,
                                      (self._table, self._indices, self._producer))

    def __len__(self) -> int:
        return self._rows

    @property
    def names(self) -> list[str]:
        return list(self._names)

    @property
    def shard_rows(self) -> list[int] | None:
        """Rows per Arrow chunk; None through an indices mapping (its rows are not chunk-ordered)."""
        return None if self._indices is not None else list(self._table.chunk_rows)

    @property
    def schema(self) -> dict[str, Any]:
        """{column: (dtype, shape, arrow_type)} of the columns read: the torch dtype and row shape
        of its batch entry (`str`/`bytes` for a list of values) and its Arrow type, unit and time
        zone included (`timestamp[ms, tz=UTC]`: its int64s are milliseconds)."""
        from .column_types import column_types  # noqa: PLC0415 - torch and this module only

        return column_types(self._table, self._selected, self._native)

    def native_source(self) -> Any:
        return self._native

    def fingerprint(self) -> Any:
        return list(self._fingerprint_files)

    def check_fingerprint(self, fp: Any) -> None:
        for path, size, mtime, inode in fp:
            try:
                now = _file_state(path)
            except OSError as e:
                raise ValueError(f"the Arrow file {path} of this dataset is gone ({e}): the dataset was changed "
                                 "while fastload read it; open it again") from None
            if now != (path, size, mtime, inode):
                raise ValueError(f"the Arrow file {path} was rewritten since the Loader was built (size {size} -> "
                                 f"{now[1]}): open the dataset again and build a new Loader")

    def __reduce__(self) -> Any:
        # The producer pickles itself (a pyarrow Table its buffers; a Hugging Face dataset its
        # memory-mapped files by path, and its indices mapping), and the copy is read afresh.
        if not _pickles_itself(self._producer):
            try:
                pickle.dumps(self._producer)
            except Exception as e:  # noqa: BLE001 - whatever the producer raises, the answer is the same
                raise TypeError(f"fl.Arrow over a {type(self._producer).__module__}.{type(self._producer).__qualname__} "
                                f"cannot be pickled: its producer does not pickle ({type(e).__name__}: {e}); build "
                                "the fl.Arrow in the process that reads it, or give it a pyarrow Table or a Hugging "
                                "Face dataset") from None
        return (_rebuild, (self._producer, self._args, self.fingerprint()))

    def __repr__(self) -> str:
        via = " through an indices mapping" if self._indices is not None else ""
        return f"Arrow({len(self)} rows{via}; {', '.join(self._selected)})"


def _pickles_itself(obj: Any) -> bool:
    """Producers known to pickle (checked without pickling them twice)."""
    if _is_hf_dataset(obj):
        return True
    t = type(obj)
    return t.__module__.startswith("pyarrow") and t.__name__ in ("Table", "RecordBatch", "ChunkedArray", "Array")


def _rebuild(producer: Any, args: dict, fingerprint: Any) -> Arrow:
    source = Arrow(producer, **args)
    source.check_fingerprint(fingerprint)
    return source
