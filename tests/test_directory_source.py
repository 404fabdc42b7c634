"""Dataset.open is one source for a local directory and a prefix in object storage (DiskDataset on
the FileSet of its files): the same class, the same batches, the same shards, and what only a
fetched dataset has (its stored files and counters) or only a local one (identity checks)."""
from __future__ import annotations

import pickle
import uuid

import numpy as np
import pytest

import fastload as fl
from remote_helpers import batches, equal, opts, upload_dir

boto3 = pytest.importorskip("boto3")


@pytest.fixture
def both(s3_server, tmp_path):
    """The same ragged dataset directory on disk and uploaded: (local DiskDataset, remote one, columns)."""
    endpoint = s3_server[0]
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 9, size=90)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    cols = {"x": np.arange(90, dtype=np.int64), "t": fl.Ragged(rng.integers(0, 99, int(offsets[-1])), offsets)}
    local = tmp_path / "ds"
    fl.write_dataset(local, cols, rows_per_shard=20, fsync=False)
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    upload_dir(s3, bucket, "ds", local)
    remote = fl.Dataset.open(f"s3://{bucket}/ds", storage_options=opts(endpoint), cache_dir=tmp_path / "cache")
    return fl.Dataset.open(local), remote, lengths


def test_a_path_and_a_url_open_as_one_source_with_the_same_batches(both):
    here, there, _ = both
    assert type(here) is type(there) is fl.DiskDataset
    assert here.names == there.names and here.shard_rows == there.shard_rows == [20, 20, 20, 20, 10]
    kw = dict(batch_size=7, shuffle=True, seed=2, order="block", device="cpu")
    equal(batches(fl.Loader(there, **kw)), batches(fl.Loader(here, **kw)))
    assert here.stored_files() is None and there.stored_files() is not None  # only URLs are fetched
    assert here.cache_dir is None and there.cache_dir is not None
    with pytest.raises(ValueError, match="storage_stats.* local"):
        here.storage_stats()
    assert there.storage_stats().bytes_fetched > 0
    # fl.Pack packs the local one and names object storage for the URL one (no longer "got RemoteDataset")
    assert len(fl.Pack(here, length=16, columns=["t"])) > 0
    with pytest.raises(ValueError, match="object storage"):
        fl.Pack(there, length=16, columns=["t"])


def test_shard_and_verify_read_fetched_files_after_a_loader_maps_them(both):
    """shard(k) and verify() of a fetched dataset go through the FileSet after the collation
    threads' LazyFiles became the fetcher's reader (no pins of its own): against the local one."""
    here, there, lengths = both
    batches(fl.Loader(there, batch_size=16, device="cpu"))
    for k in range(here.num_shards):
        a, b = here.shard(k), there.shard(k)
        np.testing.assert_array_equal(a["x"], b["x"])
        for u, v in zip(a["t"], b["t"]):
            np.testing.assert_array_equal(u, v)
    np.testing.assert_array_equal(np.diff(there.shard(1)["t"][1]), lengths[20:40])  # the offsets, per row
    there.verify()
    here.verify()


def test_a_pickled_url_dataset_is_the_one_source_again(both):
    _, there, _ = both
    back = pickle.loads(pickle.dumps(there))
    assert type(back) is fl.DiskDataset and back.url == back.path == there.path
    kw = dict(batch_size=9, shuffle=True, seed=1, device="cpu")
    equal(batches(fl.Loader(back, **kw)), batches(fl.Loader(there, **kw)))
