"""Why gs:// and http(s):// keep hand-written clients (gcs.py, http.py) while s3:// goes through
obstore: what obstore 0.12 does against the same real servers the other tests use (the GCS
emulator, Python's file server, a redirecting server on 127.0.0.1), each a behaviour a test of
fastload requires and obstore does not give. If one of these starts failing, obstore (or the
emulator) has changed: try its client for that scheme again against the named test.

- gs://: obstore's GCS store speaks the XML API (GET /bucket/key, list-type=2 listings); the
  emulator serves the JSON API only, so every call is 501 (test_storage_gcs.py runs against it).
- http(s)://: a redirect to another origin carries the user's own headers (X-Api-Key) with
  obstore (reqwest drops Authorization and Cookie only); fastload drops every header the user
  gave (test_a_redirect_to_another_host_drops_the_users_headers_http).
- http(s)://: a ranged read of a server that ignores Range (Python's file server) is an error
  with obstore; fastload takes the whole answer and cuts the range from it
  (test_http_urls_public_objects_and_a_plain_file_server, remote Parquet's footer reads)."""
from __future__ import annotations

import functools
import http.server
import threading

import pytest

obstore = pytest.importorskip("obstore")
SECRET = "hunter2SECRETvalue9876"


class _Server:
    """Python's file server over a folder, keeping the headers of every request (names in lower case); with
    redirect_to, a 302 to that base URL (same path) for every request instead."""

    def __init__(self, root, redirect_to: str = ""):
        seen = self.seen = []

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                seen.append({k.lower(): v for k, v in self.headers.items()})
                if not redirect_to:
                    return super().do_GET()
                self.send_response(302)
                self.send_header("Location", redirect_to + self.path)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                                      functools.partial(Handler, directory=str(root)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_obstore_gcs_store_cannot_read_from_the_gcs_emulator(gcs_server):
    from obstore.exceptions import BaseError
    from obstore.store import GCSStore

    bucket = gcs_server.bucket()
    gcs_server.put(bucket, "d/a.bin", b"0123456789")
    store = GCSStore(bucket, base_url=gcs_server.url, skip_signature=True, client_options={"allow_http": True},
                     retry_config={"max_retries": 0})
    for call in (lambda: obstore.head(store, "d/a.bin"), lambda: obstore.get(store, "d/a.bin").bytes(),
                 lambda: [p for p in obstore.list(store, prefix="d")]):
        with pytest.raises(BaseError, match="501 Not Implemented"):
            call()
    # The JSON API the emulator serves (and gcs.py speaks) has the object.
    from fastload._storage.gcs import GcsClient
    from fastload._storage.urls import parse_url

    assert GcsClient({"endpoint_url": gcs_server.url, "anon": True}).get_range(parse_url(f"gs://{bucket}/d/a.bin"),
                                                                                2, 5) == b"234"


def test_obstore_http_store_sends_the_users_headers_to_another_origin(tmp_path):
    from obstore.store import HTTPStore

    (tmp_path / "a.bin").write_bytes(b"x" * 1000)
    target = _Server(tmp_path)
    hop = _Server(tmp_path, redirect_to=target.url)
    try:
        store = HTTPStore(hop.url, retry_config={"max_retries": 0},
                          client_options={"allow_http": True,
                                          "default_headers": {"Authorization": f"Bearer {SECRET}", "X-Api-Key": SECRET}})
        assert bytes(obstore.get(store, "a.bin").bytes()) == b"x" * 1000
        assert SECRET in hop.seen[0]["authorization"]
        assert target.seen and "authorization" not in target.seen[0]  # reqwest drops this one
        assert target.seen[0].get("x-api-key") == SECRET  # but not the user's own header
    finally:
        hop.close()
        target.close()


def test_obstore_http_store_cannot_range_read_a_server_that_ignores_range(tmp_path):
    from obstore.exceptions import NotSupportedError
    from obstore.store import HTTPStore

    from fastload._storage.http import HttpClient
    from fastload._storage.urls import parse_url

    (tmp_path / "a.bin").write_bytes(bytes(range(256)) * 4)
    server = _Server(tmp_path)
    try:
        store = HTTPStore(server.url, client_options={"allow_http": True}, retry_config={"max_retries": 0})
        with pytest.raises(NotSupportedError, match="Range request not supported"):
            obstore.get(store, "a.bin", options={"range": (10, 20)}).bytes()
        assert HttpClient({}).get_range(parse_url(f"{server.url}/a.bin"), 10, 20) == bytes(range(10, 20))
    finally:
        server.close()
