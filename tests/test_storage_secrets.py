"""Credentials go nowhere but to the server they are for, against the real servers of the tests
(moto's S3 server, the GCS emulator, Python's file server, the proxy of tests/s3_proxy.py): a URL
with a user name or password is refused for every scheme and entry point, before any request and
without repeating the secret; a redirect to another origin carries no Authorization, cookie or
header of the user's; botocore's debug log of fastload's requests (which holds the session
token) is not printed under a root logger at DEBUG."""
from __future__ import annotations

import functools
import http.server
import logging
import threading
import uuid

import numpy as np
import pytest

import fastload as fl
from remote_helpers import S3_CLIENTS, batches, opts, small_dataset, upload_dir

boto3 = pytest.importorskip("boto3")

SECRET = "hunter2SECRETvalue9876"


def _s3(endpoint):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")


def _bucket(endpoint) -> str:
    name = f"s-{uuid.uuid4().hex[:12]}"
    _s3(endpoint).create_bucket(Bucket=name)
    return name


class _Server:
    """A server on 127.0.0.1 that keeps the headers of every request: Python's file server over
    a folder, or (redirect_to) one that answers every request with a 302 to another base URL
    (same path), except paths under /here/, which it redirects to itself without that prefix."""

    def __init__(self, root=None, redirect_to: str = ""):
        seen = self.seen = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _redirect(self):
                if self.path.startswith("/here/"):  # within the origin: the headers stay
                    target = f"http://127.0.0.1:{self.server.server_address[1]}/again{self.path[len('/here'):]}"
                else:
                    target = redirect_to + self.path.removeprefix("/again")
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                seen.append(dict(self.headers.items()))
                return self._redirect() if redirect_to else super().do_GET()

            def do_HEAD(self):
                seen.append(dict(self.headers.items()))
                return self._redirect() if redirect_to else super().do_HEAD()

        handler = functools.partial(Handler, directory=str(root or "."))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------ item 8: user information
def _entry_points(url: str, options: dict, cache):
    yield "Dataset.open", lambda: fl.Dataset.open(url, storage_options=options, cache_dir=cache)
    yield "Windows.from_files", lambda: fl.Windows.from_files(url, dtype=np.uint16, length=4, storage_options=options,
                                                              cache_dir=cache)
    yield "Windows.from_files([...])", lambda: fl.Windows.from_files([url], dtype=np.uint16, length=4,
                                                                     storage_options=options, cache_dir=cache)
    yield "Tar", lambda: fl.Tar(url, storage_options=options, cache_dir=cache)
    yield "ImageFolder", lambda: fl.ImageFolder(url, image=fl.Image(8), storage_options=options, cache_dir=cache)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return
    yield "Parquet", lambda: fl.Parquet(url, storage_options=options, cache_dir=cache)
    yield "Parquet([...])", lambda: fl.Parquet([url], storage_options=options, cache_dir=cache)


@pytest.mark.parametrize("form", ["s3://KEY:{s}@{b}/ds", "S3://KEY:{s}@{b}/ds", "s3://{s}@{b}/ds", "gs://KEY:{s}@{b}/ds",
                                  "gcs://KEY:{s}@{b}/ds", "http://user:{s}@{host}/{b}/ds",
                                  "HTTPS://:{s}@{host}/{b}/ds", "az://user:{s}@account/ds",
                                  "ftp://user:{s}@{host}/ds",
                                  # AWS secret keys hold "/": the authority then ends inside the secret
                                  "s3://KEY:ab/{s}@{b}/ds", "gs://KEY:ab/{s}@{b}/ds", "http://user:ab/{s}@{host}/{b}/ds"])
def test_a_url_with_user_information_is_refused_everywhere_without_its_secret(s3_server, s3_proxy, tmp_path, form):
    bucket = _bucket(s3_server[0])
    url = form.format(s=SECRET, b=bucket, host=f"127.0.0.1:{s3_proxy.port}")
    options = opts(s3_proxy.url) if url.lower().startswith(("s3", "gs", "gcs")) else {}
    if url.startswith(("gs", "gcs")):
        options["anon"] = True
    want = ("not supported yet" if url.startswith("az") else "unknown URL scheme" if url.startswith("ftp") else
            "with a user name or password is refused")
    for name, call in _entry_points(url, options, tmp_path / "c"):
        with pytest.raises(ValueError, match=want) as info:
            call()
        text = str(info.value) + repr(info.value) + str(info.value.__cause__) + str(info.value.__context__)
        assert SECRET not in text, (name, text)
    assert s3_proxy.requests == 0  # nothing was sent anywhere


def test_an_endpoint_url_with_user_information_is_refused(s3_proxy):
    with pytest.raises(ValueError, match=r"storage_options\['endpoint_url'\] with a user name or password") as info:
        fl.Dataset.open("s3://bucket/ds", storage_options={"endpoint_url": f"http://u:{SECRET}@127.0.0.1:{s3_proxy.port}"})
    assert SECRET not in str(info.value)
    assert s3_proxy.requests == 0


# ------------------------------------------------------------------------------------ item 9: redirects
def test_a_redirect_to_another_host_drops_the_users_headers_http(tmp_path):
    """http(s)://: a 302 to another origin (here another port) is followed without Authorization,
    Cookie or the user's own headers; one within the origin keeps them. Token files read through
    both equal the local files."""
    data = np.arange(4096, dtype=np.uint16)
    (tmp_path / "tok.bin").write_bytes(data.tobytes())
    target = _Server(tmp_path)
    hop = _Server(redirect_to=target.url)
    headers = {"Authorization": f"Bearer {SECRET}", "Cookie": f"session={SECRET}", "X-Api-Key": SECRET}
    try:
        for path in ("/tok.bin", "/here/tok.bin"):
            hop.seen.clear()
            target.seen.clear()
            w = fl.Windows.from_files([hop.url + path], dtype=np.uint16, length=64,
                                      storage_options={"headers": headers, "backoff": 0.01},
                                      cache_dir=tmp_path / f"c{len(path)}")
            got = np.concatenate([b["tokens"].numpy().reshape(-1) for b in batches(fl.Loader(w, batch_size=8))])
            assert np.array_equal(got, data)
            assert hop.seen and all(SECRET in h.get("Authorization", "") for h in hop.seen)  # the same origin keeps them
            assert target.seen  # HEAD and GET were redirected there
            assert not [h for h in target.seen if SECRET in repr(h)], target.seen
    finally:
        hop.close()
        target.close()


def test_a_redirect_to_another_host_drops_the_gcs_token(gcs_server, tmp_path):
    """gs://: a static token (storage_options['token']) is not sent to the host a download is
    redirected to."""
    from s3_proxy import S3Proxy

    bucket = gcs_server.bucket()
    data = np.arange(2048, dtype=np.uint16)
    gcs_server.put(bucket, "tok/a.bin", data.tobytes())
    front, other = S3Proxy(gcs_server.port), S3Proxy(gcs_server.port)
    try:
        front.arm("redirect", match="alt=media", times=100, to=other.url)
        w = fl.Windows.from_files(f"gs://{bucket}/tok/", dtype=np.uint16, length=64, cache_dir=tmp_path / "c",
                                  storage_options=opts(front.url, token=SECRET))
        got = np.concatenate([b["tokens"].numpy().reshape(-1) for b in batches(fl.Loader(w, batch_size=8))])
        assert np.array_equal(got, data)
        assert any(SECRET in h.get("Authorization", "") for h in front.headers)
        assert other.headers and not [h for h in other.headers if SECRET in repr(h)], other.headers
    finally:
        front.close()
        other.close()


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_a_redirect_to_another_host_carries_no_s3_signature(s3_server, tmp_path, client):
    """s3://: boto3 does not follow a 302 (an error naming the URL); obstore follows it without
    the signed Authorization header (which another host could replay)."""
    from s3_proxy import S3Proxy

    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    _s3(endpoint).put_object(Bucket=bucket, Key="tok/a.bin", Body=np.arange(256, dtype=np.uint16).tobytes())
    front, other = S3Proxy(s3_server[1]), S3Proxy(s3_server[1])
    try:
        front.arm("redirect", match="/tok/a.bin", times=100, to=other.url)
        try:
            w = fl.Windows.from_files(f"s3://{bucket}/tok/", dtype=np.uint16, length=16, cache_dir=tmp_path / "c",
                                      storage_options=opts(front.url, client=client, max_attempts=1))
            batches(fl.Loader(w, batch_size=4))
        except (OSError, RuntimeError):
            pass  # refused or failed: either way, what reached the other host is what matters
        signed = [h for h in other.headers if "Authorization" in h or "X-Amz-Security-Token" in h]
        assert not signed, signed
    finally:
        front.close()
        other.close()


# ------------------------------------------------------------------------------------ item 14: third-party logs
@pytest.mark.parametrize("client", S3_CLIENTS)
def test_botocore_debug_log_of_fastloads_requests_shows_no_credential(s3_server, tmp_path, monkeypatch, client):
    token = "SESSIONtoken" + uuid.uuid4().hex
    monkeypatch.setenv("AWS_SESSION_TOKEN", token)
    endpoint = s3_server[0]
    bucket = _bucket(endpoint)
    local = tmp_path / "ds"
    small_dataset(local, width=4, seed=1)
    upload_dir(_s3(endpoint), bucket, "ds", local)
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    root = logging.getLogger()
    keep, level = Keep(logging.DEBUG), root.level
    root.addHandler(keep)
    root.setLevel(logging.DEBUG)
    try:
        ds = fl.Dataset.open(f"s3://{bucket}/ds", storage_options=opts(endpoint, client=client),
                             cache_dir=tmp_path / "c", cache_limit=10_000)  # 3 of 8 shards: GETs in every epoch
        for epoch in (0, 1):
            batches(fl.Loader(ds, batch_size=100, num_threads=2), epoch)
        ours = "\n".join(keep.format(r) for r in records)
        # The program's own boto3 calls log as configured (the token included: botocore's own output).
        mine = boto3.session.Session().client("s3", endpoint_url=endpoint, region_name="us-east-1")  # with the token
        mine.list_objects_v2(Bucket=bucket)
        theirs = "\n".join(keep.format(r) for r in records)
    finally:
        root.removeHandler(keep)
        root.setLevel(level)
    assert token not in ours and "SECRETsecretSECRET0123456789" not in ours
    assert token in theirs  # the filter is fastload's calls only, not a global silence
