"""Third-party loggers kept quiet while fastload calls them. botocore logs each request it signs
at DEBUG (the canonical request, with the session token in it), so a root logger at DEBUG printed
the credentials fastload promises never to log. Records below WARNING from botocore, boto3,
s3transfer, urllib3 and google.auth are dropped on a thread while it is inside a fastload call
(quiet()); the same libraries used by the program itself, on any thread, log as configured."""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator

_NOISY = ("botocore", "boto3", "s3transfer", "urllib3", "google.auth")
_inside = threading.local()


class _InsideFastload(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not getattr(_inside, "depth", 0)


_FILTER = _InsideFastload()
_lock = threading.Lock()
_seen = -1  # how many loggers existed when the filter was last attached


def _attach() -> None:
    """The filter on every logger of those libraries that exists now. A logger filters only the
    records it makes itself (not its children's), hence each one; a library imported later gets
    it at the next call (the count of loggers tells)."""
    global _seen
    loggers = logging.Logger.manager.loggerDict
    if len(loggers) == _seen:
        return
    with _lock:
        for name, logger in list(loggers.items()):
            if isinstance(logger, logging.Logger) and name.startswith(_NOISY) and _FILTER not in logger.filters:
                logger.addFilter(_FILTER)
        _seen = len(loggers)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Within: this thread's records below WARNING from the libraries above are dropped."""
    _attach()
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        yield
    finally:
        _inside.depth -= 1
        _attach()  # loggers the call created (a module imported on first use) for the next call
