"""gs:// URLs against a real GCS JSON API server on 127.0.0.1 (gcp-storage-emulator, started by
the gcs_server fixture), with the fault proxy of tests/s3_proxy.py in front of it for faults and
refused credentials: batches read from gs:// equal those of the same data read locally; faults
are retried; errors name the URL; credentials come from google-auth's chain and are renewed when
the server refuses them."""
from __future__ import annotations

import http.server
import json
import pickle
import threading

import numpy as np
import pytest

import fastload as fl
from remote_helpers import batches as _batches, equal as _equal, opts

pytest.importorskip("gcp_storage_emulator")


def _opts(endpoint, **more):
    return opts(endpoint, anon=True, **more)


@pytest.fixture
def gcs_dir(gcs_server, tmp_path):
    """A dataset directory of 8 shards written locally and uploaded: (url, local path)."""
    rng = np.random.default_rng(17)
    n = 1000
    cols = {"x": rng.standard_normal((n, 8)).astype(np.float32), "y": np.arange(n, dtype=np.int64)}
    local = tmp_path / "ds"
    fl.write_dataset(local, cols, rows_per_shard=125, fsync=False)
    bucket = gcs_server.bucket()
    gcs_server.put_dir(bucket, "data/ds", local)
    return f"gs://{bucket}/data/ds", str(local)


@pytest.fixture
def gcs_tokens(gcs_server, tmp_path):
    bucket = gcs_server.bucket()
    rng = np.random.default_rng(5)
    paths = []
    for k, n in enumerate([3000, 1001, 4444]):
        p = tmp_path / f"tok{k}.bin"
        rng.integers(0, 50000, n, dtype=np.uint16).tofile(p)
        paths.append(str(p))
        gcs_server.put(bucket, f"tokens/part-{k:03d}.bin", p.read_bytes())
    return f"gs://{bucket}/tokens/", paths


@pytest.mark.parametrize("order", ["random", "block"])
def test_gs_dataset_batches_equal_local(gcs_dir, gcs_server, tmp_path, order):
    url, local = gcs_dir
    remote = fl.Dataset.open(url, storage_options=_opts(gcs_server.url), cache_dir=tmp_path / "cache")
    here = fl.Dataset.open(local)
    assert len(remote) == len(here) and remote.names == here.names and remote.shard_rows == here.shard_rows
    kw = dict(batch_size=64, shuffle=True, seed=3, order=order, num_threads=2, with_index=True)
    for epoch in (0, 1):
        _equal(_batches(fl.Loader(remote, **kw), epoch), _batches(fl.Loader(here, **kw), epoch))
    for rank in range(2):
        kw = dict(batch_size=50, shuffle=True, seed=5, rank=rank, world_size=2, num_threads=2)
        _equal(_batches(fl.Loader(remote, **kw)), _batches(fl.Loader(here, **kw)))
    # gcs:// is the same scheme (fsspec's spelling), and a pickle reopens by URL.
    again = fl.Dataset.open(url.replace("gs://", "gcs://"), storage_options=_opts(gcs_server.url),
                            cache_dir=tmp_path / "cache")
    back = pickle.loads(pickle.dumps(again))
    _equal(_batches(fl.Loader(back, batch_size=100)), _batches(fl.Loader(here, batch_size=100)))


def test_gs_windows_prefix_and_list_equal_local(gcs_tokens, gcs_server, tmp_path):
    prefix, paths = gcs_tokens
    here = fl.Windows.from_files(paths, dtype=np.uint16, length=65, stride=64)
    listed = fl.Windows.from_files(prefix, dtype=np.uint16, length=65, stride=64,
                                   storage_options=_opts(gcs_server.url), cache_dir=tmp_path / "c1",
                                   cache_limit=(4444 + 3000) * 2)  # below the three files: evictions
    urls = [f"{prefix}part-{k:03d}.bin" for k in range(3)]
    named = fl.Windows.from_files(urls, dtype=np.uint16, length=65, stride=64, storage_options=_opts(gcs_server.url),
                                  cache_dir=tmp_path / "c2")
    kw = dict(batch_size=1, shuffle=True, seed=2, num_threads=2)  # a step reads one file (the cache holds two)
    for epoch in (0, 1):
        reference = _batches(fl.Loader(here, **kw), epoch)
        _equal(_batches(fl.Loader(listed, **kw), epoch), reference)
        _equal(_batches(fl.Loader(named, **kw), epoch), reference)
    assert listed.storage_stats().evictions > 0


def test_storage_emulator_host_is_used_unauthenticated(gcs_dir, gcs_server, tmp_path, monkeypatch):
    url, local = gcs_dir
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"127.0.0.1:{gcs_server.port}")
    ds = fl.Dataset.open(url, cache_dir=tmp_path / "cache")  # no storage_options: Google's convention
    _equal(_batches(fl.Loader(ds, batch_size=100)), _batches(fl.Loader(fl.Dataset.open(local), batch_size=100)))


@pytest.mark.parametrize("kind", ["reset", "503", "truncate", "corrupt"])
def test_gs_faults_are_retried(gcs_dir, gcs_proxy, tmp_path, kind):
    url, local = gcs_dir
    gcs_proxy.arm(kind, match=".npy", times=3)
    ds = fl.Dataset.open(url, storage_options=_opts(gcs_proxy.url), cache_dir=tmp_path / "cache")
    _equal(_batches(fl.Loader(ds, batch_size=100, shuffle=True, seed=1, num_threads=2)),
           _batches(fl.Loader(fl.Dataset.open(local), batch_size=100, shuffle=True, seed=1)))
    assert all(f.times == 0 for f in gcs_proxy.faults)  # every fault fired and was retried


def test_gs_errors_name_the_url(gcs_dir, gcs_server, gcs_proxy, tmp_path):
    url, _ = gcs_dir
    with pytest.raises(FileNotFoundError, match=r"gs://.*/nothing/manifest.json: no such object"):
        fl.Dataset.open(url.rsplit("/", 1)[0] + "/nothing", storage_options=_opts(gcs_server.url), cache_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no objects under this prefix"):
        fl.Windows.from_files(url + "/none/", dtype=np.uint8, length=2, storage_options=_opts(gcs_server.url),
                              cache_dir=tmp_path)
    gcs_proxy.arm("403", match="manifest.json", times=1)
    with pytest.raises(PermissionError, match=r"gs://.*manifest.json: access denied \(HTTP 403"):
        fl.Dataset.open(url, storage_options=_opts(gcs_proxy.url), cache_dir=tmp_path)
    gcs_proxy.arm("503", match=".npy", times=100_000)  # more than prefetch and demand together try
    ds = fl.Dataset.open(url, storage_options=_opts(gcs_proxy.url, max_attempts=3), cache_dir=tmp_path / "c")
    with pytest.raises(RuntimeError, match=r"GET gs://.*\.npy failed after 3 attempts; last: HTTP 503"):
        _batches(fl.Loader(ds, batch_size=100))
    with pytest.raises(ValueError, match="gs:// does not take.*'region_name'"):
        fl.Dataset.open(url, storage_options={"region_name": "x"})


def test_gs_dataset_missing_or_resized_shards_are_errors_at_open(gcs_server, tmp_path):
    """One listing at open, as for s3://: a shard the manifest names that is missing, or of
    another size, is an error naming its URL before any batch."""
    import os

    from fastload._sources.manifest import DatasetError

    local = tmp_path / "ds"
    fl.write_dataset(local, {"x": np.arange(1000, dtype=np.float32).reshape(500, 2)}, rows_per_shard=100, fsync=False)
    shard = os.path.join("x", "000003.npy")
    for broken, error, message in [(None, FileNotFoundError, r"x/000003\.npy: no such object \(the manifest names it\)"),
                                   (b"\0" * 10, DatasetError, r"x/000003\.npy: \d+ bytes in storage, the manifest expects")]:
        bucket = gcs_server.bucket()
        for dirpath, _, names in os.walk(local):
            for n in names:
                rel = os.path.relpath(os.path.join(dirpath, n), local)
                with open(os.path.join(dirpath, n), "rb") as f:
                    data = f.read()
                if rel == shard and broken is None:
                    continue
                gcs_server.put(bucket, f"ds/{rel}", data + (broken or b"") if rel == shard else data)
        with pytest.raises(error, match=rf"gs://{bucket}/ds/" + message):
            fl.Dataset.open(f"gs://{bucket}/ds", storage_options=_opts(gcs_server.url), cache_dir=tmp_path / "c")


# ------------------------------------------------------------------------------------ credentials
class _TokenServer:
    """An OAuth2 token endpoint on 127.0.0.1 (what google-auth's authorized_user credentials call
    to refresh): hands out tok-1, tok-2, ... or the same token again (`same=True`)."""

    def __init__(self):
        self.calls = 0
        self.same = False
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.calls += 1
                n = 1 if server.same else server.calls
                body = json.dumps({"access_token": f"tok-{n}", "expires_in": 3600, "token_type": "Bearer"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def adc(tmp_path, monkeypatch):
    """Application Default Credentials from GOOGLE_APPLICATION_CREDENTIALS: a service account key
    file (a fresh RSA key) whose token endpoint is a local one. The secret to look for in output
    is the private key."""
    pytest.importorskip("google.auth")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    secret = pem.splitlines()[5]  # a line of the private key
    tokens = _TokenServer()
    path = tmp_path / "adc.json"
    path.write_text(json.dumps({"type": "service_account", "project_id": "test", "private_key_id": "k1",
                                "private_key": pem, "client_email": "loader@test.iam.gserviceaccount.com",
                                "client_id": "1", "token_uri": tokens.url}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    try:
        yield tokens, secret
    finally:
        tokens.close()


def test_gs_token_refused_mid_run_is_renewed(gcs_dir, gcs_proxy, tmp_path, adc, capfd):
    tokens, secret = adc
    url, local = gcs_dir
    opts = {"endpoint_url": gcs_proxy.url, "backoff": 0.01}
    # A cache of 3 of the 8 shards, read in order: downloads go on after the token is refused.
    ds = fl.Dataset.open(url, storage_options=opts, cache_dir=tmp_path / "cache", cache_limit=3 * 5300)
    kw = dict(batch_size=50, num_threads=2)
    reference = _batches(fl.Loader(fl.Dataset.open(local), **kw))
    got = []
    with fl.Loader(ds, **kw) as loader:
        for k, batch in enumerate(loader):
            got.append({n: v.clone() for n, v in batch.items()})
            if k == 3:
                gcs_proxy.expire("Bearer tok-1", status=401, code="")  # the server no longer takes tok-1
    _equal(got, reference)
    assert gcs_proxy.refused > 0 and tokens.calls >= 2
    out, err = capfd.readouterr()
    assert secret not in out + err and "tok-" not in out + err


def test_gs_token_refused_with_no_new_one_is_a_clear_error(gcs_dir, gcs_proxy, tmp_path, adc):
    tokens, secret = adc
    url, _ = gcs_dir
    tokens.same = True  # the chain keeps answering with the refused token
    gcs_proxy.expire("Bearer tok-1", status=401, code="")
    with pytest.raises(PermissionError) as info:
        fl.Dataset.open(url, storage_options={"endpoint_url": gcs_proxy.url}, cache_dir=tmp_path)
    text = str(info.value)
    assert "manifest.json" in text and "no new credentials" in text
    assert secret not in text and "tok-1" not in text and info.value.__cause__ is None
