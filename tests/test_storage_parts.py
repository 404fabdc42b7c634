"""Large objects fetched as ranged GETs in parallel (fastload/_storage/parts.py), against the
real servers of the storage tests (moto's S3 server, the GCS emulator) and the fault proxy: the
batches equal those read locally, the parts of one object are in flight at once, and a part
that fails, a body the checksum refuses, or an object whose size changed is fetched again or
reported by URL, never cached with a hole or the wrong bytes."""
from __future__ import annotations

import io
import os
import uuid

import numpy as np
import pytest

import fastload as fl
from remote_helpers import S3_CLIENTS, batches, equal, opts, upload_dir

boto3 = pytest.importorskip("boto3")

PART = 16 << 10  # 16 KiB parts: each shard's x file (64 KiB and a header) is 5 parts, its y file (8 KiB) one GET


def _client(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


@pytest.fixture
def remote_parted(s3_server, tmp_path):
    """8 shards of 1024 rows of 16 float32s (x: 64 KiB a shard), written locally and uploaded."""
    endpoint = s3_server[0]
    n = 8 * 1024
    cols = {"x": np.random.default_rng(3).standard_normal((n, 16)).astype(np.float32), "y": np.arange(n)}
    local = tmp_path / "ds"
    fl.write_dataset(local, cols, rows_per_shard=1024, fsync=False)
    bucket = f"p-{uuid.uuid4().hex[:12]}"
    _client(endpoint).create_bucket(Bucket=bucket)
    upload_dir(_client(endpoint), bucket, "ds", local)
    return f"s3://{bucket}/ds", str(local), bucket


def _x_paths(proxy) -> list[str]:
    return [p for p in proxy.gets if "/x/" in p]


@pytest.mark.parametrize("client", S3_CLIENTS)
@pytest.mark.parametrize("order", ["random", "block"])
def test_large_objects_come_in_parts_at_once_and_batches_equal_local(remote_parted, s3_proxy, tmp_path, client,
                                                                     order):
    url, local, _ = remote_parted
    s3_proxy.arm("delay", match="/x/", times=1000, delay=0.1)  # parts of one file overlap
    ds = fl.Dataset.open(url, storage_options=opts(s3_proxy.url, client=client, part_size=PART, max_concurrency=8),
                         cache_dir=tmp_path / "cache")
    kw = dict(batch_size=500, shuffle=True, seed=4, num_threads=2, order=order)
    equal(batches(fl.Loader(ds, **kw)), batches(fl.Loader(fl.Dataset.open(local), **kw)))
    from fastload._storage.parts import part_count

    x_files = _x_paths(s3_proxy)
    parts = part_count(os.path.getsize(os.path.join(local, "x", "000000.npy")), PART)
    assert len(x_files) == 8 and parts == 5  # 64 KiB and the .npy header
    assert all(s3_proxy.gets[p] == parts for p in x_files)  # in ranged parts, each fetched once
    assert s3_proxy.ranged.total() == 8 * parts
    assert 4 <= s3_proxy.peak_in_flight <= 8 + 2  # parts at once; max_concurrency (+ a demand fetch per thread)
    assert ds.storage_stats().bytes_fetched == sum(
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(local) for f in fs if f.endswith(".npy"))


@pytest.mark.parametrize("client", S3_CLIENTS)
@pytest.mark.parametrize("kind", ["reset", "503", "truncate", "corrupt"])
def test_a_failed_part_is_fetched_again(remote_parted, s3_proxy, tmp_path, client, kind):
    url, local, _ = remote_parted
    s3_proxy.arm(kind, match="/x/", times=3)
    ds = fl.Dataset.open(url, storage_options=opts(s3_proxy.url, client=client, part_size=PART, read_timeout=5),
                         cache_dir=tmp_path / "cache")
    kw = dict(batch_size=500, shuffle=True, seed=5, num_threads=2)
    equal(batches(fl.Loader(ds, **kw)), batches(fl.Loader(fl.Dataset.open(local), **kw)))
    assert s3_proxy.faults[0].times == 0  # every fault was met and got past


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_parts_the_checksum_refuses_every_time_are_reported_and_never_cached(remote_parted, s3_proxy, tmp_path,
                                                                            client):
    url, _, _ = remote_parted
    s3_proxy.arm("corrupt", match="/x/", times=10_000)
    ds = fl.Dataset.open(url, storage_options=opts(s3_proxy.url, client=client, part_size=PART, max_attempts=2),
                         cache_dir=tmp_path / "cache")
    with pytest.raises(RuntimeError, match=r"GET s3://.*/x/\d+\.npy failed after 2 attempts; last: "
                                           r"(corrupt body|truncated body|FlexibleChecksumError)"):
        batches(fl.Loader(ds, batch_size=1024, num_threads=1))
    assert not [f for d, _, fs in os.walk(ds.cache_dir) for f in fs if f.endswith(".npy") and "/x" in d]


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_an_object_whose_size_changed_is_an_error_naming_it(remote_parted, s3_server, tmp_path, client):
    """Parts read [0, size) of the size listed; the object's size in each answer is checked, so an
    object rewritten longer is refused, not cut to the listed size. A dataset's parts carry the
    version listed at open, which refuses the rewrite first; a GET without a version (the client
    alone) is refused by the size."""
    from fastload._storage.choose_client import make_client
    from fastload._storage.urls import parse_url

    url, local, bucket = remote_parted
    options = opts(s3_server[0], client=client, part_size=PART, max_attempts=2)
    ds = fl.Dataset.open(url, storage_options=options, cache_dir=tmp_path / "cache")
    with open(os.path.join(local, "x", "000003.npy"), "rb") as f:
        body = f.read()
    _client(s3_server[0]).put_object(Bucket=bucket, Key="ds/x/000003.npy", Body=body + b"\0" * 100)
    with pytest.raises(RuntimeError, match=r"s3://.*/x/000003\.npy: the object changed since the source was opened"):
        batches(fl.Loader(ds, batch_size=1024, num_threads=1))
    with pytest.raises(OSError, match=r"GET s3://.*/x/000003\.npy failed after 2 attempts; last: the object "
                                      rf"has {len(body) + 100} bytes, not {len(body)}"):
        make_client("s3", options).get(parse_url(url + "/x/000003.npy"), _TempFile(), len(body))


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_client_get_assembles_the_parts_of_an_object(s3_server, client):
    """The client alone: every size around the part boundaries comes back byte for byte, with
    the number of requests part_count says."""
    from fastload._storage.choose_client import make_client
    from fastload._storage.parts import part_count
    from fastload._storage.urls import parse_url

    endpoint = s3_server[0]
    bucket = f"q-{uuid.uuid4().hex[:12]}"
    _client(endpoint).create_bucket(Bucket=bucket)
    c = make_client("s3", opts(endpoint, client=client, part_size=1000))
    rng = np.random.default_rng(0)
    for size in (1, 999, 1999, 2000, 2001, 4999, 5000, 12345):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        _client(endpoint).put_object(Bucket=bucket, Key=f"o{size}", Body=data)
        before = c.requests
        with open(os.devnull, "rb"):
            pass
        out = io.BytesIO() if part_count(size, 1000) == 1 else _TempFile()
        assert c.get(parse_url(f"s3://{bucket}/o{size}", "path"), out, size) == size
        assert out.getvalue() == data, size
        assert c.requests - before == part_count(size, 1000), size


class _TempFile(io.FileIO):
    """A real file (parts write at offsets through its descriptor) read back as a whole."""

    def __init__(self):
        import tempfile

        fd, self._path = tempfile.mkstemp()
        super().__init__(fd, "w+b")

    def getvalue(self) -> bytes:
        with open(self._path, "rb") as f:
            return f.read()

    def __del__(self):
        self.close()
        os.unlink(self._path)


def test_part_size_is_checked_and_zero_fetches_objects_whole(remote_parted, s3_proxy, tmp_path):
    url, local, _ = remote_parted
    with pytest.raises(ValueError, match=r"storage_options\['part_size'\] must be a size such as '50GB'"):
        fl.Dataset.open(url, storage_options=opts(s3_proxy.url, part_size="lots"), cache_dir=tmp_path / "c1")
    with pytest.raises(ValueError, match=r"storage_options\['part_size'\] must be positive, got -1"):
        fl.Dataset.open(url, storage_options=opts(s3_proxy.url, part_size=-1), cache_dir=tmp_path / "c1")
    ds = fl.Dataset.open(url, storage_options=opts(s3_proxy.url, part_size=0), cache_dir=tmp_path / "c2")
    kw = dict(batch_size=500, shuffle=True, seed=4, num_threads=2)
    equal(batches(fl.Loader(ds, **kw)), batches(fl.Loader(fl.Dataset.open(local), **kw)))
    assert s3_proxy.ranged.total() == 0 and all(n == 1 for n in s3_proxy.gets.values())


def test_gs_and_http_objects_come_in_parts_too(remote_parted, s3_server, s3_proxy, gcs_server, gcs_proxy, tmp_path):
    """gs:// and http(s):// (parts only when part_size is given) read the same batches as the
    local directory, in ranged parts."""
    url, local, bucket = remote_parted
    kw = dict(batch_size=500, shuffle=True, seed=8, num_threads=2)
    reference = batches(fl.Loader(fl.Dataset.open(local), **kw))
    gbucket = gcs_server.bucket()
    gcs_server.put_dir(gbucket, "ds", local)
    gs = fl.Dataset.open(f"gs://{gbucket}/ds", storage_options=opts(gcs_proxy.url, anon=True, part_size=PART),
                         cache_dir=tmp_path / "gs")
    equal(batches(fl.Loader(gs, **kw)), reference)
    assert gcs_proxy.ranged.total() == 8 * 5
    c = _client(s3_server[0])
    for o in c.list_objects_v2(Bucket=bucket, Prefix="ds")["Contents"]:  # readable without credentials
        c.put_object_acl(Bucket=bucket, Key=o["Key"], ACL="public-read")
    http_url = f"{s3_proxy.url}/{bucket}/ds"
    whole = fl.Dataset.open(http_url, storage_options={"backoff": 0.01}, cache_dir=tmp_path / "h1")
    equal(batches(fl.Loader(whole, **kw)), reference)
    assert s3_proxy.ranged.total() == 0
    parted = fl.Dataset.open(http_url, storage_options={"backoff": 0.01, "part_size": PART}, cache_dir=tmp_path / "h2")
    equal(batches(fl.Loader(parted, **kw)), reference)
    assert s3_proxy.ranged.total() == 8 * 5


def test_parts_of_token_files_and_of_parquet_files(s3_server, s3_proxy, tmp_path):
    """Token files (Windows) and Parquet files in parts: the same samples as the local files; a
    Parquet file rewritten after the open is refused by every part (each carries the version)."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    endpoint = s3_server[0]
    bucket = f"t-{uuid.uuid4().hex[:12]}"
    s3 = _client(endpoint)
    s3.create_bucket(Bucket=bucket)
    rng = np.random.default_rng(9)
    paths = []
    for k, n in enumerate([30_000, 10_001, 44_444]):  # 60, 20 and 89 KB: 4, 2 and 6 parts
        p = tmp_path / f"tok{k}.bin"
        rng.integers(0, 50_000, n, dtype=np.uint16).tofile(p)
        paths.append(str(p))
        s3.put_object(Bucket=bucket, Key=f"tokens/part-{k}.bin", Body=p.read_bytes())
    here = fl.Windows.from_files(paths, dtype=np.uint16, length=129, stride=128)
    there = fl.Windows.from_files(f"s3://{bucket}/tokens/", dtype=np.uint16, length=129, stride=128,
                                  storage_options=opts(s3_proxy.url, part_size=PART), cache_dir=tmp_path / "tok")
    kw = dict(batch_size=16, shuffle=True, seed=2, num_threads=2)
    equal(batches(fl.Loader(there, **kw)), batches(fl.Loader(here, **kw)))
    assert s3_proxy.ranged.total() == 3 + 1 + 6  # 10,001 tokens: under two parts, one GET; 44,444: 6 parts

    table = pa.table({"id": np.arange(20_000), "f": rng.standard_normal(20_000)})
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=2_000)
    s3.put_object(Bucket=bucket, Key="pq/a.parquet", Body=(tmp_path / "a.parquet").read_bytes())
    remote = fl.Parquet(f"s3://{bucket}/pq/", ["id", "f"], storage_options=opts(s3_proxy.url, part_size=PART),
                        cache_dir=tmp_path / "pq")
    local = fl.Parquet([str(tmp_path / "a.parquet")], ["id", "f"])
    kw = dict(batch_size=1000, shuffle=True, seed=3, num_threads=2, device="cpu")
    s3_proxy.reset_counts()
    equal(batches(fl.Loader(remote, **kw)), batches(fl.Loader(local, **kw)))
    assert s3_proxy.ranged.total() > 2
    stale = fl.Parquet(f"s3://{bucket}/pq/", ["id"], storage_options=opts(endpoint, part_size=PART),
                       cache_dir=tmp_path / "pq2")
    pq.write_table(table.slice(0, 19_000), tmp_path / "b.parquet", row_group_size=2_000)
    s3.put_object(Bucket=bucket, Key="pq/a.parquet", Body=(tmp_path / "b.parquet").read_bytes())
    with pytest.raises(Exception, match=r"a.parquet: the object changed since the source was opened"):
        batches(fl.Loader(stale, batch_size=100, device="cpu"))


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_objects_are_split_by_default_only_where_whole_ones_leave_requests_unused(tmp_path, client):
    """Without part_size, a fetcher over obstore splits objects of 2 default parts or more only when
    the bytes it may have in flight hold fewer whole objects than max_concurrency (a small cache
    of large shards; boto3 splits only when asked); part_size given splits always, part_size=0
    never; requests are counted per part."""
    from fastload._storage.cache import Entry, ObjectCache
    from fastload._storage.choose_client import make_client
    from fastload._storage.fetcher import Fetcher
    from fastload._storage.urls import Url

    mib = 1 << 20
    sizes = [40 * mib, 8 * mib, 64 * mib + 1]
    entries = [Entry(Url("s3", "b", f"k{i}"), f"f{i}", n) for i, n in enumerate(sizes)]

    def fetcher(limit, **options):
        c = make_client("s3", opts("http://127.0.0.1:1", client=client, **options))
        return Fetcher(c, ObjectCache(str(tmp_path / "c")), entries, [[0], [1], [2]], limit)

    small = fetcher(400 * mib)  # 100 MiB in flight: one whole 64 MiB object at a time
    if client == "boto3":  # parts only when asked (its bodies go through Python)
        assert not small._in_parts and small._requests_of.tolist() == [1, 1, 1]
        assert fetcher(400 * mib, part_size="16MiB")._requests_of.tolist() == [3, 1, 5]
        return
    assert small._in_parts and small._requests_of.tolist() == [3, 1, 5]
    large = fetcher(100 << 30)  # 1 GiB in flight: 15 whole objects of 64 MiB, under 16 requests
    assert large._in_parts and large._requests_of.tolist() == [3, 1, 5]
    wide = fetcher(100 << 30, max_concurrency=8)  # 15 whole objects fill 8 requests
    assert not wide._in_parts and wide._requests_of.tolist() == [1, 1, 1]
    never = fetcher(400 * mib, part_size=0)
    assert not never._in_parts and never._requests_of.tolist() == [1, 1, 1]
    always = fetcher(100 << 30, max_concurrency=8, part_size="4MiB")
    assert always._in_parts and always._requests_of.tolist() == [8, 2, 8]  # at most max_concurrency at once


@pytest.mark.parametrize("threads", [1, 3])
def test_parts_keep_ranks_and_resume_exact(remote_parted, s3_server, tmp_path, threads):
    """Parts are below the order: with a cache of 5 of the 8 shards (evictions, prefetch in parts), every
    rank of 2 and a run resumed mid-epoch read the batches of the local directory."""
    url, local, _ = remote_parted
    shard = sum(os.path.getsize(os.path.join(local, c, "000000.npy")) for c in ("x", "y"))
    here = fl.Dataset.open(local)

    def remote(name):
        return fl.Dataset.open(url, storage_options=opts(s3_server[0], part_size=PART), cache_dir=tmp_path / name,
                               cache_limit=5 * shard)

    for rank in range(2):
        kw = dict(batch_size=256, shuffle=True, seed=rank, rank=rank, world_size=2, num_threads=threads, order="block")
        equal(batches(fl.Loader(remote(f"r{rank}"), **kw)), batches(fl.Loader(here, **kw)))
    kw = dict(batch_size=256, shuffle=True, seed=9, num_threads=threads, order="block")
    first = fl.Loader(remote("resume"), **kw)
    it = iter(first)
    for _ in range(11):
        next(it)
    state = first.state_dict()
    del it
    first.close()
    resumed, reference = fl.Loader(remote("resume"), **kw), fl.Loader(here, **kw)
    resumed.load_state_dict(state)
    reference.load_state_dict(state)
    equal(batches(resumed), batches(reference))
