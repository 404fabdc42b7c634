"""The retry policy around every request of every client: a jittered exponential backoff while
a request raises Transient, then a FetchError naming the URL, the last status and the attempts.
Every request is retried here, not inside the client library (boto3's and obstore's own retries
are switched off), so that the error raised after the budget says what happened. The settings and
their defaults are storage_options' (options.py)."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, TypeVar

from .errors import FetchError, Transient
from .options import DEFAULTS, setting
from .quiet import quiet
from .urls import Url

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = DEFAULTS["max_attempts"]
    backoff: float = DEFAULTS["backoff"]
    max_backoff: float = DEFAULTS["max_backoff"]

    def run(self, what: str, url: Url, fn: Callable[[], T], on_retry: Callable[[], None] | None = None) -> T:
        """fn(), again after a jittered exponential backoff while it raises Transient; after
        `attempts` tries a FetchError naming the URL, the last status and the attempts."""
        last = ""
        for attempt in range(1, self.attempts + 1):
            try:
                with quiet():  # no third-party debug log of the request (it holds credentials)
                    return fn()
            except Transient as e:
                last = e.status
            if attempt < self.attempts:
                if on_retry is not None:
                    on_retry()
                time.sleep(random.uniform(0, min(self.max_backoff, self.backoff * (2 ** (attempt - 1)))))
        raise FetchError(f"{what} {url} failed after {self.attempts} attempts; last: {last}")


def retry_policy(options: Mapping[str, Any]) -> RetryPolicy:
    """The policy of checked storage_options (max_attempts, backoff, max_backoff)."""
    attempts = options.get("max_attempts", DEFAULTS["max_attempts"])
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise ValueError(f"storage_options['max_attempts'] must be an integer >= 1, got {attempts!r}")
    return RetryPolicy(attempts, setting(options, "backoff"), setting(options, "max_backoff"))
