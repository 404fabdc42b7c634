"""Arrow data as a fastload source: `fl.Arrow` over a pyarrow Table, any object exposing the Arrow
PyCapsule interface (`__arrow_c_stream__` / `__arrow_c_array__`: Polars, DuckDB, pyarrow) or a
Hugging Face `datasets.Dataset` (its Arrow table, and its indices mapping after `select` or
`shuffle`). The buffers are read in place by the native gather; nothing is copied at
construction."""
from __future__ import annotations

import os
import pickle
from typing import Any, Mapping, Sequence

from .. import _C
from .arrow_plan import plan_columns
from .hugging_face import describe_transform, hf_format_columns, hf_parts, hf_transform, is_hf_dataset

__all__ = ["Arrow", "is_arrow_data", "plan_columns"]



def is_arrow_data(obj: Any) -> bool:
    """Whether the Loader reads `obj` as Arrow: a Hugging Face Dataset (without a transform: one
    with `with_transform` / `set_transform` is read as a Python dataset, through `ds[i]`, which
    applies it), or an object exposing the Arrow PyCapsule stream or array interface."""
    if is_hf_dataset(obj):
        return hf_transform(obj) is None
    return hasattr(obj, "__arrow_c_stream__") or hasattr(obj, "__arrow_c_array__")


def _table_of(obj: Any) -> Any:
    """A native ArrowTable moved out of obj's capsules (a stream preferred: it keeps the chunks)."""
    if hasattr(obj, "__arrow_c_stream__"):
        return _C.ArrowTable.from_stream(obj.__arrow_c_stream__())
    if hasattr(obj, "__arrow_c_array__"):
        schema, array = obj.__arrow_c_array__()
        return _C.ArrowTable.from_array(schema, array)
    raise TypeError(f"expected Arrow data (__arrow_c_stream__ or __arrow_c_array__), got {type(obj).__name__}")


def _file_state(path: str) -> tuple[str, int, int, int]:
    st = os.stat(path)
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


class Arrow:
    """Arrow data read natively: a pyarrow Table, any `__arrow_c_stream__` / `__arrow_c_array__`
    producer (Polars, DuckDB, pyarrow), or a Hugging Face `datasets.Dataset`.

    Rows are gathered from the Arrow buffers by the collation threads (chunks are shards); a
    Hugging Face dataset after `select` / `shuffle` is read through its indices mapping; its
    `with_format(columns=[...])` selects those columns (the format type does not matter: batches
    are torch tensors), and a transform (`with_transform` / `set_transform`) is refused here (the
    Loader reads such a dataset through `ds[i]`). Column types (see docs/arrow.md): fixed-width
    numbers and bool -> (batch,); fixed-size lists (nested) -> (batch, n, ...);
    `arrow.fixed_shape_tensor` -> (batch, *shape); Hugging Face Array2D..Array5D -> (batch,
    *shape), each row's shape checked as it is read; list / large_list / list_view (of numbers
    or bools) -> padded to the longest row (or `max_length`) with `<name>_lengths`; string /
    binary (views too) -> a Python list of the batch's values (str / bytes, built natively once
    per batch), or with `max_length` the bytes padded as uint8 with `<name>_lengths`; struct
    columns flatten to `parent.child` (two columns flattening to one name are refused); dictionary
    columns are decoded; other extension types are refused, naming them.

    Args:
        data: the Arrow data.
        columns: the columns to read (a struct's name selects all its fields); default all.
        pad: the pad value of list and string columns (one for all, or a dict by column).
        max_length: the padded length of list and string columns (one for all, or a dict by
            column; rows are cut to it). A string column with it gives padded bytes instead of
            a list; a list column without it is padded to its longest row, which reads its
            offsets once here.
        fill_null: {column: value} for columns holding nulls: a number for a number column; for
            a string column a str (bytes for binary), None (a list of values has None there; a
            padded one an empty row) or [] (an empty row); for a list column the items of the
            null row ([] for an empty row). A column with nulls and no fill is refused.
        with_valid: add `<name>_valid` (bool, False where the row was null) for every column in
            fill_null.
        decode: {column: fl.Image(...)}: the column's encoded images (a binary column, or a
            Hugging Face Image feature: a struct of bytes and path, the file at path read where
            bytes is null) decoded natively per sample into a uint8 part of that name, as
            fl.ImageFolder decodes its files (docs/images.md). A Hugging Face Image column is
            refused without it.
    """

    def __init__(self, data: Any, columns: Sequence[str] | None = None, *, pad: Any = None, max_length: Any = None,
                 fill_null: Mapping[str, Any] | None = None, with_valid: bool = False,
                 decode: Mapping[str, Any] | None = None):
        if isinstance(data, Arrow):
            raise TypeError("data is already an fl.Arrow: pass it to the Loader as it is")
        self._args = {"columns": columns, "pad": pad, "max_length": max_length, "fill_null": fill_null,
                      "with_valid": with_valid,
                      "decode": decode}
        self._files: list[str] = []
        indices = None
        if is_hf_dataset(data):
            transform = hf_transform(data)
            if transform is not None:
                raise ValueError(f"the Hugging Face dataset has a transform ({describe_transform(transform)}, set by "
                                 "with_transform or set_transform): fl.Arrow reads the stored columns and cannot apply "
                                 "it. Pass the dataset to fl.Loader itself (it is then read as a Python dataset, "
                                 "through ds[i], which applies the transform), or read the stored columns with "
                                 "fl.Arrow(ds.with_format(None))")
            if columns is None:
                columns = hf_format_columns(data)  # with_format(columns=[...]): those columns only
            else:
                hf_format_columns(data)  # format arguments fastload does not honour are refused all the same
            table_obj, indices_obj, self._files = hf_parts(data)
            table = _table_of(table_obj)
            indices = _table_of(indices_obj) if indices_obj is not None else None
        elif is_arrow_data(data):
            table = _table_of(data)
        else:
            raise TypeError(f"fl.Arrow reads Arrow data (a pyarrow Table, an object with __arrow_c_stream__ or "
                            f"__arrow_c_array__, or a Hugging Face Dataset), got {type(data).__name__}")
        self._producer = data
        self._table, self._indices = table, indices
        self._rows = indices.rows if indices is not None else table.rows
        if self._rows == 0:  # before the columns: an empty dataset's columns may have no type (null)
            raise ValueError("the Arrow data has no rows")
        self._selected, self._requests, names = plan_columns(table, columns, pad, max_length, fill_null, with_valid,
                                                             longest=table.longest, decode=decode)
        self._names = names
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
        from .._columns.arrow_types import column_types  # noqa: PLC0415 - torch and this module only

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
    if is_hf_dataset(obj):
        return True
    t = type(obj)
    return t.__module__.startswith("pyarrow") and t.__name__ in ("Table", "RecordBatch", "ChunkedArray", "Array")


def _rebuild(producer: Any, args: dict, fingerprint: Any) -> Arrow:
    source = Arrow(producer, **args)
    source.check_fingerprint(fingerprint)
    return source
