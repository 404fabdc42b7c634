"""A deadline for each GET's body: `read_timeout` plus one second per MiB of the body. A socket's
timeout bounds each read only, so a server that trickles a body (64 bytes every 0.25 s) held a
GET for as long as it liked; a body that misses its deadline has its connection cut (the socket
shut down from a watcher thread, which wakes the reading thread at once) and is retried, and
after the budget the error names the URL and the deadline. obstore needs none of this: its
client's timeout already covers the whole request (docs/object-storage.md)."""
from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from typing import Any, Callable, Iterator

MIN_RATE = 1 << 20  # bytes per second a body must average beyond its first read_timeout seconds


def body_limit(read_timeout: float, size: int | None) -> float:
    """Seconds a GET of a body of `size` bytes may take, from sending it to the body's last byte."""
    return read_timeout + max(0, size or 0) / MIN_RATE


class Watch:
    """One GET being watched: `fired` once its connection was cut for missing the deadline."""

    __slots__ = ("when", "cut", "fired", "limit")

    def __init__(self, when: float, cut: Callable[[], None] | None, limit: float):
        self.when, self.cut, self.fired, self.limit = when, cut, False, limit

    @property
    def label(self) -> str:
        return (f"the body was not complete within {self.limit:.1f} s (read_timeout plus 1 s per MiB): the server "
                "sends it too slowly")


class _Watcher:
    """The process's one watcher thread (a daemon, started with the first GET watched, idle on a
    condition when there is nothing to watch): cuts the connections of the GETs past their
    deadlines. A forked child starts with none of its parent's GETs and no thread."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        # In a forked child too: the parent's GETs (whose sockets the child shares) are not the
        # child's to cut, and the lock may have been held by a thread that the child lacks.
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Watch]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._done = 0  # GETs in the heap that ended before their deadline

    def add(self, watch: Watch) -> None:
        with self._cond:
            heapq.heappush(self._heap, (watch.when, next(self._order), watch))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="fastload-deadline")
                self._thread.start()
            self._cond.notify()

    def remove(self, watch: Watch) -> bool:
        """Stops watching; True if the deadline had already cut the connection."""
        with self._cond:
            if not watch.fired:
                watch.cut = None  # left in the heap: skipped when it comes up
                self._done += 1
                if self._done > 1024 and 2 * self._done > len(self._heap):  # many small GETs: keep it small
                    self._heap = [e for e in self._heap if e[2].cut is not None]
                    heapq.heapify(self._heap)
                    self._done = 0
            return watch.fired

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].cut is None:
                    heapq.heappop(self._heap)
                    self._done = max(0, self._done - 1)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                watch = heapq.heappop(self._heap)[2]
                cut, watch.cut, watch.fired = watch.cut, None, True
            try:
                cut()  # type: ignore[misc]
            except OSError:
                pass  # the connection ended meanwhile


_WATCHER = _Watcher()
os.register_at_fork(after_in_child=_WATCHER._forget)


@contextlib.contextmanager
def watched(fileno: Callable[[], int], started: float, limit: float) -> Iterator[Watch]:
    """While the body of a GET sent at `started` is read: its connection (the socket of
    `fileno()`) is shut down if the read is not done `limit` seconds after `started`. The socket
    is held through a duplicate of its descriptor, so a descriptor closed and reused meanwhile is
    never the one cut. Where the descriptor is unknown the body is not watched."""
    try:
        own: Any = socket.socket(fileno=os.dup(fileno()))
    except (OSError, ValueError, AttributeError):
        own = None
    watch = Watch(started + limit, None if own is None else (lambda: own.shutdown(socket.SHUT_RDWR)), limit)
    if own is not None:
        _WATCHER.add(watch)
    try:
        yield watch
    finally:
        if own is not None:
            _WATCHER.remove(watch)
            own.close()
