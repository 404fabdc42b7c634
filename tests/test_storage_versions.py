"""Which bytes a remote source reads, against the real servers of the tests (moto's S3 server,
the GCS emulator, Python's own file server, the proxy of tests/s3_proxy.py): every GET of a token
file or a dataset shard is pinned to the version seen at open, so an object rewritten since is
an error naming its URL, never new bytes mixed with old ones (as Parquet already was); a prefix
is a folder for every client (never its siblings `tok-old/`, `tokenizer.bin`); a key the source
does not use never fails its open, and one it uses that a client cannot name is an error saying
so."""
from __future__ import annotations

import functools
import http.server
import os
import threading
import uuid

import numpy as np
import pytest

import fastload as fl
from remote_helpers import S3_CLIENTS, batches, has, opts

boto3 = pytest.importorskip("boto3")

CHANGED = r"the object changed since the source was opened"


def _s3(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _bucket(endpoint) -> str:
    name = f"v-{uuid.uuid4().hex[:12]}"
    _s3(endpoint).create_bucket(Bucket=name)
    return name


def _tokens(seed: int) -> list[bytes]:
    """Four token files of 4096 uint16 each (same sizes for every seed: a rewrite keeps sizes)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 60000, 4096, dtype=np.uint16).tobytes() for _ in range(4)]


def _read_twice(source, rewrite):
    """Epoch 0 in file order with a cache of two of the four files, rewrite(), then epoch 1:
    the files evicted in epoch 0 are fetched again, from their new version."""
    kw = dict(batch_size=8, shuffle=False, num_threads=1)
    first = batches(fl.Loader(source, **kw), epoch=0)
    assert source.storage_stats().evictions >= 2
    rewrite()
    return first, batches(fl.Loader(source, **kw), epoch=1)


@pytest.fixture
def file_server(tmp_path):
    """Python's own file server over a folder: Last-Modified and no ETag, and it ignores
    If-Match and If-Unmodified-Since (a server that does not honour a pin)."""
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# ------------------------------------------------------------------------------------ item 4: token files
@pytest.mark.parametrize("client", S3_CLIENTS)
@pytest.mark.parametrize("named", ["prefix", "list"])
def test_a_token_file_rewritten_between_epochs_is_an_error_not_new_bytes_s3(s3_server, tmp_path, client, named):
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    for k, data in enumerate(_tokens(1)):
        _s3(endpoint).put_object(Bucket=bucket, Key=f"tok/{k}.bin", Body=data)
    paths = f"s3://{bucket}/tok/" if named == "prefix" else [f"s3://{bucket}/tok/{k}.bin" for k in range(4)]
    w = fl.Windows.from_files(paths, dtype=np.uint16, length=64, storage_options=opts(endpoint, client=client),
                              cache_dir=tmp_path / "cache", cache_limit=2 * 8192)

    def rewrite():
        for k, data in enumerate(_tokens(2)):
            _s3(endpoint).put_object(Bucket=bucket, Key=f"tok/{k}.bin", Body=data)

    with pytest.raises(RuntimeError, match=rf"s3://{bucket}/tok/[0-3]\.bin: {CHANGED}"):
        _read_twice(w, rewrite)


def test_a_token_file_rewritten_between_epochs_is_an_error_over_http_and_gs(s3_server, s3_proxy, gcs_server,
                                                                            file_server, tmp_path):
    # http(s):// with an ETag from HEAD (public objects of the S3 server, through the proxy).
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    for k, data in enumerate(_tokens(1)):
        _s3(endpoint).put_object(Bucket=bucket, Key=f"tok/{k}.bin", Body=data, ACL="public-read")
    urls = [f"{s3_proxy.url}/{bucket}/tok/{k}.bin" for k in range(4)]
    w = fl.Windows.from_files(urls, dtype=np.uint16, length=64, storage_options={"backoff": 0.01},
                              cache_dir=tmp_path / "c1", cache_limit=2 * 8192)

    def rewrite_s3():
        for k, data in enumerate(_tokens(2)):
            _s3(endpoint).put_object(Bucket=bucket, Key=f"tok/{k}.bin", Body=data, ACL="public-read")

    with pytest.raises(RuntimeError, match=rf"http://127.0.0.1:\d+/{bucket}/tok/[0-3]\.bin: {CHANGED}"):
        _read_twice(w, rewrite_s3)

    # A server with Last-Modified only, which ignores the conditional headers: the answer's own
    # Last-Modified is held to the one seen at open.
    root, base = file_server
    for k, data in enumerate(_tokens(1)):
        (root / f"{k}.bin").write_bytes(data)
    w = fl.Windows.from_files([f"{base}/{k}.bin" for k in range(4)], dtype=np.uint16, length=64,
                              storage_options={"backoff": 0.01}, cache_dir=tmp_path / "c2", cache_limit=2 * 8192)

    def rewrite_files():
        for k, data in enumerate(_tokens(2)):
            p = root / f"{k}.bin"
            before = p.stat().st_mtime
            p.write_bytes(data)
            os.utime(p, (before + 10, before + 10))  # a new Last-Modified (its unit is the second)

    with pytest.raises(RuntimeError, match=rf"{base}/[0-3]\.bin: {CHANGED}"):
        _read_twice(w, rewrite_files)

    # gs://: the generation listed at open.
    gbucket = gcs_server.bucket()
    for k, data in enumerate(_tokens(1)):
        gcs_server.put(gbucket, f"tok/{k}.bin", data)
    w = fl.Windows.from_files(f"gs://{gbucket}/tok/", dtype=np.uint16, length=64,
                              storage_options=opts(gcs_server.url, anon=True), cache_dir=tmp_path / "c3",
                              cache_limit=2 * 8192)

    def rewrite_gs():
        for k, data in enumerate(_tokens(2)):
            gcs_server.put(gbucket, f"tok/{k}.bin", data)

    with pytest.raises(RuntimeError, match=rf"gs://{gbucket}/tok/[0-3]\.bin: {CHANGED}"):
        _read_twice(w, rewrite_gs)


def test_an_unchanged_token_file_read_over_several_epochs_is_exact(s3_server, file_server, tmp_path):
    """The pins hold still objects: every epoch of a small cache equals the local files (over a
    server that pins by ETag and one that has only Last-Modified)."""
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    root, base = file_server
    local = []
    for k, data in enumerate(_tokens(3)):
        _s3(endpoint).put_object(Bucket=bucket, Key=f"tok/{k}.bin", Body=data)
        (root / f"{k}.bin").write_bytes(data)
        local.append(str(root / f"{k}.bin"))
    here = fl.Windows.from_files(local, dtype=np.uint16, length=64)
    kw = dict(batch_size=1, shuffle=True, seed=5, num_threads=2)  # a step reads one file (the cache holds two)
    for paths, options in [(f"s3://{bucket}/tok/", opts(endpoint)), ([f"{base}/{k}.bin" for k in range(4)], {})]:
        w = fl.Windows.from_files(paths, dtype=np.uint16, length=64, storage_options=options,
                                  cache_dir=tmp_path / "c", cache_limit=2 * 8192)
        for epoch in (0, 1, 2):
            got, want = batches(fl.Loader(w, **kw), epoch), batches(fl.Loader(here, **kw), epoch)
            assert len(got) == len(want) and all(bool((a["tokens"] == b["tokens"]).all()) for a, b in zip(got, want))
        assert w.storage_stats().evictions > 0


# ------------------------------------------------------------------------------------ item 4: dataset shards
def _write(local, seed, checksum):
    rng = np.random.default_rng(seed)
    cols = {"x": rng.standard_normal((4 * 512, 4)).astype(np.float32)}
    fl.write_dataset(local, cols, rows_per_shard=512, checksum=checksum, fsync=False, overwrite=True)


def _put_shards(put, local, prefix):
    for dirpath, _, names in os.walk(local):
        for n in names:
            full = os.path.join(dirpath, n)
            with open(full, "rb") as f:
                put(f"{prefix}/{os.path.relpath(full, local)}", f.read())


@pytest.mark.parametrize("checksum", [False, True])
def test_a_shard_rewritten_under_the_same_manifest_is_an_error_naming_it(s3_server, s3_proxy, gcs_server, tmp_path,
                                                                         checksum):
    """A shard rewritten with other bytes of the same size while the manifest stays: without a
    checksum in the manifest nothing but the pin tells the bytes apart. s3:// and gs:// pin the
    version listed at open; http(s):// (no listing) pins a HEAD's where the manifest has no
    checksum, and holds the download to the checksum where it has one."""
    local, new = tmp_path / "ds", tmp_path / "new"
    _write(local, 1, checksum)
    _write(new, 2, checksum)
    endpoint = s3_server[0]
    kw = dict(batch_size=64, shuffle=False, num_threads=1)
    shard = os.path.getsize(local / "x" / "000000.npy")

    def new_shards(put, prefix):
        def rewrite():
            for k in range(4):
                put(f"{prefix}/x/{k:06d}.npy", (new / "x" / f"{k:06d}.npy").read_bytes())
        return rewrite

    cases = []
    bucket = _bucket(endpoint)
    put_s3 = functools.partial(lambda key, data, b: _s3(endpoint).put_object(Bucket=b, Key=key, Body=data,
                                                                             ACL="public-read"), b=bucket)
    _put_shards(put_s3, local, "ds")
    for client in S3_CLIENTS:
        cases.append((f"s3://{bucket}/ds", opts(endpoint, client=client), new_shards(put_s3, "ds")))
    cases.append((f"{s3_proxy.url}/{bucket}/ds", {"backoff": 0.01, "max_attempts": 2}, new_shards(put_s3, "ds")))
    gbucket = gcs_server.bucket()
    _put_shards(functools.partial(gcs_server.put, gbucket), local, "ds")
    cases.append((f"gs://{gbucket}/ds", opts(gcs_server.url, anon=True),
                  new_shards(functools.partial(gcs_server.put, gbucket), "ds")))
    for n, (url, options, rewrite) in enumerate(cases):
        _put_shards(put_s3, local, "ds")  # the old bytes again (the previous case rewrote them)
        _put_shards(functools.partial(gcs_server.put, gbucket), local, "ds")
        ds = fl.Dataset.open(url, storage_options=options, cache_dir=tmp_path / f"c{n}", cache_limit=2 * shard)
        named = rf"{url}/x/00000[0-3]\.npy"
        why = (rf"GET {named} failed after 2 attempts; last: corrupt body \({named}: checksum" if checksum and
               url.startswith("http") else rf"{named}: {CHANGED}")
        with pytest.raises(RuntimeError, match=why):
            _read_twice(ds, rewrite)


# ------------------------------------------------------------------------------------ item 5: a prefix is a folder
@pytest.mark.parametrize("client", S3_CLIENTS)
def test_a_prefix_is_a_folder_never_its_siblings(s3_server, gcs_server, tmp_path, client):
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    gbucket = gcs_server.bucket()
    mine, other = np.arange(256, dtype=np.uint16), np.full(256, 7, dtype=np.uint16)
    objects = {"tok/a.bin": mine, "tok-old/a.bin": other, "tokenizer.bin": other, "tok.bin": other}
    for key, data in objects.items():
        _s3(endpoint).put_object(Bucket=bucket, Key=key, Body=data.tobytes())
        gcs_server.put(gbucket, key, data.tobytes())
    for url, options in [(f"s3://{bucket}/tok", opts(endpoint, client=client)),
                         (f"gs://{gbucket}/tok", opts(gcs_server.url, anon=True))]:
        w = fl.Windows.from_files(url, dtype=np.uint16, length=16, storage_options=options, cache_dir=tmp_path / "c")
        assert w.files == [url + "/a.bin"], w.files
        got = np.concatenate([b["tokens"].numpy().reshape(-1) for b in batches(fl.Loader(w, batch_size=4))])
        assert np.array_equal(got, mine)
        # A URL naming an object (no folder of that name) is that object, as a local file path is.
        one = fl.Windows.from_files(url + "/a.bin", dtype=np.uint16, length=16, storage_options=options,
                                    cache_dir=tmp_path / "c")
        assert one.files == [url + "/a.bin"]
        with pytest.raises(FileNotFoundError, match="no objects under this prefix"):
            fl.Windows.from_files(url + "/none", dtype=np.uint16, length=16, storage_options=options,
                                  cache_dir=tmp_path / "c")


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_a_parquet_prefix_is_a_folder_never_its_siblings(s3_server, tmp_path, client):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    for key, start in [("tbl/part-0.parquet", 0), ("tbl2/part-0.parquet", 1000), ("tbl.parquet", 2000)]:
        pq.write_table(pa.table({"id": np.arange(start, start + 100)}), tmp_path / "t.parquet")
        _s3(endpoint).put_object(Bucket=bucket, Key=key, Body=(tmp_path / "t.parquet").read_bytes())
    source = fl.Parquet(f"s3://{bucket}/tbl", ["id"], storage_options=opts(endpoint, client=client),
                        cache_dir=tmp_path / "c")
    ids = np.concatenate([b["id"].numpy() for b in batches(fl.Loader(source, batch_size=50, device="cpu"))])
    assert sorted(ids.tolist()) == list(range(100))
    one = fl.Parquet(f"s3://{bucket}/tbl.parquet", ["id"], storage_options=opts(endpoint, client=client),
                     cache_dir=tmp_path / "c")  # one file, as a local path to a file
    ids = np.concatenate([b["id"].numpy() for b in batches(fl.Loader(one, batch_size=50, device="cpu"))])
    assert sorted(ids.tolist()) == list(range(2000, 2100))


# ------------------------------------------------------------------------------------ item 11: keys obstore cannot name
@pytest.mark.skipif(not has("obstore"), reason="obstore is not installed")
@pytest.mark.parametrize("stray", ["sub//b.bin", "sub/./b.bin", "sub/../b.bin", "/lead.bin"])
def test_a_stray_key_obstore_cannot_name_does_not_fail_a_dataset(s3_server, tmp_path, stray):
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    local = tmp_path / "ds"
    _write(local, 1, True)
    _put_shards(lambda key, data: _s3(endpoint).put_object(Bucket=bucket, Key=key, Body=data), local, "ds")
    _s3(endpoint).put_object(Bucket=bucket, Key=f"ds/{stray}", Body=b"not the dataset's")
    here = fl.Dataset.open(local)
    for client in S3_CLIENTS:
        ds = fl.Dataset.open(f"s3://{bucket}/ds", storage_options=opts(endpoint, client=client, max_attempts=2),
                             cache_dir=tmp_path / "c")
        got, want = batches(fl.Loader(ds, batch_size=100)), batches(fl.Loader(here, batch_size=100))
        assert all(bool((a["x"] == b["x"]).all()) for a, b in zip(got, want)) and len(got) == len(want)


@pytest.mark.skipif(not has("obstore"), reason="obstore is not installed")
def test_a_token_key_obstore_cannot_name_is_an_error_saying_so(s3_server, tmp_path):
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    _s3(endpoint).put_object(Bucket=bucket, Key="tok/a.bin", Body=np.arange(64, dtype=np.uint16).tobytes())
    _s3(endpoint).put_object(Bucket=bucket, Key="tok/sub//b.bin", Body=np.arange(64, dtype=np.uint16).tobytes())
    message = r"tok/sub//b\.bin: obstore cannot read a key with an empty, '\.' or '\.\.' segment.*'client': 'boto3'"
    for paths in (f"s3://{bucket}/tok/", [f"s3://{bucket}/tok/a.bin", f"s3://{bucket}/tok/sub//b.bin"]):
        with pytest.raises(ValueError, match=message):
            fl.Windows.from_files(paths, dtype=np.uint16, length=16, cache_dir=tmp_path / "c",
                                  storage_options=opts(endpoint, client="obstore", max_attempts=2))
    # boto3 names every key: both files are read.
    w = fl.Windows.from_files(f"s3://{bucket}/tok/", dtype=np.uint16, length=16, cache_dir=tmp_path / "c",
                              storage_options=opts(endpoint, client="boto3"))
    assert len(w.files) == 2 and len(batches(fl.Loader(w, batch_size=1))) == 8


# ------------------------------------------------------------------------------------ item 4: copies
@pytest.mark.parametrize("client", S3_CLIENTS)
def test_a_copy_made_after_a_rewrite_refuses_the_new_bytes(s3_server, tmp_path, client):
    """A pickled (or copied) source opened again in another process after an object was
    rewritten: the copy would read the new bytes where the original reads the old ones (DDP ranks
    that train on different data), so it is an error naming the object."""
    import copy
    import pickle

    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    options = opts(endpoint, client=client)
    for k, data in enumerate(_tokens(1)):
        _s3(endpoint).put_object(Bucket=bucket, Key=f"tok/{k}.bin", Body=data)
    local = tmp_path / "ds"
    _write(local, 1, checksum=False)
    _put_shards(lambda key, data: _s3(endpoint).put_object(Bucket=bucket, Key=key, Body=data), local, "ds")
    w = fl.Windows.from_files(f"s3://{bucket}/tok/", dtype=np.uint16, length=64, storage_options=options,
                              cache_dir=tmp_path / "c")
    ds = fl.Dataset.open(f"s3://{bucket}/ds", storage_options=options, cache_dir=tmp_path / "c")
    same_w, same_ds = pickle.loads(pickle.dumps(w)), copy.deepcopy(ds)  # nothing changed: fine
    assert same_w.files == w.files and len(same_ds) == len(ds)
    blob_w, blob_ds = pickle.dumps(w), pickle.dumps(ds)
    _s3(endpoint).put_object(Bucket=bucket, Key="tok/2.bin", Body=_tokens(2)[2])
    _write(tmp_path / "new", 2, checksum=False)  # other bytes, the same size
    _s3(endpoint).put_object(Bucket=bucket, Key="ds/x/000001.npy", Body=(tmp_path / "new/x/000001.npy").read_bytes())
    with pytest.raises(ValueError, match=rf"s3://{bucket}/tok/2\.bin: the object changed since this source was "
                                         "pickled or copied"):
        pickle.loads(blob_w)
    with pytest.raises(fl.DatasetError, match=rf"s3://{bucket}/ds/x/000001\.npy: the object changed since this "
                                              "Dataset was pickled or copied"):
        pickle.loads(blob_ds)
    with pytest.raises(fl.DatasetError, match="changed since this Dataset was pickled or copied"):
        copy.deepcopy(ds)
