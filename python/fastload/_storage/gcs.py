"""gs:// through Google Cloud Storage's JSON API (the API google-cloud-storage and gcsfs speak),
over the standard library's HTTP client, with the retry policy, errors and version checks of
the other clients (retries.py, errors.py).

Credentials: Application Default Credentials through google-auth (GOOGLE_APPLICATION_CREDENTIALS,
gcloud's application_default_credentials.json, workload identity, the metadata server), a token
refreshed before it expires and renewed when the server answers 401/403. Where
STORAGE_EMULATOR_HOST is set (Google's convention for a local emulator) requests go there,
unauthenticated, as Google's own clients do. The version tag of an object is its generation: a
GET names it (ifGenerationMatch), and the answer's generation (X-Goog-Generation) and hashes
(X-Goog-Hash) are held to the listing's where it sends them, so an object rewritten since the
listing is ObjectChanged, never its new bytes (also on a server that ignores ifGenerationMatch,
as the emulator of the tests does).

Hand-written, not obstore's GCS store, for a tested reason: obstore speaks GCS's XML API, which
the GCS emulator the gs:// tests run against (tests/test_storage_gcs.py) does not serve: every
HEAD, GET and listing is HTTP 501 (measured with obstore 0.12:
tests/test_storage_obstore_limits.py, test_obstore_gcs_store_cannot_read_from_the_gcs_emulator),
so an obstore path could not pass, or even be tested by, the gs:// tests."""
from __future__ import annotations

import io
import json
import os
import threading
import time
import urllib.parse
from typing import Any, BinaryIO, Callable, Mapping, TypeVar

from .bodies import range_total
from .client_protocol import BodyCheck, Client
from .credentials import BearerTokens, google_chain
from .errors import Refused, changed_error, refused_error
from .http import http_open, read_response
from .options import ALLOWED, check_options, setting
from .parts import configure_parts
from .retries import retry_policy
from .urls import Url

T = TypeVar("T")
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
_SCOPE = "https://www.googleapis.com/auth/devstorage.read_only"


class GcsClient(Client):
    """storage_options: `endpoint_url` (else STORAGE_EMULATOR_HOST, else storage.googleapis.com),
    `anon` (no credentials: public buckets, emulators), `token` (an OAuth2 access token, used
    as given), and the retry and concurrency settings every client takes."""

    def __init__(self, options: Mapping[str, Any]):
        opts = check_options(options, ALLOWED["gs"], "gs")
        self.policy = retry_policy(opts)
        self.concurrency = setting(opts, "max_concurrency")
        configure_parts(self, opts, "gs")  # bodies are read through Python, as boto3's (options.PART_SIZE)
        self._timeout = setting(opts, "read_timeout")
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        endpoint = opts.get("endpoint_url") or emulator or DEFAULT_ENDPOINT
        if "://" not in endpoint:  # STORAGE_EMULATOR_HOST may be host:port
            endpoint = "http://" + endpoint
        self._base = endpoint.rstrip("/")
        self._tokens: BearerTokens | None = None
        self._static: dict[str, str] = {}
        if opts.get("token") is not None:
            self._static = {"Authorization": f"Bearer {opts['token']}"}
        elif not opts.get("anon") and not (emulator and not opts.get("endpoint_url")):
            try:
                chain = google_chain([_SCOPE])
            except Exception as e:  # noqa: BLE001 - google-auth's DefaultCredentialsError and kin
                raise PermissionError(f"gs://: no Google credentials found ({type(e).__name__}): set "
                                      "GOOGLE_APPLICATION_CREDENTIALS, run `gcloud auth application-default login`, "
                                      "run on a machine with a service account, or pass storage_options={'anon': "
                                      "True} for a public bucket") from None
            if chain is None:
                raise ImportError("gs:// URLs take credentials from google-auth: pip install google-auth (or "
                                  "fastload[gcs]); or pass storage_options={'anon': True} for a public bucket")
            self._tokens = BearerTokens(chain)
        self._lock = threading.Lock()
        self.requests = 0
        self._hashes: dict[tuple[str, str, str], dict[str, str]] = {}  # (bucket, key, generation) -> hashes listed

    # ------------------------------------------------------------------ requests
    def _target(self, url: Url, media: bool, query: Mapping[str, str] | None = None) -> str:
        bucket = urllib.parse.quote(url.bucket, safe="")
        path = f"/download/storage/v1/b/{bucket}/o" if media else f"/storage/v1/b/{bucket}/o"
        if url.key or media:
            path += "/" + urllib.parse.quote(url.key, safe="")
        q = dict(query or {})
        if media:
            q["alt"] = "media"
        return self._base + path + ("?" + urllib.parse.urlencode(q) if q else "")

    def _call(self, what: str, url: Url, fn: Callable[[dict[str, str]], T]) -> T:
        """fn(headers) under the retry policy; a refusal asks the credential chain again once."""

        def once() -> T:
            for attempt in (0, 1):
                headers, generation = self._tokens.header() if self._tokens is not None else (self._static, 0)
                try:
                    return fn(headers)
                except Refused as e:
                    label = str(e).rsplit("(", 1)[-1].rstrip(")")
                    if attempt == 0 and self._tokens is not None and self._tokens.renew(generation, headers):
                        continue
                    raise refused_error(url, label, self._tokens is not None) from None
            raise AssertionError("unreachable")

        return self.policy.run(what, url, once)

    def _json(self, what: str, url: Url, target: str) -> Any:
        def fn(headers: dict[str, str]) -> Any:
            body = io.BytesIO()
            started = time.monotonic()
            with http_open(target, "GET", headers, self._timeout, url) as r:
                read_response(r, body, None, url, None, started, self._timeout)
            return json.loads(body.getvalue())

        return self._call(what, url, fn)

    def _listed(self, url: Url, item: Mapping[str, Any]) -> tuple[int, str]:
        """(bytes, generation) of a listed object; its hashes kept for the answers' check."""
        generation = str(item.get("generation", ""))
        hashes = {k: str(item[f]) for k, f in (("md5", "md5Hash"), ("crc32c", "crc32c")) if item.get(f)}
        if generation and hashes:
            with self._lock:
                self._hashes[(url.bucket, url.key, generation)] = hashes
        return int(item["size"]), generation

    def _check_answer(self, r: Any, url: Url, version: str | None) -> None:
        """The answer is of generation `version`: its X-Goog-Generation, and its X-Goog-Hash
        against the hashes listed with that generation."""
        if not version:
            return
        sent = r.headers.get("X-Goog-Generation")
        if sent and sent != version:
            raise changed_error(url, version)
        with self._lock:
            listed = self._hashes.get((url.bucket, url.key, version))
        if listed and r.headers.get("X-Goog-Hash"):
            got = dict(part.strip().split("=", 1) for part in r.headers["X-Goog-Hash"].split(",") if "=" in part)
            if any(got.get(k) not in (None, v) for k, v in listed.items()):
                raise changed_error(url, version)

    # ------------------------------------------------------------------ Client
    def list(self, prefix: Url) -> list[tuple[Url, int, str]]:
        out: list[tuple[Url, int, str]] = []
        prefix = prefix.child("")  # a folder: "tok/", never "tok-old/" or "tokenizer.bin"
        query = {"prefix": prefix.key, "fields": "items(name,size,generation,md5Hash,crc32c),nextPageToken"}
        while True:
            page = self._json("listing", prefix, self._target(prefix._replace(key=""), False, query))
            for o in page.get("items", []):
                url = prefix._replace(key=o["name"])
                out.append((url, *self._listed(url, o)))
            token = page.get("nextPageToken")
            if not token:
                break
            query["pageToken"] = token
        return sorted(out, key=lambda t: t[0].key)

    def stat(self, url: Url) -> tuple[int, str]:
        meta = self._json("HEAD", url, self._target(url, False, {"fields": "size,generation,md5Hash,crc32c"}))
        return self._listed(url, meta)

    def _get(self, url: Url, out: BinaryIO, expected: int | None, check: BodyCheck | None, version: str | None,
             range_: str | None, answer: dict | None = None) -> int:
        target = self._target(url, True, {"ifGenerationMatch": version} if version else None)

        def fn(headers: dict[str, str]) -> int:
            with self._lock:
                self.requests += 1
            more = {**headers, "Range": range_} if range_ else headers
            started = time.monotonic()
            with http_open(target, "GET", more, self._timeout, url, version) as r:
                self._check_answer(r, url, version)
                if answer is not None:
                    answer["total"] = range_total(r.headers.get("Content-Range"))
                return read_response(r, out, expected, url, check, started, self._timeout)

        return self._call("GET", url, fn)

    def get_whole(self, url: Url, out: BinaryIO, expected: int | None = None,
                  check: BodyCheck | None = None, version: str | None = None) -> int:
        return self._get(url, out, expected, check, version, None)

    def read_range(self, url: Url, start: int, end: int, version: str | None = None) -> tuple[Any, int | None]:
        buf, answer = io.BytesIO(), {}
        self._get(url, buf, end - start, None, version, f"bytes={start}-{end - 1}", answer)
        return buf.getbuffer(), answer["total"]
