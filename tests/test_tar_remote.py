"""fl.Tar over shards in object storage (the moto S3 server behind the fault proxy): through the
storage seam (FileSet), the same batches as from the local shards, for ranks, partition="shards",
a cache smaller than the data, resume, a pickle; faults retried; an object rewritten after it was
pinned refused, naming it."""
from __future__ import annotations

import os
import pathlib
import pickle
import uuid

import numpy as np
import pytest

import fastload as fl
from remote_helpers import S3_CLIENTS, opts
from tar_reference import every_kind_sample, write_shard

boto3 = pytest.importorskip("boto3")
FIELDS = ["__key__", "cls", "txt", "json", "npy", "jpg"]


@pytest.fixture
def shards(tmp_path):
    d = tmp_path / "local"
    d.mkdir()
    i = 0
    for s, n in enumerate([40, 25, 33, 30]):
        write_shard(d / f"train-{s:06d}.tar", [every_kind_sample(i + j) for j in range(n)])
        i += n
    return d


def upload(endpoint, local):
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    for name in sorted(os.listdir(local)):
        s3.put_object(Bucket=bucket, Key=f"shards/{name}", Body=(local / name).read_bytes())
    return bucket, s3


def batches(loader):
    with loader:
        return [{k: (v.clone() if hasattr(v, "clone") else list(v)) for k, v in b.items()} for b in loader]


def equal(a, b):
    assert len(a) == len(b) and len(a) > 0
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], list):
                assert x[k] == y[k], k
            else:
                assert np.array_equal(x[k].numpy(), y[k].numpy()), k


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_batches_from_s3_equal_the_local_shards(shards, s3_server, s3_proxy, tmp_path, client):
    bucket, _ = upload(s3_server[0], shards)
    remote = fl.Tar(f"s3://{bucket}/shards/train-{{000000..000003}}.tar", fields=FIELDS,
                    storage_options=opts(s3_proxy.url, client=client), cache_dir=tmp_path / "cache")
    here = fl.Tar(str(shards / "train-{000000..000003}.tar"), fields=FIELDS)
    assert remote.shards == [f"s3://{bucket}/shards/train-{s:06d}.tar" for s in range(4)]
    assert remote.shard_rows == here.shard_rows == [40, 25, 33, 30]
    for rank in range(3):
        kw = dict(batch_size=8, shuffle=True, seed=5, rank=rank, world_size=3, num_threads=2, device="cpu")
        equal(batches(fl.Loader(remote, **kw)), batches(fl.Loader(here, **kw)))
    kw = dict(batch_size=8, shuffle=True, seed=6, rank=1, world_size=2, partition="shards", device="cpu")
    equal(batches(fl.Loader(remote, **kw)), batches(fl.Loader(here, **kw)))
    # A prefix is listed as a folder; the index is cached by version: opening again fetches nothing.
    again = fl.Tar(f"s3://{bucket}/shards/", fields=FIELDS, storage_options=opts(s3_proxy.url, client=client),
                   cache_dir=tmp_path / "cache")
    assert again.shards == remote.shards
    equal(batches(fl.Loader(again, batch_size=16, device="cpu")), batches(fl.Loader(here, batch_size=16, device="cpu")))


def test_a_small_cache_resume_faults_and_a_pickle(shards, s3_server, s3_proxy, tmp_path):
    bucket, _ = upload(s3_server[0], shards)
    urls = [f"s3://{bucket}/shards/train-{s:06d}.tar" for s in range(4)]
    limit = max(os.path.getsize(shards / f"train-{s:06d}.tar") for s in range(4)) * 2 + 1
    remote = fl.Tar(urls, fields=FIELDS, storage_options=opts(s3_proxy.url), cache_dir=tmp_path / "cache",
                    cache_limit=limit)
    here = fl.Tar([str(shards / f"train-{s:06d}.tar") for s in range(4)], fields=FIELDS)
    s3_proxy.arm("503", match=".tar", times=2)
    # In tar order a step reads at most two shards: the cache holds two of the four.
    kw = dict(batch_size=8, shuffle=False, num_threads=2, device="cpu")
    equal(batches(fl.Loader(remote, **kw)), batches(fl.Loader(here, **kw)))
    stats = remote.storage_stats()
    assert stats.cached_bytes <= limit and stats.evictions > 0
    with fl.Loader(remote, **kw) as first:
        it = iter(first)
        for _ in range(5):
            next(it)
        state = first.state_dict()
        del it
    resumed, reference = fl.Loader(remote, **kw), fl.Loader(here, **kw)
    resumed.load_state_dict(state)
    reference.load_state_dict(state)
    equal(batches(resumed), batches(reference))
    back = pickle.loads(pickle.dumps(remote))
    equal(batches(fl.Loader(back, batch_size=32, device="cpu")), batches(fl.Loader(here, batch_size=32, device="cpu")))


def test_an_object_rewritten_after_open_is_refused_naming_it(shards, s3_server, tmp_path):
    bucket, s3 = upload(s3_server[0], shards)
    url = f"s3://{bucket}/shards/train-000001.tar"
    remote = fl.Tar(url, fields=["__key__"], storage_options=opts(s3_server[0]), cache_dir=tmp_path / "c1",
                    cache_limit=10**9)
    other = write_shard(tmp_path / "other.tar", [every_kind_sample(i, prefix="z") for i in range(25)])
    s3.put_object(Bucket=bucket, Key="shards/train-000001.tar", Body=pathlib.Path(other).read_bytes())
    # Its index came from the version pinned at open (fetched then); the cached copy is that
    # version: the batches are the old samples, never the new ones beside an old index.
    keys = [k for b in batches(fl.Loader(remote, batch_size=25, device="cpu")) for k in b["__key__"]]
    assert keys == [f"s{i:05d}" for i in range(40, 65)]
    with pytest.raises(ValueError, match="train-000001.tar changed since this fl.Tar was pickled"):
        pickle.loads(pickle.dumps(remote))
    fresh = fl.Tar(url, fields=["__key__"], storage_options=opts(s3_server[0]), cache_dir=tmp_path / "c2")
    assert [k for b in batches(fl.Loader(fresh, batch_size=25, device="cpu")) for k in b["__key__"]][0] == "z00000"
