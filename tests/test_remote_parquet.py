"""fl.Parquet over URLs, against the real S3 server of the tests (moto on 127.0.0.1) behind the
counting proxy of tests/s3_proxy.py, and against the GCS emulator: batches equal those of
fl.Parquet over the same local files (block and random orders, threads, ranks, resume); opening
reads the listing and one ranged GET of each file's end, no file; files are fetched whole into
the bounded cache along the plan, pinned to the ETag listed at open."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

import fastload as fl
from remote_helpers import (resume_equals_local, S3_CLIENTS, FolderServer, batches as _batches, equal as _equal, new_bucket, opts as _opts,
                            upload_s3)

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
boto3 = pytest.importorskip("boto3")

COLUMNS = ["id", "f", "vec", "tokens"]
LENGTHS = {"tokens": 6}


def _table(rows: int, seed: int, start: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    lens = rng.integers(0, 9, rows)
    return pa.table({
        "id": pa.array(np.arange(start, start + rows), pa.int64()),
        "f": pa.array(rng.standard_normal(rows).astype(np.float32)),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(3 * rows).astype(np.float32)), 3),
        "tokens": pa.array([list(range(k)) for k in lens], pa.list_(pa.int32())),
        "pad": pa.array(rng.integers(0, 1 << 62, rows)),  # not read: makes each file larger than the footer read
    })


@pytest.fixture
def parquet_dir(tmp_path):
    """4 files of 5-7 row groups of 1000 rows (about 200 KB each, footers of a few KB), plus the
    _SUCCESS and .crc files writers leave."""
    d = tmp_path / "pq"
    d.mkdir()
    start = 0
    for k, rows in enumerate([5000, 4300, 6100, 5555]):
        pq.write_table(_table(rows, k, start), d / f"part-{k:05d}.parquet", row_group_size=1000)
        start += rows
    (d / "_SUCCESS").write_bytes(b"")
    (d / ".part-00000.parquet.crc").write_bytes(b"junk")
    return d


def _upload_s3(endpoint, local, prefix="pq"):
    return upload_s3(endpoint, local, prefix, tag="p")


def _files(local):
    return sorted(str(local / n) for n in os.listdir(local) if n.endswith(".parquet") and not n.startswith("."))


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_open_reads_footers_only_and_batches_equal_local(parquet_dir, s3_server, s3_proxy, tmp_path, client):
    bucket, _ = _upload_s3(s3_server[0], parquet_dir)
    url = f"s3://{bucket}/pq/"
    remote = fl.Parquet(url, COLUMNS, max_length=LENGTHS, storage_options=_opts(s3_proxy.url, client=client),
                        cache_dir=tmp_path / "cache")
    here = fl.Parquet(_files(parquet_dir), COLUMNS, max_length=LENGTHS)
    # Open: one ranged GET of each file's end (the footer), nothing of _SUCCESS or the .crc file.
    parts = [f"/{bucket}/pq/part-{k:05d}.parquet" for k in range(4)]
    assert dict(s3_proxy.gets) == {p: 1 for p in parts} and dict(s3_proxy.ranged) == {p: 1 for p in parts}
    assert remote.storage_stats().bytes_fetched == 0 and not os.listdir(remote.cache_dir)
    assert remote.files == [f"s3://{bucket}/pq/part-{k:05d}.parquet" for k in range(4)]
    assert len(remote) == len(here) and remote.shard_rows == here.shard_rows and remote.names == here.names
    s3_proxy.reset_counts()
    for order in ("block", "random"):
        for epoch in (0, 1):
            kw = dict(batch_size=64, shuffle=True, seed=4, order=order, num_threads=2, with_index=True, device="cpu")
            _equal(_batches(fl.Loader(remote, **kw), epoch), _batches(fl.Loader(here, **kw), epoch))
    # Whole files, each fetched once (the cache holds them all), none by range after the open.
    assert dict(s3_proxy.gets) == {p: 1 for p in parts} and not s3_proxy.ranged
    sizes = [os.path.getsize(f) for f in _files(parquet_dir)]
    stats = remote.storage_stats()
    assert stats.bytes_fetched == sum(sizes) and stats.prefetched > 0  # fetched ahead along the plan


def test_a_footer_longer_than_the_first_read(s3_server, s3_proxy, tmp_path):
    local = tmp_path / "big"
    local.mkdir()
    pq.write_table(_table(6000, 1, 0), local / "many-groups.parquet", row_group_size=20)  # 300 row groups
    footer = int.from_bytes((local / "many-groups.parquet").read_bytes()[-8:-4], "little")
    assert footer > 64 << 10
    bucket, _ = _upload_s3(s3_server[0], local)
    remote = fl.Parquet(f"s3://{bucket}/pq/", COLUMNS, max_length=LENGTHS, storage_options=_opts(s3_proxy.url),
                        cache_dir=tmp_path / "cache")
    assert sum(s3_proxy.ranged.values()) == sum(s3_proxy.gets.values()) == 2  # the end, then the rest of the footer
    here = fl.Parquet(str(local), COLUMNS, max_length=LENGTHS)
    assert remote.shard_rows == here.shard_rows
    kw = dict(batch_size=128, shuffle=True, seed=3, num_threads=2, device="cpu")
    _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(here, **kw)))


def test_ranks_resume_and_a_small_cache(parquet_dir, s3_server, s3_proxy, tmp_path):
    bucket, _ = _upload_s3(s3_server[0], parquet_dir)
    urls = [f"s3://{bucket}/pq/part-{k:05d}.parquet" for k in range(4)]  # a list of URLs
    sizes = [os.path.getsize(f) for f in _files(parquet_dir)]
    limit = max(sizes) * 2 + 1  # two of the four files
    remote = fl.Parquet(urls, COLUMNS, max_length=LENGTHS, storage_options=_opts(s3_proxy.url),
                        cache_dir=tmp_path / "cache", cache_limit=limit)
    here = fl.Parquet(_files(parquet_dir), COLUMNS, max_length=LENGTHS)
    for rank in range(3):
        kw = dict(batch_size=50, shuffle=True, seed=5, rank=rank, world_size=3, num_threads=2, device="cpu")
        _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(here, **kw)))
    for rank in range(2):
        kw = dict(batch_size=50, shuffle=True, seed=6, rank=rank, world_size=2, partition="shards", device="cpu")
        _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(here, **kw)))
    stats = remote.storage_stats()
    assert stats.cached_bytes <= limit and stats.evictions > 0
    kw = dict(batch_size=64, shuffle=True, seed=9, num_threads=2, order="block", device="cpu")
    resume_equals_local(remote, here, 30, **kw)
    # A pickle travels by URL (no credentials) and reads the same cache.
    back = pickle.loads(pickle.dumps(remote))
    _equal(_batches(fl.Loader(back, batch_size=100, device="cpu")), _batches(fl.Loader(here, batch_size=100, device="cpu")))


def test_prefetch_fetches_the_files_of_the_plans_row_groups_in_order(parquet_dir, s3_server, s3_proxy, tmp_path):
    """The plan speaks row groups (5-7 a file here), the fetcher files: with the consumer standing
    still after its first batch, every file is still prefetched, once, in the order the plan first
    reads one of its row groups (from the batches of the same loader over the local files)."""
    import time

    bucket, _ = _upload_s3(s3_server[0], parquet_dir)
    here = fl.Parquet(_files(parquet_dir), COLUMNS, max_length=LENGTHS)
    remote = fl.Parquet(f"s3://{bucket}/pq/", COLUMNS, max_length=LENGTHS,
                        storage_options=_opts(s3_proxy.url, max_concurrency=1), cache_dir=tmp_path / "cache")
    s3_proxy.reset_counts()
    s3_proxy.arm("delay", match=".parquet", times=1000, delay=0.05)
    kw = dict(batch_size=500, shuffle=True, seed=4, order="block", num_threads=1, prefetch=1, with_index=True,
              device="cpu")
    with fl.Loader(remote, **kw) as loader:
        it = iter(loader)
        next(it)  # then stand still
        deadline = time.monotonic() + 20
        while len(s3_proxy.gets) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(s3_proxy.gets) == [f"/{bucket}/pq/part-{k:05d}.parquet" for k in range(4)]
        assert max(s3_proxy.gets.values()) == 1
        ends = np.cumsum([5000, 4300, 6100, 5555])  # rows of the fixture's files
        first: dict[int, int] = {}
        for step, b in enumerate(_batches(fl.Loader(here, **kw))):
            for f in np.searchsorted(ends, b["index"].numpy(), side="right"):
                first.setdefault(int(f), step)
        fetched = [int(p[-13:-8]) for p in s3_proxy.log]
        steps = [first[f] for f in fetched]
        # In plan order, but for the two requests that may be in flight at once (the prefetcher's,
        # and the one a collation thread makes for its batch).
        assert all(steps[i] <= steps[j] for i in range(len(steps)) for j in range(i + 2, len(steps))), (fetched, first)
        del it


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_rewritten_object_is_refused_not_read(parquet_dir, s3_server, tmp_path, client):
    bucket, s3 = _upload_s3(s3_server[0], parquet_dir)
    remote = fl.Parquet(f"s3://{bucket}/pq/", ["id"], storage_options=_opts(s3_server[0], client=client),
                        cache_dir=tmp_path / "cache")
    loader = fl.Loader(remote, batch_size=100, device="cpu")
    pq.write_table(_table(5000, 99, 0), tmp_path / "new.parquet", row_group_size=1000)
    s3.put_object(Bucket=bucket, Key="pq/part-00002.parquet", Body=(tmp_path / "new.parquet").read_bytes())
    with pytest.raises(Exception, match=r"part-00002.parquet: the object changed since the source was opened"):
        _batches(loader)
    # A new open lists the new version, and reads it.
    fresh = fl.Parquet(f"s3://{bucket}/pq/", ["id"], storage_options=_opts(s3_server[0], client=client),
                       cache_dir=tmp_path / "cache")
    ids = np.concatenate([b["id"].numpy() for b in _batches(fl.Loader(fresh, batch_size=1000, device="cpu"))])
    assert len(ids) == 5000 + 4300 + 5000 + 5555


def test_corrupt_and_truncated_downloads_are_fetched_again(parquet_dir, s3_server, s3_proxy, tmp_path):
    bucket, _ = _upload_s3(s3_server[0], parquet_dir)
    remote = fl.Parquet(f"s3://{bucket}/pq/", COLUMNS, max_length=LENGTHS, storage_options=_opts(s3_proxy.url),
                        cache_dir=tmp_path / "cache")
    here = fl.Parquet(_files(parquet_dir), COLUMNS, max_length=LENGTHS)
    s3_proxy.arm("corrupt", match="part-00001", times=2)  # the last byte flipped: the footer check refuses it
    s3_proxy.arm("truncate", match="part-00003", times=2)
    kw = dict(batch_size=64, shuffle=True, seed=1, num_threads=2, device="cpu")
    _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(here, **kw)))
    assert all(f.times == 0 for f in s3_proxy.faults)


def test_bad_objects_name_their_url(s3_server, tmp_path):
    bucket, s3 = new_bucket(s3_server[0], tag="p")
    s3.put_object(Bucket=bucket, Key="x/a.parquet", Body=b"not a parquet file at all")
    with pytest.raises(ValueError, match=rf"s3://{bucket}/x/a.parquet is not a Parquet file"):
        fl.Parquet(f"s3://{bucket}/x/", storage_options=_opts(s3_server[0]), cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"s3://{bucket}/y/: no objects"):
        fl.Parquet(f"s3://{bucket}/y/", storage_options=_opts(s3_server[0]), cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"s3://{bucket}/x/b.parquet"):
        fl.Parquet([f"s3://{bucket}/x/b.parquet"], storage_options=_opts(s3_server[0]), cache_dir=tmp_path)


def test_gs_parquet_equals_local(parquet_dir, gcs_server, tmp_path):
    bucket = gcs_server.bucket()
    for name in sorted(os.listdir(parquet_dir)):
        data = (parquet_dir / name).read_bytes()
        if data:  # the emulator refuses an empty upload (_SUCCESS)
            gcs_server.put(bucket, f"pq/{name}", data)
    remote = fl.Parquet(f"gs://{bucket}/pq/", COLUMNS, max_length=LENGTHS,
                        storage_options={"endpoint_url": gcs_server.url, "anon": True}, cache_dir=tmp_path / "cache")
    here = fl.Parquet(_files(parquet_dir), COLUMNS, max_length=LENGTHS)
    kw = dict(batch_size=64, shuffle=True, seed=2, num_threads=2, device="cpu")
    _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(here, **kw)))


def test_http_urls_public_objects_and_a_plain_file_server(parquet_dir, s3_server, s3_proxy, tmp_path):
    """http(s):// URLs: public objects of the S3 server (ETags, ranges), and Python's own file
    server (no ETag, no ranges: the footer read takes the whole file, the version is its
    Last-Modified)."""
    here = fl.Parquet(_files(parquet_dir), COLUMNS, max_length=LENGTHS)
    kw = dict(batch_size=64, shuffle=True, seed=7, num_threads=2, device="cpu")
    reference = _batches(fl.Loader(here, **kw))
    bucket, s3 = _upload_s3(s3_server[0], parquet_dir)
    names = [os.path.basename(f) for f in _files(parquet_dir)]
    for n in names:
        s3.put_object_acl(Bucket=bucket, Key=f"pq/{n}", ACL="public-read")
    public = fl.Parquet([f"{s3_proxy.url}/{bucket}/pq/{n}" for n in names], COLUMNS, max_length=LENGTHS,
                        storage_options={"backoff": 0.01}, cache_dir=tmp_path / "c1")
    assert sum(s3_proxy.ranged.values()) == len(names)
    _equal(_batches(fl.Loader(public, **kw)), reference)

    with FolderServer(parquet_dir) as server:
        plain = fl.Parquet([f"{server.url}/{n}" for n in names], COLUMNS, max_length=LENGTHS,
                           storage_options={"backoff": 0.01}, cache_dir=tmp_path / "c2")
        _equal(_batches(fl.Loader(plain, **kw)), reference)


def test_a_pickled_prefix_is_listed_again_and_refuses_objects_added_since(parquet_dir, s3_server, tmp_path):
    bucket, s3 = _upload_s3(s3_server[0], parquet_dir)
    remote = fl.Parquet(f"s3://{bucket}/pq", ["id"], storage_options=_opts(s3_server[0]), cache_dir=tmp_path / "c")
    data = pickle.dumps(remote)
    assert pickle.loads(data).files == remote.files
    s3.put_object(Bucket=bucket, Key="pq/part-00009.parquet", Body=(parquet_dir / "part-00000.parquet").read_bytes())
    with pytest.raises(ValueError, match=r"changed since this source was pickled \(objects rewritten, added or removed"):
        pickle.loads(data)


@pytest.mark.parametrize("kind", ["local", "s3", "http"])
def test_without_pyarrow_every_parquet_source_names_the_pip_command(parquet_dir, s3_server, s3_proxy, tmp_path,
                                                                   monkeypatch, kind):
    """pyarrow missing (its modules hidden: an import of them raises ImportError): local and remote
    Parquet say how to install it, before any request; never "not a readable Parquet file"."""
    bucket, s3 = _upload_s3(s3_server[0], parquet_dir)
    s3.put_object_acl(Bucket=bucket, Key="pq/part-00000.parquet", ACL="public-read")
    path = {"local": str(parquet_dir), "s3": f"s3://{bucket}/pq/",
            "http": [f"{s3_proxy.url}/{bucket}/pq/part-00000.parquet"]}[kind]
    kw = {} if kind == "local" else {"storage_options": _opts(s3_proxy.url) if kind == "s3" else {"backoff": 0.01},
                                     "cache_dir": tmp_path / "cache"}
    s3_proxy.reset_counts()
    for module in ("pyarrow", "pyarrow.parquet", "pyarrow.dataset"):
        monkeypatch.setitem(__import__("sys").modules, module, None)
    with pytest.raises(ImportError, match=r"pip install 'fastload\[arrow\]'"):
        fl.Parquet(path, **kw)
    assert not s3_proxy.log  # no listing, no footer read
