"""bench/s3_counting_server.py: the side-by-side benchmark's bytes-fetched figures come from its
counter, so it must count object GETs and their body bytes exactly, and nothing else."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _counts(endpoint: str, what: str = "counts") -> dict:
    with urllib.request.urlopen(f"{endpoint}/_bench/{what}", timeout=10) as r:
        return json.load(r)


def test_counts_object_gets_and_their_bytes(monkeypatch):
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    for k, v in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "s3_counting_server.py"), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ))
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
                break
            except OSError:
                time.sleep(0.05)
        c = boto3.client("s3", endpoint_url=endpoint)
        c.create_bucket(Bucket="counted")
        body = os.urandom(300_000)
        c.put_object(Bucket="counted", Key="a/b.bin", Body=body)
        assert _counts(endpoint)["gets"] == 0  # a PUT and a bucket creation are no GETs
        assert c.get_object(Bucket="counted", Key="a/b.bin")["Body"].read() == body
        assert c.get_object(Bucket="counted", Key="a/b.bin", Range="bytes=10-1009")["Body"].read() == body[10:1010]
        c.list_objects_v2(Bucket="counted", Prefix="a/")  # a listing is not an object GET
        c.head_object(Bucket="counted", Key="a/b.bin")
        got = _counts(endpoint, "reset")
        assert (got["gets"], got["get_bytes"]) == (2, len(body) + 1000)
        assert got["requests"] >= 6
        assert _counts(endpoint) == {"gets": 0, "get_bytes": 0, "requests": 0}
        _ranges_as_s3_answers_them(c, body)
    finally:
        proc.kill()
        proc.wait()


def _ranges_as_s3_answers_them(c, body: bytes) -> None:
    """The server reads a single range alone (bench/moto_ranges.py): the same answers as moto's
    own path (bytes, Content-Range, ETag, the conditions, 416), checked against slicing."""
    from botocore.exceptions import ClientError

    etag = c.head_object(Bucket="counted", Key="a/b.bin")["ETag"]
    n = len(body)
    for spec, first, last in [("bytes=0-0", 0, 0), ("bytes=5-", 5, n - 1), ("bytes=-7", n - 7, n - 1),
                              (f"bytes=1000-{n + 50}", 1000, n - 1), ("bytes=20-29", 20, 29)]:
        r = c.get_object(Bucket="counted", Key="a/b.bin", Range=spec, IfMatch=etag)
        assert r["Body"].read() == body[first:last + 1], spec
        assert r["ContentRange"] == f"bytes {first}-{last}/{n}" and r["ETag"] == etag, spec
        assert r["ResponseMetadata"]["HTTPStatusCode"] == 206
    for kwargs, status in [({"Range": "bytes=0-9", "IfMatch": '"other"'}, 412), ({"Range": f"bytes={n}-"}, 416)]:
        with pytest.raises(ClientError) as e:
            c.get_object(Bucket="counted", Key="a/b.bin", **kwargs)
        assert e.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
