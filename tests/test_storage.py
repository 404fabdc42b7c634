"""Object storage under the file-backed sources (fastload._storage), against a real S3 server
(moto's server mode on 127.0.0.1) and the fault-injecting proxy of tests/s3_proxy.py: batches
read from s3:// equal those of the same dataset read locally, the cache is bounded and verified,
epoch 2 over a cached dataset sends no GET, faults are retried and reported by URL."""
from __future__ import annotations

import logging
import os
import pickle
import subprocess
import sys
import uuid

import numpy as np
import pytest

import fastload as fl
from remote_helpers import S3_CLIENTS, has, small_dataset, upload_dir

boto3 = pytest.importorskip("boto3")


CLIENTS = S3_CLIENTS  # every S3 client installed


# ------------------------------------------------------------------------------------ helpers
def _client(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _bucket(endpoint) -> str:
    name = f"b-{uuid.uuid4().hex[:12]}"
    _client(endpoint).create_bucket(Bucket=name)
    return name


def _upload_dir(endpoint, bucket, prefix, local):
    upload_dir(_client(endpoint), bucket, prefix, local)


@pytest.fixture
def remote_dir(s3_server, tmp_path):
    """A dataset directory of 8 shards written locally and uploaded: (url, local path, columns)."""
    endpoint = s3_server[0]
    local = tmp_path / "ds"
    cols = small_dataset(local, width=16, seed=7)
    bucket = _bucket(endpoint)
    _upload_dir(endpoint, bucket, "data/ds", local)
    return f"s3://{bucket}/data/ds", str(local), cols


@pytest.fixture
def remote_blocks(s3_server, tmp_path):
    """8 shards of 4096 rows: large enough that order="block" reads a window of 4 shards at a time
    (smaller shards are grouped until a window holds 4096 samples). (url, local, bytes of a shard)."""
    endpoint = s3_server[0]
    n = 8 * 4096
    cols = {"x": np.random.default_rng(8).standard_normal((n, 4)).astype(np.float32), "y": np.arange(n)}
    local = tmp_path / "blocks"
    fl.write_dataset(local, cols, rows_per_shard=4096, fsync=False)
    bucket = _bucket(endpoint)
    _upload_dir(endpoint, bucket, "blocks", local)
    shard = os.path.getsize(local / "x" / "000000.npy") + os.path.getsize(local / "y" / "000000.npy")
    return f"s3://{bucket}/blocks", str(local), shard


def _opts(endpoint, **more):
    return {"endpoint_url": endpoint, "backoff": 0.01, "max_backoff": 0.05, **more}


def _batches(loader, epoch=None):
    if epoch is not None:
        loader.set_epoch(epoch)
    return [{k: v.clone() for k, v in b.items()} for b in loader]


def _equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and bool((x[k] == y[k]).all()), k


# ------------------------------------------------------------------------------------ urls and options
def test_url_parsing_refuses_what_it_cannot_read():
    from fastload._storage.urls import is_url, parse_url

    assert is_url("s3://b/k") and is_url("https://h/x") and not is_url("/tmp/x") and not is_url("rel/path")
    assert str(parse_url("s3://bucket/a/b")) == "s3://bucket/a/b"
    assert parse_url("https://host:8080/a/b").child("c.npy").key == "a/b/c.npy"
    with pytest.raises(ValueError, match="az:// is not supported yet"):
        parse_url("az://bucket/x")
    with pytest.raises(ValueError, match="unknown URL scheme 'ftp'"):
        parse_url("ftp://h/x")
    with pytest.raises(ValueError, match="user name or password"):
        parse_url("https://user:hunter2@h/x")
    with pytest.raises(ValueError, match="needs a bucket"):
        parse_url("s3:///x")


def test_cache_limit_sizes():
    from fastload._storage.cache import parse_size

    assert parse_size("50GB") == 50 * 10**9 and parse_size("512MiB") == 512 << 20 and parse_size(1234) == 1234
    for bad in ("lots", "-5GB", 0, "0"):
        with pytest.raises(ValueError, match="cache_limit"):
            parse_size(bad)
    with pytest.raises(TypeError, match="cache_limit"):
        parse_size(True)


def test_local_path_refuses_storage_arguments(tmp_path):
    fl.write_dataset(tmp_path / "d", {"x": np.arange(10)}, fsync=False)
    with pytest.raises(ValueError, match="are for URLs"):
        fl.Dataset.open(tmp_path / "d", cache_limit="1GB")


# ------------------------------------------------------------------------------------ dataset directories
@pytest.mark.parametrize("client", ["boto3", "obstore"])
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("order", ["random", "block"])
def test_remote_dataset_batches_equal_local(remote_dir, s3_server, tmp_path, threads, order, client):
    if not has(client):
        pytest.skip(f"{client} is not installed")
    url, local, _ = remote_dir
    remote = fl.Dataset.open(url, storage_options=_opts(s3_server[0], client=client), cache_dir=tmp_path / "cache")
    here = fl.Dataset.open(local)
    assert len(remote) == len(here) and remote.names == here.names and remote.shard_rows == here.shard_rows
    for epoch in (0, 1):
        kw = dict(batch_size=64, shuffle=True, seed=3, order=order, num_threads=threads, with_index=True)
        _equal(_batches(fl.Loader(remote, **kw), epoch), _batches(fl.Loader(here, **kw), epoch))


@pytest.mark.parametrize("world", [2, 3])
def test_remote_dataset_ranks_equal_local(remote_dir, s3_server, tmp_path, world):
    url, local, _ = remote_dir
    remote = fl.Dataset.open(url, storage_options=_opts(s3_server[0]), cache_dir=tmp_path / "cache")
    here = fl.Dataset.open(local)
    for rank in range(world):
        kw = dict(batch_size=50, shuffle=True, seed=5, rank=rank, world_size=world, num_threads=2)
        _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(here, **kw)))


def test_remote_dataset_resume_equals_local(remote_blocks, s3_server, tmp_path):
    url, local, shard = remote_blocks
    remote = fl.Dataset.open(url, storage_options=_opts(s3_server[0]), cache_dir=tmp_path / "cache",
                             cache_limit=6 * shard)
    here = fl.Dataset.open(local)
    kw = dict(batch_size=512, shuffle=True, seed=11, num_threads=2, order="block")
    first = fl.Loader(remote, **kw)
    it = iter(first)
    for _ in range(21):
        next(it)
    state = first.state_dict()
    del it
    resumed = fl.Loader(remote, **kw)
    resumed.load_state_dict(state)
    reference = fl.Loader(here, **kw)
    reference.load_state_dict(state)
    _equal(_batches(resumed), _batches(reference))


def test_epoch_two_sends_no_get_when_the_dataset_fits(remote_dir, s3_server, s3_proxy, tmp_path):
    url, local, _ = remote_dir
    ds = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url), cache_dir=tmp_path / "cache")
    loader = fl.Loader(ds, batch_size=100, shuffle=True, seed=1, num_threads=2)
    _batches(loader, 0)
    assert s3_proxy.total_gets() >= 16  # 8 shards x 2 columns, each once
    assert max(c for p, c in s3_proxy.gets.items() if p.endswith(".npy")) == 1  # nothing fetched twice
    s3_proxy.reset_counts()
    _equal(_batches(loader, 1), _batches(fl.Loader(fl.Dataset.open(local), batch_size=100, shuffle=True, seed=1), 1))
    assert s3_proxy.total_gets() == 0
    assert ds._fetcher._seq is None  # every file cached: no window of the plan was even computed
    s = ds.storage_stats()
    assert s.bytes_fetched == sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(local) for f in fs
                                  if f.endswith(".npy"))
    assert s.cached_bytes == s.bytes_fetched and s.evictions == 0 and s.hits > 0
    # A second open of the same dataset (another process, a later run) starts from the cache.
    again = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url), cache_dir=tmp_path / "cache")
    _batches(fl.Loader(again, batch_size=100, num_threads=1))
    assert sum(c for p, c in s3_proxy.gets.items() if p.endswith(".npy")) == 0


def test_small_cache_stays_bounded_and_batches_stay_exact(remote_blocks, s3_server, s3_proxy, tmp_path):
    url, local, shard = remote_blocks
    limit = 6 * shard
    ds = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url), cache_dir=tmp_path / "cache", cache_limit=limit)
    kw = dict(batch_size=512, shuffle=True, seed=2, order="block", num_threads=2)
    for epoch in (0, 1):
        _equal(_batches(fl.Loader(ds, **kw), epoch), _batches(fl.Loader(fl.Dataset.open(local), **kw), epoch))
        s = ds.storage_stats()
        assert s.cached_bytes <= limit
    assert s.evictions > 0
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ds.cache_dir) for f in fs
                  if f.endswith(".npy"))
    assert on_disk <= limit
    # Block order reads a window of shards at a time: with room for 6 shards, each shard is
    # fetched about once per epoch (Belady keeps what the plan reads next).
    assert s.bytes_fetched <= 2 * 1.25 * 8 * shard


def test_a_batch_straddling_two_windows_needs_a_cache_of_one_window(remote_blocks, s3_server, s3_proxy, tmp_path):
    # Windows of 4 shards, batches of 1,000 rows: a batch straddles two windows (8 shards) where a
    # window ends. A cache of 6 shards holds a window and the next one's first shards: the
    # collation threads copy a straddling batch in runs of rows whose files fit the cache, and the
    # fetcher evicts the first window's shards once their reads are done (not the next window's,
    # which would be fetched again). Batches equal a local directory's, the disk stays under the
    # limit, and each shard is fetched about once per epoch. (Refused before: "one step reads 8
    # shards".)
    url, local, shard = remote_blocks
    limit = 6 * shard
    ds = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url), cache_dir=tmp_path / "cache", cache_limit=limit)
    kw = dict(batch_size=1000, shuffle=True, seed=3, order="block", num_threads=2)
    loader = fl.Loader(ds, **kw)
    local_loader = fl.Loader(fl.Dataset.open(local), **kw)
    for epoch in (0, 1):
        _equal(_batches(loader, epoch), _batches(local_loader, epoch))
        assert ds.storage_stats().cached_bytes <= limit
    s = ds.storage_stats()
    # About once per epoch: 8 shards a window, the next epoch's first shards prefetched and
    # sometimes evicted again before the epoch starts (a refetch per step would be 30x this).
    assert s.bytes_fetched <= 2 * 1.5 * 8 * shard, s
    on_disk = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(ds.cache_dir) for f in fs
                  if f.endswith(".npy"))
    assert on_disk <= limit
    # Each of the 2 threads pins at most the files that fit the cache with the other's (the 8
    # x files of 64 KiB and 2 y files of 32 KiB fit): 5; a cache of every file sets no bound.
    assert ds._fetcher._files.pin_bound == 5
    whole = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url), cache_dir=tmp_path / "c3")
    _equal(_batches(fl.Loader(whole, **kw), 0), _batches(local_loader, 0))
    assert whole._fetcher._files.pin_bound == 2**31 - 1
    # In random order a step reads all 8 shards together: the same cache is refused.
    with pytest.raises(ValueError, match=r"one step reads \d+ bytes of shards \(step \d+ reads 8 shards together\)"):
        fl.Loader(ds, batch_size=1000, shuffle=True, seed=3)
    # Too small for each collation thread to read a shard at once: refused, naming both sizes.
    two = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url), cache_dir=tmp_path / "c2",
                          cache_limit=int(1.5 * shard))
    with pytest.raises(ValueError, match=rf"cache_limit is {int(1.5 * shard)} bytes, but 2 collation threads each "
                                         r"read a shard at once \(\d+ bytes for the 2 largest\).*num_threads=1"):
        fl.Loader(two, batch_size=64, order="block", num_threads=2)


def test_the_stall_hint_names_object_storage_when_downloads_are_slow(s3_server, s3_proxy, tmp_path, caplog):
    # 300 shards of 64 rows, each GET delayed, one request at a time: the loop waits for data
    # while the collation threads wait inside the gather for fetches. The hint says so, instead
    # of telling the user to raise num_threads.
    endpoint = s3_server[0]
    local = tmp_path / "many"
    fl.write_dataset(local, {"y": np.arange(300 * 64)}, rows_per_shard=64, fsync=False)
    bucket = _bucket(endpoint)
    _upload_dir(endpoint, bucket, "many", local)
    s3_proxy.arm("delay", match=".npy", times=10_000, delay=0.01)
    ds = fl.Dataset.open(f"s3://{bucket}/many", storage_options=_opts(s3_proxy.url, max_concurrency=1),
                         cache_dir=tmp_path / "cache")
    with caplog.at_level(logging.WARNING, logger="fastload"):
        n = sum(len(b["y"]) for b in fl.Loader(ds, batch_size=64, num_threads=2))
    assert n == 300 * 64
    hints = [r.getMessage() for r in caplog.records if r.name == "fastload"]
    assert len(hints) == 1 and "waited for object storage" in hints[0] and "num_threads" not in hints[0], hints


def test_cache_smaller_than_one_step_is_an_error_naming_both(remote_blocks, s3_server, tmp_path):
    url, _, shard = remote_blocks
    with pytest.raises(ValueError, match=r"smaller than the largest shard .* \(\d+ bytes\)"):
        fl.Dataset.open(url, storage_options=_opts(s3_server[0]), cache_dir=tmp_path / "c1", cache_limit=shard // 2)
    ds = fl.Dataset.open(url, storage_options=_opts(s3_server[0]), cache_dir=tmp_path / "c2",
                         cache_limit=2 * shard)
    with pytest.raises(ValueError, match=rf"cache_limit is {2 * shard} bytes, but one step reads \d+ bytes.*"
                                         r"raise cache_limit to at least \d+ bytes, or use order='block'"):
        fl.Loader(ds, batch_size=512, shuffle=True, seed=0)
    # Already in block order: the only way out named is a larger cache.
    with pytest.raises(ValueError, match=r"raise cache_limit to at least \d+ bytes$"):
        fl.Loader(ds, batch_size=512, shuffle=True, seed=0, order="block")


@pytest.mark.parametrize("client", CLIENTS)
def test_missing_dataset_bucket_and_object_name_the_url(s3_server, tmp_path, remote_dir, client):
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    with pytest.raises(FileNotFoundError, match=rf"s3://{bucket}/nothing/manifest.json"):
        fl.Dataset.open(f"s3://{bucket}/nothing", storage_options=_opts(endpoint, client=client), cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="s3://no-such-bucket-here/x/manifest.json"):
        fl.Dataset.open("s3://no-such-bucket-here/x", storage_options=_opts(endpoint, client=client), cache_dir=tmp_path)
    url, _, _ = remote_dir
    b, _, prefix = url[5:].partition("/")
    keys = [o["Key"] for o in _client(endpoint).list_objects_v2(Bucket=b, Prefix=prefix)["Contents"]]
    victim = sorted(k for k in keys if k.endswith(".npy"))[3]
    _client(endpoint).delete_object(Bucket=b, Key=victim)
    with pytest.raises(FileNotFoundError, match=rf"s3://{b}/{victim}: no such object"):
        fl.Dataset.open(url, storage_options=_opts(endpoint, client=client), cache_dir=tmp_path / "c")


def test_access_denied_is_permission_error(s3_server, s3_proxy, remote_dir, tmp_path):
    url, _, _ = remote_dir
    for client in CLIENTS:
        s3_proxy.arm("403", match="manifest.json", times=1)
        with pytest.raises(PermissionError, match=r"manifest.json: access denied"):
            fl.Dataset.open(url, storage_options=_opts(s3_proxy.url, client=client), cache_dir=tmp_path)


def test_pickle_carries_no_secret_and_reopens(remote_dir, s3_server, tmp_path):
    url, local, _ = remote_dir
    secret = "SECRETsecretSECRET0123456789"
    ds = fl.Dataset.open(url, storage_options=_opts(s3_server[0], key="testing-key-id", secret=secret),
                         cache_dir=tmp_path / "cache")
    blob = pickle.dumps(ds)
    assert secret.encode() not in blob and b"testing-key-id" not in blob
    back = pickle.loads(blob)  # credentials from the environment's chain here
    _equal(_batches(fl.Loader(back, batch_size=100)), _batches(fl.Loader(fl.Dataset.open(local), batch_size=100)))
    loader = fl.Loader(ds, batch_size=100)
    it = iter(loader)
    next(it)
    assert secret not in repr(loader.state_dict()) and secret not in repr(ds)


@pytest.mark.parametrize("client", CLIENTS)
def test_secret_never_in_errors(s3_server, s3_proxy, remote_dir, tmp_path, client):
    url, _, _ = remote_dir
    secret = "SECRETsecretSECRET0123456789"
    s3_proxy.arm("500", match="manifest.json", times=100)
    with pytest.raises(OSError) as info:
        fl.Dataset.open(url, storage_options=_opts(s3_proxy.url, key="testing-key-id", secret=secret, max_attempts=2,
                                                   client=client), cache_dir=tmp_path)
    text = str(info.value) + repr(info.value) + str(info.value.__cause__) + str(info.value.__context__)
    assert secret not in text and "manifest.json" in text
    with pytest.raises(ValueError) as info2:
        fl.Dataset.open(url, storage_options={"endpoint_url": s3_server[0], "secret_key_typo": secret})
    assert secret not in str(info2.value) and "secret_key_typo" in str(info2.value)


# ------------------------------------------------------------------------------------ token files
@pytest.fixture
def remote_tokens(s3_server, tmp_path):
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    rng = np.random.default_rng(3)
    paths = []
    for k, n in enumerate([5000, 3001, 7777, 64]):
        p = tmp_path / f"tok{k}.bin"
        rng.integers(0, 50000, n, dtype=np.uint16).tofile(p)
        paths.append(str(p))
        _client(endpoint).put_object(Bucket=bucket, Key=f"tokens/part-{k:03d}.bin", Body=p.read_bytes())
    return f"s3://{bucket}/tokens/", paths


@pytest.mark.parametrize("threads", [1, 2])
def test_remote_windows_equal_local(remote_tokens, s3_server, tmp_path, threads):
    prefix, paths = remote_tokens
    remote = fl.Windows.from_files(prefix, dtype=np.uint16, length=129, stride=128,
                                   storage_options=_opts(s3_server[0]), cache_dir=tmp_path / "cache")
    here = fl.Windows.from_files(paths, dtype=np.uint16, length=129, stride=128)
    assert len(remote) == len(here) and remote.shard_rows == here.shard_rows
    kw = dict(batch_size=16, shuffle=True, seed=4, num_threads=threads)
    for epoch in (0, 1):
        _equal(_batches(fl.Loader(remote, **kw), epoch), _batches(fl.Loader(here, **kw), epoch))
    # A list of URLs is the same source; a pickle travels by URL.
    urls = [f"{prefix}part-{k:03d}.bin" for k in range(4)]
    listed = fl.Windows.from_files(urls, dtype=np.uint16, length=129, stride=128,
                                   storage_options=_opts(s3_server[0]), cache_dir=tmp_path / "cache")
    back = pickle.loads(pickle.dumps(listed))
    _equal(_batches(fl.Loader(back, **kw)), _batches(fl.Loader(here, **kw)))


def test_remote_windows_bounded_cache(remote_tokens, s3_server, s3_proxy, tmp_path):
    prefix, paths = remote_tokens
    limit = 2 * 7777 * 2  # the two largest files: below the 31,684 bytes of all four
    remote = fl.Windows.from_files(prefix, dtype=np.uint16, length=65, storage_options=_opts(s3_proxy.url),
                                   cache_dir=tmp_path / "cache", cache_limit=limit)
    here = fl.Windows.from_files(paths, dtype=np.uint16, length=65)
    kw = dict(batch_size=1, shuffle=True, seed=9, num_threads=2)
    for epoch in (0, 1, 2):
        _equal(_batches(fl.Loader(remote, **kw), epoch), _batches(fl.Loader(here, **kw), epoch))
        assert remote.storage_stats().cached_bytes <= limit
    assert remote.storage_stats().evictions > 0


# ------------------------------------------------------------------------------------ faults
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("kind", ["reset", "503", "truncate", "corrupt", "delay"])
def test_faults_are_retried(remote_dir, s3_server, s3_proxy, tmp_path, kind, client):
    url, local, _ = remote_dir
    s3_proxy.arm(kind, match=".npy", times=3, delay=0.3)
    ds = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url, read_timeout=5, client=client),
                         cache_dir=tmp_path / "cache")
    kw = dict(batch_size=100, shuffle=True, seed=6, num_threads=2)
    _equal(_batches(fl.Loader(ds, **kw)), _batches(fl.Loader(fl.Dataset.open(local), **kw)))
    assert s3_proxy.faults[0].times == 0  # every injected fault was met and got past
    assert ds.storage_stats().requests >= 16 + (3 if kind != "delay" else 0)


def _fails_for_good(url, proxy, tmp_path, client, kind, match, attempts, message):
    """A fault armed for every request: iterating the loader raises `message` (a RuntimeError
    naming the URL and the attempts) after `attempts` tries. Returns the source."""
    proxy.arm(kind, match=match, times=1000)
    ds = fl.Dataset.open(url, storage_options=_opts(proxy.url, max_attempts=attempts, client=client),
                         cache_dir=tmp_path / "cache")
    with pytest.raises(RuntimeError, match=message):
        _batches(fl.Loader(ds, batch_size=125, num_threads=1))
    return ds


@pytest.mark.parametrize("client", CLIENTS)
def test_after_the_retry_budget_next_names_url_status_attempts(remote_dir, s3_server, s3_proxy, tmp_path, client):
    _fails_for_good(remote_dir[0], s3_proxy, tmp_path, client, "503", "00002.npy", 3,
                    r"GET s3://.*00002\.npy failed after 3 attempts; last: HTTP 503 SlowDown")


@pytest.mark.parametrize("client", CLIENTS)
def test_corrupt_body_is_fetched_again_then_reported(remote_dir, s3_server, s3_proxy, tmp_path, client):
    # botocore checks the CRC the server sends; fastload's checksum is the second line (http below).
    ds = _fails_for_good(remote_dir[0], s3_proxy, tmp_path, client, "corrupt", ".npy", 2,
                         r"failed after 2 attempts; last: (corrupt body|FlexibleChecksumError)")
    assert not [f for d, _, fs in os.walk(ds.cache_dir) for f in fs if f.endswith(".npy")]  # nothing unverified


def test_http_urls_read_a_dataset_and_verify_checksums(remote_dir, s3_server, s3_proxy, tmp_path):
    url, local, _ = remote_dir
    bucket, _, prefix = url[5:].partition("/")
    c = _client(s3_server[0])
    for o in c.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]:  # readable without credentials
        c.put_object_acl(Bucket=bucket, Key=o["Key"], ACL="public-read")
    http_url = f"{s3_proxy.url}/{url[5:]}"  # path-style: /bucket/key
    ds = fl.Dataset.open(http_url, storage_options={"backoff": 0.01}, cache_dir=tmp_path / "cache")
    kw = dict(batch_size=64, shuffle=True, seed=1, num_threads=2)
    _equal(_batches(fl.Loader(ds, **kw)), _batches(fl.Loader(fl.Dataset.open(local), **kw)))
    s3_proxy.arm("corrupt", match=".npy", times=1)  # one corrupt body: fetched again, batches exact
    ds2 = fl.Dataset.open(http_url, storage_options={"backoff": 0.01}, cache_dir=tmp_path / "cache2")
    _equal(_batches(fl.Loader(ds2, **kw)), _batches(fl.Loader(fl.Dataset.open(local), **kw)))
    assert s3_proxy.faults[0].times == 0
    s3_proxy.arm("corrupt", match=".npy", times=1000)
    ds3 = fl.Dataset.open(http_url, storage_options={"backoff": 0.01, "max_attempts": 2}, cache_dir=tmp_path / "c3")
    with pytest.raises(RuntimeError, match=r"GET http://.*\.npy failed after 2 attempts; last: corrupt body .*checksum"):
        _batches(fl.Loader(ds3, batch_size=125, num_threads=1))
    with pytest.raises(ValueError, match="no listing"):
        fl.Windows.from_files(f"{s3_proxy.url}/bucket/tokens/", dtype=np.uint16, length=8)


# ------------------------------------------------------------------------------------ shared cache, crashes
_CHILD = r"""
import os, sys, time, signal
import numpy as np
sys.path.insert(0, {tests!r})
from fastload._storage.cache import ObjectCache, Entry
from fastload._storage.urls import parse_url
cache = ObjectCache({root!r})
e = Entry(parse_url("s3://b/k.npy"), "k.npy", 1 << 20)
def slow_get(url, out, size, check):
    out.write(b"x" * 1000)
    out.flush()
    print("writing", flush=True)
    time.sleep(60)
cache.fetch(e, slow_get)
"""


def test_a_manifest_being_written_is_not_removed_by_another_process_opening_the_cache(tmp_path):
    """Every process that opens a dataset writes the manifest's copy into the cache folder, and
    every open removes partial files whose lock nobody holds: the copy is written under its lock
    (ObjectCache.put), so a second process's open never removes it mid-write (CI caught three
    processes opening one dataset at once failing with FileNotFoundError on the rename)."""
    import fcntl
    import multiprocessing

    from fastload._storage.cache import ObjectCache

    root = str(tmp_path / "c")
    cache = ObjectCache(root)
    cache.put("manifest.json", b"{}")
    with open(os.path.join(root, "manifest.json"), "rb") as f:
        assert f.read() == b"{}"
    # A writer mid-way (its lock held, its temporary file there) and an open by another process.
    lock = os.open(os.path.join(root, "manifest.json.lock"), os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)
    partial = os.path.join(root, "manifest.json.part-1-abc")
    open(partial, "wb").close()
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=ObjectCache, args=(root,))
    p.start()
    p.join(60)
    assert p.exitcode == 0 and os.path.exists(partial)  # left alone: its lock is held
    os.close(lock)  # the writer died: the next open removes what it left
    assert ObjectCache(root).removed_partials == 1 and not os.path.exists(partial)


def test_sigkilled_download_leaves_a_temp_file_the_next_run_removes(tmp_path):
    from fastload._storage.cache import Entry, ObjectCache
    from fastload._storage.urls import parse_url

    root = str(tmp_path / "cache")
    child = subprocess.Popen([sys.executable, "-c", _CHILD.format(root=root, tests=os.path.dirname(__file__))],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "writing"
        partial = [f for f in os.listdir(root) if ".part-" in f]
        assert len(partial) == 1
        # While the writer lives, its lock is held: an open elsewhere leaves its file alone.
        assert ObjectCache(root).removed_partials == 0
        child.kill()
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
        child.stdout.close()
    assert [f for f in os.listdir(root) if ".part-" in f] == partial
    cache = ObjectCache(root)  # the next run: the abandoned temp file goes, nothing else is needed
    assert cache.removed_partials == 1 and not [f for f in os.listdir(root) if ".part-" in f]
    e = Entry(parse_url("s3://b/k.npy"), "k.npy", 4)
    st, n = cache.fetch(e, lambda url, out, size, check: out.write(b"abcd"))
    assert n == 4 and (tmp_path / "cache" / "k.npy").read_bytes() == b"abcd"


def test_processes_share_one_download_per_object(remote_dir, s3_server, s3_proxy, tmp_path):
    url, local, _ = remote_dir
    code = (f"import fastload as fl, numpy as np\n"
            f"ds = fl.Dataset.open({url!r}, storage_options={{'endpoint_url': {s3_proxy.url!r}}}, "
            f"cache_dir={str(tmp_path / 'cache')!r})\n"
            f"n = sum(int(b['y'].sum()) for b in fl.Loader(ds, batch_size=100, shuffle=True, seed=0))\n"
            f"print(n)\n")
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert outs == [str(sum(range(1000)))] * 3
    counts = [c for p, c in s3_proxy.gets.items() if p.endswith(".npy")]
    assert len(counts) == 16 and max(counts) == 1  # each shard file fetched once for the node


def test_dropped_source_stops_its_threads_and_an_abandoned_epoch_stops_prefetch(remote_blocks, s3_server, s3_proxy,
                                                                                tmp_path):
    import gc
    import threading
    import time

    url, _, shard = remote_blocks

    def fetch_threads():
        return [t for t in threading.enumerate() if t.name.startswith(("fastload-prefetch", "fastload-fetch"))]

    gc.collect()
    # This source's own threads: earlier tests' sources may still be ending theirs.
    before = set(fetch_threads())
    ds = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url), cache_dir=tmp_path / "cache",
                         cache_limit=6 * shard)
    loader = fl.Loader(ds, batch_size=512, shuffle=True, seed=0, order="block", num_threads=1, prefetch=1)
    it = iter(loader)
    next(it)
    ours = set(fetch_threads()) - before
    assert ours
    loader.close()  # the epoch is abandoned: the fetcher stops fetching for it
    time.sleep(0.5)
    settled = s3_proxy.total_gets()
    time.sleep(1.0)
    assert s3_proxy.total_gets() == settled
    del it, loader, ds
    for _ in range(50):
        gc.collect()
        if not any(t.is_alive() for t in ours):
            break
        time.sleep(0.1)
    assert not [t.name for t in ours if t.is_alive()]


def test_other_loader_modes_read_remote_sources_exactly(remote_dir, remote_tokens, s3_server, tmp_path):
    """partition="shards", steps=, split() and fl.Mix over a remote and a local source give the
    batches of the same data read locally (fetched on demand where the plan is not handed over)."""
    url, local, _ = remote_dir
    remote = fl.Dataset.open(url, storage_options=_opts(s3_server[0]), cache_dir=tmp_path / "cache")
    here = fl.Dataset.open(local)
    for kw in (dict(batch_size=50, shuffle=True, seed=3, partition="shards", rank=1, world_size=2),
               dict(batch_size=64, shuffle=True, seed=3, steps=40)):
        _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(here, **kw)))
    parts = [fl.Loader(src, batch_size=32, shuffle=True, seed=1).split(["cpu", "cpu"]) for src in (remote, here)]
    for a, b in zip(*parts):
        _equal([{k: v.clone() for k, v in x.items()} for x in a], [{k: v.clone() for k, v in x.items()} for x in b])
    prefix, paths = remote_tokens
    tokens = fl.Windows.from_files(prefix, dtype=np.uint16, length=65, storage_options=_opts(s3_server[0]),
                                   cache_dir=tmp_path / "cache")
    local_tokens = fl.Windows.from_files(paths, dtype=np.uint16, length=65)
    x = np.arange(4000, dtype=np.int64).reshape(1000, 4)
    mixes = [fl.Mix({"tokens": t, "rows": fl.Dataset({"tokens": x[:, :1].repeat(65, 1).astype(np.uint16)})},
                    weights={"tokens": 3, "rows": 1}) for t in (tokens, local_tokens)]
    kw = dict(batch_size=16, shuffle=True, seed=2, steps=30)
    _equal(_batches(fl.Loader(mixes[0], **kw)), _batches(fl.Loader(mixes[1], **kw)))


def test_elastic_resume_and_prefetch_into_the_next_epoch(remote_blocks, s3_server, s3_proxy, tmp_path):
    """A state saved at world size 2 resumes at 1 with the same global batch (the next steps'
    shards fetched first), batches equal to the local resume; and the first shards of the next
    epoch are fetched before it starts."""
    import time

    url, local, shard = remote_blocks
    opts = _opts(s3_proxy.url)
    remote = fl.Dataset.open(url, storage_options=opts, cache_dir=tmp_path / "cache", cache_limit=8 * shard)
    here = fl.Dataset.open(local)
    kw = dict(shuffle=True, seed=4, num_threads=2, order="block")
    first = fl.Loader(remote, batch_size=256, rank=0, world_size=2, **kw)
    it = iter(first)
    for _ in range(10):
        next(it)
    state = first.state_dict()
    del it
    resumed, reference = fl.Loader(remote, batch_size=512, **kw), fl.Loader(here, batch_size=512, **kw)
    resumed.load_state_dict(state)
    reference.load_state_dict(state)
    _equal(_batches(resumed), _batches(reference))
    # After the epoch, the shard the next epoch reads first comes in without a batch asking for it.
    small = fl.Dataset.open(url, storage_options=opts, cache_dir=tmp_path / "cache2", cache_limit=6 * shard)
    full = fl.Loader(small, batch_size=512, **kw)
    full.set_epoch(3)
    it = iter(full)
    # What the fetcher follows: the rest of epoch 3, then epoch 4's order (white-box, but the
    # behaviour below can pass by luck when the shard was cached anyway).
    # The prefetch thread asks for windows of the plan (a short one first); the full one holds both
    # epochs whole.
    both = len(full.plan(3)) + len(full.plan(4))
    assert _wait_for(lambda: small._fetcher._seq is not None and len(small._fetcher._seq) == both)
    for _ in it:
        pass
    first4 = int(np.searchsorted(np.cumsum(small.shard_rows), full.plan(4)[0], side="right"))
    path = os.path.join(small.cache_dir, "x", f"{first4:06d}.npy")
    for _ in range(100):
        if os.path.exists(path):
            break
        time.sleep(0.05)
    assert os.path.exists(path)


# ------------------------------------------------------------------------------------ eviction order
def _memory_client(objects):
    """A store in a dict (for the fetcher's own logic; everything else runs against moto)."""
    from fastload._storage.client_protocol import Client

    class MemoryClient(Client):
        concurrency = 4

        def __init__(self):
            self.objects, self.requests = objects, 0

        def get_whole(self, url, out, expected=None, check=None, version=None):
            self.requests += 1
            out.write(self.objects[url.key])
            return len(self.objects[url.key])

    return MemoryClient()


def _fetcher(tmp_path, n, size, limit):
    from fastload._storage.cache import Entry, ObjectCache
    from fastload._storage.fetcher import Fetcher
    from fastload._storage.urls import Url

    client = _memory_client({f"k{i}": bytes([i]) * size for i in range(n)})
    entries = [Entry(Url("s3", "b", f"k{i}"), f"f{i}", size) for i in range(n)]
    return Fetcher(client, ObjectCache(str(tmp_path / "c")), entries, [[i] for i in range(n)], limit), client


def _cached(f):
    return sorted(int(name[1:]) for name in os.listdir(f.cache.root) if name.startswith("f") and "." not in name)


def test_eviction_drops_the_shard_needed_furthest_ahead(tmp_path):
    """Belady's rule against a brute-force reading of the plan: with room for 3 of 5 shards, each
    eviction removes the cached shard whose next use is furthest away (never used again first)."""
    f, client = _fetcher(tmp_path, 5, 100, 300)
    seq = np.array([0, 1, 2, 3, 0, 1, 4, 0, 3, 1, 2, 4, 0])
    pos = [0]
    f.start_epoch(seq, lambda: pos[0], prefetch=False)
    for p, shard in enumerate(seq.tolist()):
        pos[0] = p
        cached = _cached(f)
        if shard not in cached and len(cached) == 3:
            def next_use(k):
                later = [q for q in range(p, len(seq)) if seq[q] == k]
                return later[0] if later else len(seq) + 1
            expect = max(cached, key=next_use)
            f.provide(shard)
            assert expect not in _cached(f) and shard in _cached(f), (p, cached, expect)
        else:
            f.provide(shard)
        assert len(_cached(f)) <= 3
    assert client.requests == f.stats().misses  # one GET per miss, none for a hit


def test_without_a_plan_eviction_is_least_recently_used(tmp_path):
    f, _ = _fetcher(tmp_path, 4, 100, 200)
    f.provide(0)
    f.provide(1)
    f.provide(0)
    f.provide(2)  # 1 is the least recently used
    assert _cached(f) == [0, 2]


def test_loader_killed_mid_download_then_a_new_run_starts_cleanly(remote_dir, s3_server, s3_proxy, tmp_path):
    import signal
    import time

    url, local, _ = remote_dir
    cache = tmp_path / "cache"
    s3_proxy.arm("delay", match="x/000003.npy", times=1, delay=10.0)  # this download hangs
    code = (f"import fastload as fl\n"
            f"ds = fl.Dataset.open({url!r}, storage_options={{'endpoint_url': {s3_proxy.url!r}, 'client': 'boto3'}}, "
            f"cache_dir={str(cache)!r})\n"
            f"for b in fl.Loader(ds, batch_size=100, num_threads=2):\n    pass\n")
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        partial = []
        for _ in range(600):
            partial = [os.path.join(d, n) for d, _, ns in os.walk(cache) for n in ns if ".part-" in n]
            if any("000003.npy.part-" in p for p in partial):
                break
            time.sleep(0.05)
        assert any("000003.npy.part-" in p for p in partial)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert [os.path.join(d, n) for d, _, ns in os.walk(cache) for n in ns if ".part-" in n]  # left behind
    ds = fl.Dataset.open(url, storage_options=_opts(s3_server[0]), cache_dir=cache)  # no cleanup by hand
    assert not [n for d, _, ns in os.walk(cache) for n in ns if ".part-" in n]
    kw = dict(batch_size=100, shuffle=True, seed=8, num_threads=2)
    _equal(_batches(fl.Loader(ds, **kw)), _batches(fl.Loader(fl.Dataset.open(local), **kw)))


def test_token_file_rewritten_in_place_is_not_read_from_the_old_cache(s3_server, tmp_path):
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    old, new = np.arange(4096, dtype=np.uint16), np.arange(4096, dtype=np.uint16)[::-1].copy()
    _client(endpoint).put_object(Bucket=bucket, Key="t/a.bin", Body=old.tobytes())
    for client in CLIENTS:
        _client(endpoint).put_object(Bucket=bucket, Key="t/a.bin", Body=old.tobytes())
        for data in (old, new):  # same size, new bytes
            _client(endpoint).put_object(Bucket=bucket, Key="t/a.bin", Body=data.tobytes())
            for paths in (f"s3://{bucket}/t/", [f"s3://{bucket}/t/a.bin"]):
                w = fl.Windows.from_files(paths, dtype=np.uint16, length=64, cache_dir=tmp_path / "cache",
                                          storage_options=_opts(endpoint, client=client))
                got = np.concatenate([b["tokens"].numpy().reshape(-1) for b in fl.Loader(w, batch_size=8)])
                assert np.array_equal(got, data)


def test_remote_shard_and_verify(remote_dir, s3_server, tmp_path):
    url, local, cols = remote_dir
    ds = fl.Dataset.open(url, storage_options=_opts(s3_server[0]), cache_dir=tmp_path / "cache", verify=True)
    assert np.array_equal(ds.shard(3)["x"], cols["x"][375:500]) and np.array_equal(ds.shard(-1)["y"], cols["y"][875:])
    victim = os.path.join(ds.cache_dir, "y", "000002.npy")
    with open(victim, "r+b") as f:  # a cached file damaged on disk (same size)
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(fl.DatasetError, match=r"y/000002\.npy: checksum .*cached copy .* is corrupt"):
        ds.verify()


def test_requests_in_flight_are_bounded(remote_blocks, s3_server, s3_proxy, tmp_path):
    """At most max_concurrency prefetches, plus one demand fetch per collation thread."""
    url, local, shard = remote_blocks
    s3_proxy.arm("delay", match=".npy", times=1000, delay=0.05)
    ds = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url, max_concurrency=2), cache_dir=tmp_path / "cache")
    kw = dict(batch_size=512, shuffle=True, seed=1, num_threads=2)
    _equal(_batches(fl.Loader(ds, **kw)), _batches(fl.Loader(fl.Dataset.open(local), **kw)))
    assert 1 <= s3_proxy.peak_in_flight <= 2 + 2


# ------------------------------------------------------------------------------------ prefetch in every mode
def _first_use_order(shards_in_read_order):
    """Brute force: the shards in the order they are first read."""
    seen = []
    for k in shards_in_read_order:
        if k not in seen:
            seen.append(k)
    return seen


def _shard_of(ids, shard_rows):
    return np.searchsorted(np.cumsum(shard_rows), np.asarray(ids), side="right").tolist()


def _fetched_shards(proxy, prefix):
    """The shards (of objects under prefix/<column>/<shard>.npy) in the order of their first GET."""
    return _first_use_order([int(p.rsplit("/", 1)[1][:6]) for p in proxy.log
                             if f"/{prefix}/" in p and p.endswith(".npy")])


def _wait_for(predicate, timeout=20.0):
    import time

    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def _first_steps(steps, shard_rows, part=None):
    """Brute force, from the batches themselves (their "index"): the step where each shard is
    first read (`part`: only a Mix source's rows, by "source")."""
    first = {}
    for k, step in enumerate(steps):
        for b in step:
            ids = b["index"].numpy()
            if part is not None:
                ids = ids[b["source"].numpy() == part]
            for shard in _shard_of(ids, shard_rows):
                first.setdefault(shard, k)
    return first


def _steps_of(iterators):
    """Every device's batches, step by step (cloned)."""
    return [[{k: v.clone() for k, v in b.items()} for b in step] for step in zip(*iterators)]


@pytest.mark.parametrize("mode", ["split", "steps", "mix", "resumed"])
def test_prefetch_follows_the_plan_in_every_mode(remote_blocks, s3_server, s3_proxy, tmp_path, mode):
    """split(), steps=, fl.Mix and a resumed steps= run prefetch along the plan: with the consumer
    standing still after its first batch, every shard the run reads is fetched, once, in the order
    the plan first reads them (brute force from the batches of the same run read locally); the
    rest of the run then waits for no fetch."""
    url, local, shard = remote_blocks
    s3_proxy.arm("delay", match=".npy", times=1000, delay=0.02)
    remote = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url, max_concurrency=1), cache_dir=tmp_path / "c")
    here = fl.Dataset.open(local)
    rows = remote.shard_rows
    kw = dict(shuffle=True, seed=5, order="block", num_threads=1, prefetch=1, with_index=True)
    part = None
    if mode == "split":
        make = lambda src: fl.Loader(src, batch_size=256, **kw)  # noqa: E731
        start = lambda loader: loader.split(["cpu", "cpu"])  # noqa: E731
    elif mode in ("steps", "resumed"):
        make = lambda src: fl.Loader(src, batch_size=512, steps=60, **kw)  # noqa: E731
        start = lambda loader: [iter(loader)]  # noqa: E731
    else:
        other = fl.Dataset({"x": np.zeros((3000, 4), np.float32), "y": np.arange(3000)})
        make = lambda src: fl.Loader(fl.Mix({"remote": src, "local": other}, weights={"remote": 3, "local": 1},  # noqa: E731
                                            with_source=True), batch_size=512, **kw)
        start = lambda loader: [iter(loader)]  # noqa: E731
        part = 0
    loaders = [make(remote), make(here)]
    if mode == "resumed":  # a state after 25 steps, resumed: the next steps' shards come first
        first = make(here)
        it = iter(first)
        for _ in range(25):
            next(it)
        state = first.state_dict()
        del it
        for loader in loaders:
            loader.load_state_dict(state)
    iters = start(loaders[0])
    got = [[{k: v.clone() for k, v in next(i).items()} for i in iters]]
    first = _first_steps(_steps_of(start(loaders[1])), rows, part)
    assert _wait_for(lambda: len(_fetched_shards(s3_proxy, "blocks")) == len(first))  # the consumer stood still
    assert max(s3_proxy.gets.values()) == 1
    fetched = _fetched_shards(s3_proxy, "blocks")
    assert sorted(fetched) == sorted(first)
    # In plan order (the step each shard is first read at never goes back), but for the requests in
    # flight at once (the prefetcher's one, and the one a collation thread may make for its batch)
    # arriving in either order.
    steps = [first[k] for k in fetched]
    assert all(steps[i] <= steps[j] for i in range(len(steps)) for j in range(i + 2, len(steps))), (fetched, first)
    assert _wait_for(lambda: remote.storage_stats().cached_bytes == len(first) * shard)  # downloads done
    misses = loaders[0].stats().storage.misses
    got += _steps_of(iters)
    reference = make(here)
    if mode == "resumed":
        reference.load_state_dict(state)
    want = _steps_of(start(reference))
    _equal([b for s in got for b in s], [b for s in want for b in s])
    assert loaders[0].stats().storage.misses == misses  # nothing waited for a fetch after that


def test_loader_stats_show_the_storage_counters_of_the_run(remote_dir, s3_server, s3_proxy, tmp_path):
    """Loader.stats().storage: this run's bytes fetched, requests, hits and misses, the collation
    threads' wait and the bytes/s from storage, counted against the proxy and the files; None and
    no table row for local data."""
    url, local, _ = remote_dir
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(local) for f in fs if f.endswith(".npy"))
    s3_proxy.arm("delay", match=".npy", times=1000, delay=0.02)
    ds = fl.Dataset.open(url, storage_options=_opts(s3_proxy.url), cache_dir=tmp_path / "cache")
    loader = fl.Loader(ds, batch_size=100, shuffle=True, seed=1, num_threads=2)
    assert loader.stats().storage.bytes_fetched == 0 and loader.stats().storage.requests == 0
    _batches(loader, 0)
    s = loader.stats().storage
    assert s.bytes_fetched == size and s.requests == sum(c for p, c in s3_proxy.gets.items() if p.endswith(".npy")) == 16
    assert s.hits + s.misses == 16  # each of the 16 files mapped once, found cached or waited for
    assert s.misses >= 1 and s.wait_s > 0  # the first batch waited for its files
    assert s.bytes_per_s == s.bytes_fetched / s.fetch_busy_s and 0 < s.bytes_per_s
    assert s.cached_bytes == size and s.limit == ds.storage_stats().limit
    text = str(loader.stats())
    assert f"{size / 1e6:,.1f} MB fetched (1.00x the dataset) in 16 requests" in text, text
    assert f"{s.misses:,} misses" in text and s.dataset_bytes == size and s.fetched_per_dataset == 1.0, text
    # The next epoch's counters start again: everything is cached, nothing is fetched or waited for.
    _batches(loader, 1)
    s2 = loader.stats().storage
    assert (s2.bytes_fetched, s2.requests, s2.misses, s2.wait_s) == (0, 0, 0, 0.0) and s2.cached_bytes == size
    assert ds.storage_stats().bytes_fetched == size  # the source's own count covers both
    # A Mix adds up its remote sources; local data has none.
    mix = fl.Mix({"remote": ds, "local": fl.Dataset.open(local)})
    assert fl.Loader(mix, batch_size=10, steps=3).stats().storage.cached_bytes == size
    plain = fl.Loader(fl.Dataset.open(local), batch_size=100)
    _batches(plain)
    assert plain.stats().storage is None and "storage" not in str(plain.stats())


@pytest.mark.parametrize("mode", ["epoch", "split", "resumed", "steps", "mix"])
def test_run_order_is_the_runs_batches_then_the_next_epochs(mode):
    """Schedule.run_order() against brute force: the ids of every batch the run hands out (all
    devices of a step, in device order), then the next epoch's, from the step the consumer is at."""
    x = np.arange(3000, dtype=np.int64)
    src = fl.Dataset({"x": x})
    kw = dict(batch_size=64, shuffle=True, seed=9, with_index=True)
    devices = ["cpu", "cpu"] if mode == "split" else ["cpu"]
    if mode == "steps":
        loader = fl.Loader(src, steps=30, **kw)
    elif mode == "mix":
        loader = fl.Loader(fl.Mix({"a": src, "b": fl.Dataset({"x": x[:700] + 10**6})}, weights={"a": 2, "b": 1}), **kw)
    else:
        loader = fl.Loader(src, **kw)
    if mode == "resumed":
        it = iter(loader)
        for _ in range(7):
            next(it)
        state = loader.state_dict()
        del it
        loader.load_state_dict(state)
    iters = loader.split(devices)
    for _ in range(3):  # the order is asked for after 3 steps
        [next(i) for i in iters]
    order = loader._schedule.run_order()
    run = [np.concatenate([b["index"].numpy() for b in step]) for step in zip(*iters)]
    ids, counts = order.ids(0, order.steps)
    assert order.boundary == len(run) and list(counts[:len(run)]) == [len(r) for r in run]
    assert np.array_equal(ids[:sum(map(len, run))], np.concatenate(run))
    assert order.position() == len(run)  # steps handed out since the order was made
    a, b = order.boundary - 5, order.boundary + 3  # windows of it are slices of the whole
    part, _ = order.ids(a, b)
    assert np.array_equal(part, ids[counts[:a].sum():counts[:b].sum()])
    if mode != "steps":  # then the next epoch's
        nxt = [np.concatenate([b["index"].numpy() for b in step]) for step in zip(*loader.split(devices))]
        assert np.array_equal(ids[sum(map(len, run)):], np.concatenate(nxt))
        assert order.position() is None  # another run started: this one is over
    else:
        assert order.steps == order.boundary


def test_building_a_loader_starts_the_download_threads(remote_dir, s3_server, tmp_path):
    """The fetcher's threads start with the first Loader over the source (not in the first epoch,
    whose downloads would wait for them), once."""
    import threading

    url, _, _ = remote_dir
    ds = fl.Dataset.open(url, storage_options=_opts(s3_server[0], max_concurrency=5), cache_dir=tmp_path / "cache")
    pool = ds._fetcher._pool
    assert pool is None  # opening alone starts nothing
    fl.Loader(ds, batch_size=100)
    pool = ds._fetcher._pool
    assert len(pool._threads) == 5 and all(t.is_alive() for t in pool._threads)
    fl.Loader(ds, batch_size=50)
    assert ds._fetcher._pool is pool and len(pool._threads) == 5
    assert "fastload-prefetch" in [t.name for t in threading.enumerate()]
