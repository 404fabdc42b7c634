"""Bounds of the remote sources against the real servers of the tests (moto's S3 server, the GCS
emulator, the proxy of tests/s3_proxy.py): a body trickled by the server is cut at its deadline
(read_timeout plus a second per MiB) and retried, for every client; a full file system under the
cache is an error naming the folder, its free space and cache_limit; cache_dir="~/..." is the
home folder's; and stats() says how many times over the dataset an epoch fetched."""
from __future__ import annotations

import os
import subprocess
import time
import uuid

import numpy as np
import pytest

import fastload as fl
from remote_helpers import S3_CLIENTS, batches, opts, small_dataset, upload_dir

boto3 = pytest.importorskip("boto3")


def _s3(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _bucket(endpoint) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    _s3(endpoint).create_bucket(Bucket=name)
    return name


def _tokens_everywhere(s3_server, gcs_server, data: bytes):
    """The same token file in the S3 server (public: also read over http) and in the emulator."""
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    _s3(endpoint).put_object(Bucket=bucket, Key="tok/a.bin", Body=data, ACL="public-read")
    gbucket = gcs_server.bucket()
    gcs_server.put(gbucket, "tok/a.bin", data)
    return bucket, gbucket


# ------------------------------------------------------------------------------------ item 10: trickled bodies
@pytest.mark.parametrize("client", S3_CLIENTS + ["http", "gs"])
def test_a_trickled_body_is_cut_at_its_deadline_and_retried(s3_server, s3_proxy, gcs_server, gcs_proxy, tmp_path,
                                                            client):
    """A body of 256 KiB trickled 64 bytes every 0.25 s (17 minutes whole) with read_timeout=2: each
    attempt is cut after read_timeout plus 1 s per MiB; the next (not trickled) completes, the
    batches exact; trickled every time, the error names the URL and the deadline within seconds."""
    data = np.random.default_rng(0).integers(0, 60000, 128 << 10, dtype=np.uint16)
    bucket, gbucket = _tokens_everywhere(s3_server, gcs_server, data.tobytes())
    if client == "gs":
        proxy, url, options = gcs_proxy, f"gs://{gbucket}/tok/", opts(gcs_proxy.url, anon=True)
    elif client == "http":
        proxy, url, options = s3_proxy, [f"{s3_proxy.url}/{bucket}/tok/a.bin"], {"backoff": 0.01}
    else:
        proxy, url, options = s3_proxy, f"s3://{bucket}/tok/", opts(s3_proxy.url, client=client)
    options["read_timeout"] = 2
    for times, attempts in ((1, 3), (100, 2)):
        proxy.reset_counts()
        proxy.arm("trickle", match="a.bin", times=times, delay=0.25)
        w = fl.Windows.from_files(url, dtype=np.uint16, length=1024, cache_dir=tmp_path / f"c{times}",
                                  storage_options={**options, "max_attempts": attempts})
        started = time.monotonic()
        if times == 1:
            got = np.concatenate([b["tokens"].numpy().reshape(-1) for b in batches(fl.Loader(w, batch_size=8))])
            assert np.array_equal(got, data[:len(got)]) and len(got) == len(data)
        else:
            deadline = (r"the body was not complete within 2\.2 s" if client != "obstore" else
                        r"the request was not complete within read_timeout \(2\.0s")
            with pytest.raises(RuntimeError, match=rf"GET \S*tok/a\.bin failed after 2 attempts; last: {deadline}"):
                batches(fl.Loader(w, batch_size=8))
        # Two attempts of ~2.2 s each, where an unbounded body takes 17 minutes; the margin is for a
        # loaded machine (CI saw 22 s with the moto server and the proxy sharing two cores).
        assert time.monotonic() - started < 90
        assert proxy.faults[0].times < times  # the trickle was met (by the prefetcher's attempts too)


def test_a_body_that_keeps_coming_is_not_cut(s3_server, s3_proxy, tmp_path):
    """The deadline grows with the body (a second per MiB): a 4 MiB body sent in 64 KiB pieces
    every 20 ms (about 1.3 s whole, longer than read_timeout=0.5 s) arrives in one attempt."""
    from fastload._storage.deadline import body_limit

    assert body_limit(0.5, 4 << 20) == 4.5
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    data = np.random.default_rng(1).integers(0, 60000, 2 << 20, dtype=np.uint16)
    _s3(endpoint).put_object(Bucket=bucket, Key="tok/a.bin", Body=data.tobytes())
    for client in S3_CLIENTS:
        if client == "obstore":
            continue  # its timeout is the whole request's (documented)
        s3_proxy.reset_counts()
        s3_proxy.arm("trickle", match="a.bin", times=1, delay=0.02, piece=64 << 10)
        w = fl.Windows.from_files(f"s3://{bucket}/tok/", dtype=np.uint16, length=1024, cache_dir=tmp_path / client,
                                  storage_options=opts(s3_proxy.url, client=client, read_timeout=0.5, max_attempts=1))
        got = np.concatenate([b["tokens"].numpy().reshape(-1) for b in batches(fl.Loader(w, batch_size=64))])
        assert np.array_equal(got, data)


# ------------------------------------------------------------------------------------ item 13: ~ in cache_dir
def test_cache_dir_with_a_tilde_is_the_home_folders(s3_server, tmp_path, monkeypatch):
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    local = tmp_path / "ds"
    small_dataset(local, width=4, seed=3)
    upload_dir(_s3(endpoint), bucket, "ds", local)
    _s3(endpoint).put_object(Bucket=bucket, Key="tok/a.bin", Body=np.arange(512, dtype=np.uint16).tobytes())
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    ds = fl.Dataset.open(f"s3://{bucket}/ds", storage_options=opts(endpoint), cache_dir="~/fl-cache")
    w = fl.Windows.from_files(f"s3://{bucket}/tok/", dtype=np.uint16, length=8, storage_options=opts(endpoint),
                              cache_dir="~/fl-cache")
    batches(fl.Loader(ds, batch_size=100))
    batches(fl.Loader(w, batch_size=8))
    assert ds.cache_dir.startswith(str(home / "fl-cache")) and os.listdir(home / "fl-cache")
    assert not os.listdir(work)  # no folder named "~" here
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")  # quoted in a shell: reaches us unexpanded
    default = fl.Dataset.open(f"s3://{bucket}/ds", storage_options=opts(endpoint))
    assert default.cache_dir.startswith(str(home / "xdg" / "fastload" / "remote")) and not os.listdir(work)
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return
    pq.write_table(pa.table({"id": np.arange(10)}), tmp_path / "t.parquet")
    _s3(endpoint).put_object(Bucket=bucket, Key="pq/t.parquet", Body=(tmp_path / "t.parquet").read_bytes())
    table = fl.Parquet(f"s3://{bucket}/pq/", ["id"], storage_options=opts(endpoint), cache_dir="~/fl-cache")
    assert table.cache_dir.startswith(str(home / "fl-cache")) and not os.listdir(work)


# ------------------------------------------------------------------------------------ item 14: a full file system
def _tiny_tmpfs(path) -> bool:
    """A 64 KiB tmpfs mounted at `path` (root only); False where it cannot be mounted."""
    if os.geteuid() != 0:
        return False
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.mark.parametrize("full", ["tmpfs", "/dev/full"])
def test_a_full_cache_file_system_names_the_folder_free_space_and_limit(s3_server, tmp_path, monkeypatch, full):
    """The cache on a file system with no room: the error names the object, the cache folder,
    the space free there and cache_limit, not a bare "No space left on device". A real 64 KiB
    tmpfs where it can be mounted (root); everywhere, the kernel's own ENOSPC from /dev/full
    written into the cache's temporary file."""
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    local = tmp_path / "ds"
    fl.write_dataset(local, {"x": np.random.default_rng(0).standard_normal((8 * 1024, 8)).astype(np.float32)},
                     rows_per_shard=1024, fsync=False)  # 8 shards of 32 KiB: more than the tmpfs holds
    upload_dir(_s3(endpoint), bucket, "ds", local)
    cache = tmp_path / "full"
    if full == "tmpfs":
        if not _tiny_tmpfs(cache):
            pytest.skip("no tmpfs can be mounted here (not root, or no permission)")
    else:
        real = os.fdopen

        class Full:
            """A download's temporary file whose writes fail as a full disk's do (the kernel's
            ENOSPC, from /dev/full)."""

            def __init__(self, f):
                self.f, self.dev = f, open("/dev/full", "wb", buffering=0)

            def write(self, data):
                return self.dev.write(data)  # raises OSError(ENOSPC)

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.dev.close()
                self.f.close()

        def fdopen(fd, *args, **kwargs):
            f = real(fd, *args, **kwargs)
            return Full(f) if ".npy.part-" in os.readlink(f"/proc/self/fd/{fd}") else f

        monkeypatch.setattr(os, "fdopen", fdopen)
    try:
        ds = fl.Dataset.open(f"s3://{bucket}/ds", storage_options=opts(endpoint), cache_dir=cache, cache_limit="10MB")
        message = (rf"s3://{bucket}/ds/x/\d+\.npy: No space left on device in the cache folder {ds.cache_dir} "
                   rf"\(\d+ bytes free there, \d+ bytes to write; cache_limit is 10000000 bytes\)")
        with pytest.raises(RuntimeError, match=message):
            batches(fl.Loader(ds, batch_size=1024, num_threads=1))
    finally:
        if full == "tmpfs":
            subprocess.run(["umount", "--lazy", str(cache)], check=True)  # a fetch thread may still end there


# ------------------------------------------------------------------------------------ newcomer note: fetched per epoch
def test_stats_say_how_many_times_over_the_dataset_an_epoch_fetched(s3_server, tmp_path):
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    local = tmp_path / "ds"
    small_dataset(local, width=8, seed=4)
    upload_dir(_s3(endpoint), bucket, "ds", local)
    total = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(local) for n in ns if n.endswith(".npy"))
    ds = fl.Dataset.open(f"s3://{bucket}/ds", storage_options=opts(endpoint), cache_dir=tmp_path / "c")
    loader = fl.Loader(ds, batch_size=100, shuffle=True, seed=1)
    for _ in loader:
        pass
    st = loader.stats().storage
    assert st.dataset_bytes == total and st.bytes_fetched == total and st.fetched_per_dataset == 1.0
    assert "1.00x the dataset" in str(loader.stats())
    for _ in loader:  # epoch 2: all cached
        pass
    assert loader.stats().storage.fetched_per_dataset == 0.0 and ds.storage_stats().fetched_per_dataset == 1.0
    loader.close()
