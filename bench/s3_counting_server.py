"""moto's S3 server (the tests' server) with a counter of what it serves, for bench/remote_peers.py:
every loader of the side-by-side benchmark reads from the same server, so the bytes it fetched are
counted where they leave, whatever client the loader uses and however many processes it starts.

    python bench/s3_counting_server.py PORT

Ranged GETs read only their bytes (moto_ranges.py), as S3 does.

GET /_bench/counts answers JSON: object GETs (a GET of /bucket/key), their body bytes, and all
requests; GET /_bench/reset zeroes them. The counter only wraps the body iterator, so it adds no
copy. Loopback only."""
from __future__ import annotations

import json
import sys
import threading


class Counting:
    """WSGI middleware: counts object GETs and the bytes of their bodies."""

    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()
        self.counts = {"gets": 0, "get_bytes": 0, "requests": 0}

    def __call__(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_bench/"):
            with self.lock:
                body = json.dumps(self.counts).encode()
                if path == "/_bench/reset":
                    self.counts = dict.fromkeys(self.counts, 0)
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        # Path-style addressing (every client here talks to 127.0.0.1): /bucket/key is an object,
        # /bucket?list-type=2 a listing.
        is_object_get = environ["REQUEST_METHOD"] == "GET" and len(path.lstrip("/").split("/", 1)) == 2 \
            and not path.endswith("/")
        with self.lock:
            self.counts["requests"] += 1
            if is_object_get:
                self.counts["gets"] += 1
        result = self.app(environ, start_response)
        if not is_object_get:
            return result
        return self._counted(result)

    def _counted(self, result):
        n = 0
        try:
            for chunk in result:
                n += len(chunk)
                yield chunk
        finally:
            if hasattr(result, "close"):
                result.close()
            with self.lock:
                self.counts["get_bytes"] += n


def main() -> None:
    import logging

    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import make_server

    import moto_ranges  # this folder is on sys.path (the script's own)

    moto_ranges.patch()  # a ranged GET reads its bytes only, as S3 does (see moto_ranges.py)

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request would cost more than the count
    port = int(sys.argv[1])
    app = Counting(DomainDispatcherApplication(create_backend_app))
    make_server("127.0.0.1", port, app, threaded=True).serve_forever()


if __name__ == "__main__":
    main()
