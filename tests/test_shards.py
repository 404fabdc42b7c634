"""Columns given as lists of arrays: one column to the core (a shard table searched on the
collation threads), against the concatenation; shard_rows, the contract with order="block"
and partition="shards"."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload as fl


# Shard sizes for each lookup the core picks: one shard (the strided fast path), equal shards
# (bucket table, no walk), uneven ones (bucket table with walks), empty ones (dropped), and a
# cluster of tiny shards beside a large one (too uneven for buckets: binary search).
SIZES = [[5], [1, 1, 1], [0, 10, 0, 0, 7, 0], [300, 1, 2000, 3, 511], [1] * 257, [64] * 40, [1] * 50 + [5000]]


@pytest.mark.parametrize("sizes", SIZES, ids=lambda s: f"{len(s)}shards-{sum(s)}rows")
@pytest.mark.parametrize("row", [(), (3,), (2, 512), (5000,)], ids=str)
def test_sharded_column_equals_its_concatenation(rng, sizes, row):
    parts = [rng.integers(0, 255, (n,) + row).astype(np.uint8) for n in sizes]
    whole = np.concatenate(parts)
    ds = fl.Dataset({"x": parts, "i": [np.arange(len(whole))]})
    assert len(ds) == len(whole)
    assert ds.shard_rows == (sizes if len(sizes) > 1 else None)
    seen = 0
    for b in fl.Loader(ds, 300, shuffle=True, num_threads=2, seed=1):
        np.testing.assert_array_equal(b["x"].numpy(), whole[b["i"].numpy()])
        seen += len(b["i"])
    assert seen == len(whole)


def test_sequential_reads_cross_shards_in_order(rng):
    parts = [np.arange(a, b) for a, b in [(0, 10), (10, 11), (11, 50)]]
    got = np.concatenate([b["x"].numpy() for b in fl.Loader(fl.Dataset({"x": parts}), 8)])
    np.testing.assert_array_equal(got, np.arange(50))


def test_shard_rows_is_the_contract(rng):
    assert fl.Dataset({"x": np.arange(5)}).shard_rows is None
    ds = fl.Dataset({"x": [np.arange(3), np.arange(4)], "y": np.arange(7)})  # a plain array fits any boundaries
    assert ds.shard_rows == [3, 4]
    assert fl.Windows(np.arange(9), length=3).shard_rows is None
    with pytest.raises(ValueError, match=r"same rows per shard: 'x' has \[3, 4\], 'y' has \[4, 3\]"):
        fl.Dataset({"x": [np.arange(3), np.arange(4)], "y": [np.arange(4), np.arange(3)]})


def test_shards_must_agree(rng):
    with pytest.raises(TypeError, match="column 'x': shard 1 has another dtype"):
        fl.Dataset({"x": [np.arange(3), np.arange(3, dtype=np.int32)]})
    with pytest.raises(ValueError, match=r"column 'x': shard 1 has rows of shape \(2,\)"):
        fl.Dataset({"x": [np.zeros((3, 3)), np.zeros((3, 2))]})
    with pytest.raises(ValueError, match="column 'x' is an empty list of arrays"):
        fl.Dataset({"x": []})


def test_tensors_as_shards():
    parts = [torch.arange(10, dtype=torch.bfloat16), torch.arange(10, 15, dtype=torch.bfloat16)]
    b = next(iter(fl.Loader(fl.Dataset({"x": parts}), 15)))
    assert b["x"].dtype == torch.bfloat16
    assert torch.equal(b["x"], torch.arange(15, dtype=torch.bfloat16))
