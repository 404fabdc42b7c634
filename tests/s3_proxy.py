"""A small HTTP proxy between the loader and the S3 server of the tests (moto on 127.0.0.1): it
forwards every request, counts GETs per path, keeps every request's headers, and injects the
faults a test arms: connection resets, 503 SlowDown, truncated or corrupted bodies, delays, bodies
trickled 64 bytes at a time, redirects to another proxy. Loopback only; each armed fault
fires a bounded number of times."""
from __future__ import annotations

import http.client
import http.server
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass


@dataclass
class Fault:
    kind: str  # "reset", "503", "500", "truncate", "corrupt", "delay", "404", "403", "trickle", "redirect"
    match: str = ""  # substring of the request path ("" : any); only GETs of objects
    times: int = 1  # how many requests it hits (then it is spent)
    delay: float = 0.0  # "delay": before the answer; "trickle": between two pieces of 64 bytes
    code: str = ""  # the error code of an HTTP error (default: the usual one for its status)
    to: str = ""  # "redirect": the base URL (another proxy) the 302 sends the request to
    piece: int = 64  # "trickle": bytes written at a time


class S3Proxy:
    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.gets: Counter[str] = Counter()  # object GETs per path (listing and HEAD excluded)
        self.log: list[str] = []  # the paths of object GETs in the order they arrived
        self.ranged: Counter[str] = Counter()  # of which with a Range header
        self.requests = 0
        self.in_flight = 0  # object GETs being served now, and the most at once
        self.peak_in_flight = 0
        self.faults: list[Fault] = []
        # Credentials the server no longer takes: a substring of the Authorization header (an AWS
        # access key id, a bearer token) -> (status, error code); see expire().
        self.expired: dict[str, tuple[int, str]] = {}
        self.refused = 0  # requests answered so
        self.headers: list[dict[str, str]] = []  # the headers of every request received, in order
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _forward(self):
                method = self.command
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                path = self.path
                is_object_get = method == "GET" and path.count("/") >= 2 and (
                    "?" not in path.split("/")[-1] or "alt=media" in path)  # S3, or a GCS JSON API download
                fault = None
                with proxy.lock:
                    proxy.requests += 1
                    proxy.headers.append(dict(self.headers.items()))
                    if is_object_get:
                        proxy.gets[path.split("?")[0]] += 1
                        proxy.log.append(path.split("?")[0])
                        if self.headers.get("Range"):
                            proxy.ranged[path.split("?")[0]] += 1
                        for f in proxy.faults:
                            if f.times > 0 and f.match in path:
                                f.times -= 1
                                fault = f
                                break
                if is_object_get:
                    with proxy.lock:
                        proxy.in_flight += 1
                        proxy.peak_in_flight = max(proxy.peak_in_flight, proxy.in_flight)
                try:
                    self._serve(method, path, body, fault)
                finally:
                    if is_object_get:
                        with proxy.lock:
                            proxy.in_flight -= 1

            def _serve(self, method, path, body, fault):
                auth = self.headers.get("Authorization", "")
                with proxy.lock:
                    refusal = next((v for k, v in proxy.expired.items() if k in auth), None)
                    proxy.refused += refusal is not None
                if refusal is not None:
                    fault = Fault(str(refusal[0]), code=refusal[1])
                if fault is not None and fault.kind == "reset":
                    # RST instead of FIN: the client sees "connection reset by peer".
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.connection.close()
                    self.close_connection = True
                    return
                if fault is not None and fault.kind in ("503", "500", "404", "403", "401"):
                    code = int(fault.kind)
                    name = fault.code or {503: "SlowDown", 500: "InternalError", 404: "NoSuchKey", 403: "AccessDenied",
                                          401: "Unauthorized"}[code]
                    xml = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{name}</Code>"
                           f"<Message>injected</Message></Error>").encode()
                    self.send_response(code)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(xml)))
                    self.end_headers()
                    self.wfile.write(xml)
                    return
                if fault is not None and fault.kind == "redirect":
                    self.send_response(302)
                    self.send_header("Location", fault.to + path)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if fault is not None and fault.kind == "delay":
                    time.sleep(fault.delay)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection",)}
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                try:
                    conn.request(method, path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    self.send_response(resp.status)
                    for k, v in resp.getheaders():
                        if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                            self.send_header(k, v)
                    # A HEAD answer has no body: its Content-Length is the object's, from upstream.
                    length = resp.getheader("Content-Length", "0") if method == "HEAD" else str(len(data))
                    self.send_header("Content-Length", length)
                    self.end_headers()
                    if method == "HEAD":
                        return
                    if fault is not None and fault.kind == "truncate" and len(data) > 1:
                        self.wfile.write(data[:len(data) // 2])
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if fault is not None and fault.kind == "trickle":
                        for at in range(0, len(data), fault.piece):  # every read of the client gets a little
                            self.wfile.write(data[at:at + fault.piece])
                            self.wfile.flush()
                            time.sleep(fault.delay)
                        return
                    if fault is not None and fault.kind == "corrupt" and data:
                        data = bytearray(data)
                        data[-1] ^= 0xFF
                        data = bytes(data)
                    self.wfile.write(data)
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        # A client that gave up (a timeout, a killed process) leaves a handler writing to a closed
        # socket: expected here, not worth a traceback.
        self.server.handle_error = lambda request, client_address: None
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="s3-proxy")
        self.thread.start()

    def arm(self, kind: str, match: str = "", times: int = 1, delay: float = 0.0, to: str = "",
            piece: int = 64) -> Fault:
        f = Fault(kind, match, times, delay, to=to, piece=piece)
        with self.lock:
            self.faults.append(f)
        return f

    def expire(self, credential: str, status: int = 403, code: str = "ExpiredToken") -> None:
        """From now on, requests whose Authorization header holds `credential` (an access key id,
        a token) are refused with `status` and `code`, as a server refuses expired credentials."""
        with self.lock:
            self.expired[credential] = (status, code)

    def reset_counts(self) -> None:
        with self.lock:
            self.gets.clear()
            self.log.clear()
            self.ranged.clear()
            self.requests = 0
            self.headers.clear()
            self.peak_in_flight = 0
            self.faults.clear()

    def total_gets(self) -> int:
        with self.lock:
            return sum(self.gets.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
