"""What an Arrow source's batch must hold, built with pyarrow (`take` + numpy padding): the
reference the Arrow and Parquet tests compare the native gather against."""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def _flat(chunked: Any) -> pa.Array:
    a = chunked.combine_chunks() if isinstance(chunked, pa.ChunkedArray) else chunked
    if pa.types.is_dictionary(a.type):
        a = a.dictionary_decode()
    return a


def expected_column(column: Any, ids: np.ndarray, *, max_length: int | None = None, pad: Any = 0,
                    fill: Any = None) -> dict[str, np.ndarray]:
    """Rows `ids` of one Arrow column as fastload gives them: {"": values, "_lengths": ..., "_valid": ...}."""
    whole = _flat(column)
    a = whole.take(pa.array(ids, type=pa.int64()))
    valid = np.asarray(a.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    t = a.type
    out: dict[str, np.ndarray] = {"_valid": valid}
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_string(t) or pa.types.is_large_string(t) \
            or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        rows = a.to_pylist()
        is_text = not (pa.types.is_list(t) or pa.types.is_large_list(t))
        if is_text:
            rows = [None if r is None else (r.encode() if isinstance(r, str) else r) for r in rows]
            rows = [None if r is None else np.frombuffer(r, np.uint8) for r in rows]
            dtype: Any = np.uint8
            item_shape = []
        else:
            item, item_shape = t.value_type, []
            while pa.types.is_fixed_size_list(item):
                item_shape.append(item.list_size)
                item = item.value_type
            dtype = item.to_pandas_dtype()
            rows = [None if r is None else np.asarray(r, dtype=dtype).reshape(-1, *item_shape) for r in rows]
        if max_length is None:  # fastload pads to the column's longest row
            sizes = pc.list_value_length(whole) if not is_text else pc.binary_length(whole)
            max_length = max(1, pc.max(sizes).as_py() or 0)
        values = np.full((len(rows), max_length, *item_shape), pad, dtype=dtype)
        lengths = np.zeros(len(rows), np.int64)
        for i, r in enumerate(rows):
            if r is None:
                continue
            n = min(len(r), max_length)
            values[i, :n] = r[:n]
            lengths[i] = n
        out[""] = values
        out["_lengths"] = lengths
        return out
    shape: list[int] = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    if shape:
        flat = a
        for size in shape:  # .values keeps the slots of null rows (flatten() drops them)
            flat = flat.values.slice(flat.offset * size, len(flat) * size)
        values = np.asarray(flat.to_numpy(zero_copy_only=False)).reshape(len(a), *shape)
        if fill is not None:
            values = values.copy()
            values[~valid] = fill
    elif pa.types.is_fixed_size_binary(t):
        values = np.stack([np.frombuffer(r, np.uint8) if r is not None else np.full(t.byte_width, 0, np.uint8)
                           for r in a.to_pylist()])
    else:
        if pa.types.is_temporal(t):  # fastload gives the stored integers
            a = a.view(pa.int32() if t.bit_width == 32 else pa.int64())
        values = a.fill_null(fill).to_numpy(zero_copy_only=False) if fill is not None else \
            a.to_numpy(zero_copy_only=False)
    if pa.types.is_boolean(t):
        values = np.asarray(values, dtype=bool)
    out[""] = np.asarray(values)
    return out


def flat_columns(table: pa.Table) -> dict[str, Any]:
    """The table's columns with struct fields flattened to "parent.child" (fastload's names)."""
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    return {name: table.column(name) for name in table.column_names}


def check_batch(batch: dict, table: pa.Table, row_of: Any = None, **options: Any) -> int:
    """Compares every column of a batch (with "index") against the table's rows; `row_of` maps a
    sample id to the table's row (an indices mapping). Returns the rows checked."""
    ids = batch["index"].numpy()
    rows = np.asarray([row_of[i] for i in ids] if row_of is not None else ids, dtype=np.int64)
    columns = flat_columns(table)
    lengths = options.get("max_length") or {}
    pads = options.get("pad") or {}
    fills = options.get("fill_null") or {}
    seen = 0
    for name, column in columns.items():
        if name not in batch:
            continue
        if isinstance(batch[name], list):  # strings given as a list of the batch's values
            assert batch[name] == _flat(column).take(pa.array(rows, type=pa.int64())).to_pylist(), name
            seen += 1
            continue
        want = expected_column(column, rows, max_length=lengths.get(name), pad=pads.get(name, 0),
                               fill=fills.get(name))
        got = batch[name].numpy()
        assert got.shape == want[""].shape, (name, got.shape, want[""].shape)
        np.testing.assert_array_equal(got, want[""], err_msg=name)
        if name + "_lengths" in batch:
            np.testing.assert_array_equal(batch[name + "_lengths"].numpy(), want["_lengths"], err_msg=name)
        if name + "_valid" in batch:
            np.testing.assert_array_equal(batch[name + "_valid"].numpy(), want["_valid"], err_msg=name)
        seen += 1
    assert seen, "no column compared"
    return len(ids)


def batches_in_child(source: Any, loader_kwargs: dict) -> list[dict]:
    """Run in a spawned process (the source arrives pickled): every batch of a Loader over it, as
    numpy arrays and lists, for the parent to compare."""
    import fastload as fl

    out = []
    for b in fl.Loader(source, **loader_kwargs):
        out.append({k: (v if isinstance(v, list) else v.numpy()) for k, v in b.items()})
    return out


def epoch(source, batch_size: int = 7, **kw) -> dict:
    """One epoch in sample order (shuffle off: the source's default order is by row), as numpy arrays (lists stay lists), concatenated."""
    import fastload as fl

    out: dict = {}
    for b in fl.Loader(source, batch_size=batch_size, device="cpu", num_threads=2, **kw):
        for k, v in b.items():
            out.setdefault(k, []).append(v if isinstance(v, list) else v.numpy())
    return {k: sum(v, []) if isinstance(v[0], list) else np.concatenate(v) for k, v in out.items()}
