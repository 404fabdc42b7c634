"""Ragged columns in memory: padded slots and lengths against numpy, pad values and caps, item
shapes, sharded values, and the checks on offsets and pad values."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload as fl


def padded(rows, width, pad, dtype):
    """The numpy statement of a batch: rows cut at width and padded."""
    out = np.full((len(rows), width) + rows[0].shape[1:], pad, dtype=dtype)
    lengths = np.array([min(len(r), width) for r in rows], dtype=np.int64)
    for k, r in enumerate(rows):
        out[k, :lengths[k]] = r[:width]
    return out, lengths


def rows_of(rng, n, dtype, longest=10, item_shape=()):
    rows = []
    for _ in range(n):
        m = int(rng.integers(0, longest + 1))
        rows.append((rng.standard_normal((m,) + item_shape) * 100).astype(dtype))
    return rows


@pytest.mark.parametrize("dtype,pad", [(np.int32, 0), (np.int64, -1), (np.uint16, 65535), (np.float32, float("nan")),
                                       (np.float64, 2.5), (np.int8, 7), (np.bool_, True)], ids=str)
@pytest.mark.parametrize("cap", [None, 4, 0, 100])
def test_batches_match_numpy_padding(rng, dtype, pad, cap):
    rows = rows_of(rng, 300, dtype)
    source = fl.Ragged.from_rows(rows, pad=pad, max_length=cap)
    width = max(len(r) for r in rows) if cap is None else min(cap, max(len(r) for r in rows))
    assert source.length == width and len(source) == 300
    ds = fl.Dataset({"r": source, "i": np.arange(300)})
    assert ds.names == ["r", "r_lengths", "i"]
    for b in fl.Loader(ds, 32, shuffle=True, num_threads=2):
        ids = b["i"].numpy()
        want, lengths = padded([rows[k] for k in ids], width, pad, dtype)
        assert b["r"].shape == (len(ids), width) and b["r_lengths"].dtype == torch.int64
        np.testing.assert_array_equal(b["r_lengths"].numpy(), lengths)
        np.testing.assert_array_equal(b["r"].numpy(), want)  # NaN pads compare equal here


def test_values_offsets_tuple_with_offset_start_and_item_shape(rng):
    values = rng.standard_normal((200, 3)).astype(np.float32)
    offsets = np.array([5, 5, 9, 30, 31, 60, 200], dtype=np.int32)  # need not start at 0
    ds = fl.Dataset({"r": (values, offsets)})
    rows = [values[offsets[k]:offsets[k + 1]] for k in range(6)]
    b = next(iter(fl.Loader(ds, 6)))
    want, lengths = padded(rows, 140, 0, np.float32)
    np.testing.assert_array_equal(b["r"].numpy(), want)
    np.testing.assert_array_equal(b["r_lengths"].numpy(), lengths)


def test_sharded_ragged_column_and_torch_values(rng):
    rows = rows_of(rng, 50, np.int64)
    parts = [rows[:20], rows[20:21], rows[21:]]
    values = [torch.from_numpy(np.concatenate(p)) for p in parts]
    offsets = [np.concatenate([[0], np.cumsum([len(r) for r in p])]) for p in parts]
    ds = fl.Dataset({"r": fl.Ragged(values, offsets, pad=-7), "i": [np.arange(20), np.arange(20, 21), np.arange(21, 50)]})
    assert ds.shard_rows == [20, 1, 29]
    for b in fl.Loader(ds, 8, shuffle=True):
        want, lengths = padded([rows[k] for k in b["i"].numpy()], max(len(r) for r in rows), -7, np.int64)
        np.testing.assert_array_equal(b["r"].numpy(), want)
        np.testing.assert_array_equal(b["r_lengths"].numpy(), lengths)


def test_all_rows_empty(rng):
    ds = fl.Dataset({"r": fl.Ragged(np.zeros(0, np.float32), np.zeros(5, np.int64))})
    b = next(iter(fl.Loader(ds, 5)))  # 4 rows
    assert b["r"].shape == (4, 0)
    np.testing.assert_array_equal(b["r_lengths"].numpy(), np.zeros(4))


def test_ragged_rejects(rng):
    v = np.arange(10, dtype=np.int32)
    with pytest.raises(ValueError, match=r"offsets must be non-decreasing, got 5 then 3 at row 1"):
        fl.Ragged(v, [0, 5, 3, 10])
    with pytest.raises(ValueError, match=r"offsets must lie in \[0, 10\]"):
        fl.Ragged(v, [0, 5, 11])
    with pytest.raises(TypeError, match="offsets must be a 1-D integer array"):
        fl.Ragged(v, np.array([0.0, 2.0]))
    with pytest.raises(ValueError, match="offsets must hold rows"):
        fl.Ragged(v, np.zeros(0, np.int64))
    with pytest.raises(ValueError, match="values given as a list of shards need offsets as a list of the same length"):
        fl.Ragged([v], np.array([0, 10]))
    with pytest.raises(ValueError, match=r"max_length must be non-negative, got -1"):
        fl.Ragged(v, [0, 10], max_length=-1)
    with pytest.raises(TypeError, match=r"max_length must be an integer or None, got 2.5"):
        fl.Ragged(v, [0, 10], max_length=2.5)
    for pad, match in [(-1, "pad=-1 cannot be stored as uint8"), (1.5, r"pad=1.5 cannot be stored as int32 \(it becomes 1\)"),
                       ([1, 2], "pad must be a scalar")]:
        values = np.arange(10, dtype=np.uint8) if pad == -1 else v
        with pytest.raises(ValueError, match=match):
            fl.Dataset({"r": fl.Ragged(values, [0, 10], pad=pad)})
    with pytest.raises(ValueError, match="clashes with a ragged column's <name>_lengths"):
        fl.Dataset({"r": (v, [0, 10]), "r_lengths": np.arange(1)})
    with pytest.raises(ValueError, match="values must be contiguous"):
        fl.Dataset({"r": (np.arange(20, dtype=np.int32)[::2], [0, 10])})
