"""fl.Tar over shards in object storage (the moto S3 server behind the fault proxy, the GCS
emulator, http(s):// from public S3 objects and from Python's file server): through the storage
seam (FileSet), the same batches as from the local shards, for ranks, partition="shards", a
cache smaller than the data, resume, a pickle; faults retried; an object rewritten after it was
pinned refused, naming it; credentials kept out of pickles."""
from __future__ import annotations

import os
import pathlib
import pickle

import pytest

import fastload as fl
from remote_helpers import resume_equals_local, S3_CLIENTS, FolderServer, batches as _batches, equal as _equal, opts, upload_s3
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
    return upload_s3(endpoint, local, "shards", tag="t")


def batches(loader):
    return _batches(loader)


def equal(a, b):
    _equal(a, b, nonempty=True)


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
    resume_equals_local(remote, here, 5, **kw)
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


def test_batches_from_gs_equal_the_local_shards(shards, gcs_server, gcs_proxy, tmp_path):
    bucket = gcs_server.bucket()
    gcs_server.put_dir(bucket, "shards", shards)
    gcs_proxy.arm("503", match="alt=media", times=2)  # downloads retried
    options = {"endpoint_url": gcs_proxy.url, "anon": True, "backoff": 0.01, "max_backoff": 0.05}
    remote = fl.Tar(f"gs://{bucket}/shards/", fields=FIELDS, storage_options=options, cache_dir=tmp_path / "cache")
    here = fl.Tar(str(shards), fields=FIELDS)
    assert remote.shards == [f"gs://{bucket}/shards/train-{s:06d}.tar" for s in range(4)]
    assert remote.shard_rows == here.shard_rows == [40, 25, 33, 30]
    for rank in range(2):
        kw = dict(batch_size=8, shuffle=True, seed=5, rank=rank, world_size=2, num_threads=2, device="cpu")
        equal(batches(fl.Loader(remote, **kw)), batches(fl.Loader(here, **kw)))
    kw = dict(batch_size=8, shuffle=True, seed=2, order="block", device="cpu")
    equal(batches(fl.Loader(remote, **kw)), batches(fl.Loader(here, **kw)))
    # A brace pattern of gs:// URLs, a cache of two shards: the same batches, with evictions.
    limit = max(os.path.getsize(shards / f"train-{s:06d}.tar") for s in range(4)) * 2 + 1
    small = fl.Tar(f"gs://{bucket}/shards/train-{{000000..000003}}.tar", fields=FIELDS, storage_options=options,
                   cache_dir=tmp_path / "small", cache_limit=limit)
    kw = dict(batch_size=8, shuffle=False, num_threads=2, device="cpu")
    equal(batches(fl.Loader(small, **kw)), batches(fl.Loader(here, **kw)))
    assert small.storage_stats().evictions > 0


def test_batches_from_http_equal_the_local_shards(shards, s3_server, s3_proxy, tmp_path):
    """http(s):// URLs (no listing: a brace pattern or a list): public objects of the S3 server
    (ETags, ranges) through the fault proxy, and Python's own file server (no ETag, no ranges)."""
    here = fl.Tar(str(shards), fields=FIELDS)
    kw = dict(batch_size=8, shuffle=True, seed=3, num_threads=2, device="cpu")
    reference = batches(fl.Loader(here, **kw))
    bucket, s3 = upload(s3_server[0], shards)
    for s in range(4):
        s3.put_object_acl(Bucket=bucket, Key=f"shards/train-{s:06d}.tar", ACL="public-read")
    s3_proxy.arm("503", match=".tar", times=2)
    public = fl.Tar(f"{s3_proxy.url}/{bucket}/shards/train-{{000000..000003}}.tar", fields=FIELDS,
                    storage_options={"backoff": 0.01}, cache_dir=tmp_path / "c1")
    assert public.shards == [f"{s3_proxy.url}/{bucket}/shards/train-{s:06d}.tar" for s in range(4)]
    assert public.shard_rows == here.shard_rows
    equal(batches(fl.Loader(public, **kw)), reference)
    kw2 = dict(batch_size=8, shuffle=True, seed=6, rank=1, world_size=2, partition="shards", device="cpu")
    equal(batches(fl.Loader(public, **kw2)), batches(fl.Loader(here, **kw2)))
    with pytest.raises(ValueError, match="http\\(s\\):// has no listing"):
        fl.Tar(f"{s3_proxy.url}/{bucket}/shards/", storage_options={"backoff": 0.01}, cache_dir=tmp_path / "c0")
    with FolderServer(shards) as server:
        plain = fl.Tar([f"{server.url}/train-{s:06d}.tar" for s in range(4)], fields=FIELDS,
                       storage_options={"backoff": 0.01}, cache_dir=tmp_path / "c2")
        equal(batches(fl.Loader(plain, **kw)), reference)
        back = pickle.loads(pickle.dumps(plain))
        equal(batches(fl.Loader(back, **kw)), reference)


def test_a_pickle_carries_no_credential(shards, s3_server, tmp_path):
    bucket, _ = upload(s3_server[0], shards)
    secret = "SECRETsecretSECRET0123456789"  # the server's test credentials, passed as options too
    remote = fl.Tar(f"s3://{bucket}/shards/", fields=FIELDS, cache_dir=tmp_path / "cache",
                    storage_options=opts(s3_server[0], key="testing-key-id", secret=secret))
    blob = pickle.dumps(remote)
    assert secret.encode() not in blob and b"testing-key-id" not in blob
    assert secret not in repr(remote)
    here = fl.Tar(str(shards), fields=FIELDS)
    kw = dict(batch_size=16, device="cpu")
    equal(batches(fl.Loader(pickle.loads(blob), **kw)), batches(fl.Loader(here, **kw)))  # its own chain's
