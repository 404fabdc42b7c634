"""Shards written by webdataset's own ShardWriter read by fl.Tar: the samples and their order are
webdataset's (its WebDataset pipeline, unshuffled), the values the tarfile reference's."""
from __future__ import annotations

import gc
import io
import json
import warnings

import numpy as np
import pytest

import fastload as fl
from tar_reference import reference_samples

wds = pytest.importorskip("webdataset")


def write(tmp_path, n=23, maxcount=10):
    pattern = str(tmp_path / "shard-%06d.tar")
    with wds.ShardWriter(pattern, maxcount=maxcount, verbose=0) as sink:
        for i in range(n):
            sink.write({"__key__": f"sample{i:04d}", "cls": i % 5, "txt": f"text {i}",
                        "json": {"i": i, "name": f"n{i}"}, "npy": np.full((3,), i, dtype=np.int32),
                        "jpg": bytes([i]) * 20})
    return sorted(str(p) for p in tmp_path.glob("shard-*.tar"))


def test_shardwriter_shards_read_as_webdataset_reads_them(tmp_path):
    paths = write(tmp_path)
    assert len(paths) == 3
    ref = reference_samples(paths)
    with warnings.catch_warnings():  # webdataset leaves its shard files for the collector to close
        warnings.simplefilter("ignore", ResourceWarning)
        theirs = [s["__key__"] for s in wds.WebDataset(paths, shardshuffle=False, empty_check=False)]
        gc.collect()
    ds = fl.Tar(str(tmp_path / "shard-{000000..000002}.tar"))
    assert ds.shard_rows == [10, 10, 3]
    batches = list(fl.Loader(ds, batch_size=6, shuffle=False, device="cpu"))
    keys = [k for b in batches for k in b["__key__"]]
    assert keys == theirs == [r["__key__"] for r in ref]
    assert [v for b in batches for v in b["cls"].tolist()] == [i % 5 for i in range(23)]
    assert [v for b in batches for v in b["txt"]] == [f"text {i}" for i in range(23)]
    assert [v for b in batches for v in b["json"]] == [json.loads(r["json"]) for r in ref]
    assert np.array_equal(np.concatenate([b["npy"].numpy() for b in batches]),
                          np.stack([np.load(io.BytesIO(r["npy"])) for r in ref]))
    assert [v for b in batches for v in b["jpg"]] == [r["jpg"] for r in ref]
