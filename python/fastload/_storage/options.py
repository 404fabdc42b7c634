"""storage_options: the one table of the keys each scheme's clients take and of their defaults.
A client reads a setting as `setting(opts, name)`, never with a default of its own."""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["SECRET_OPTIONS", "ALLOWED", "DEFAULTS", "setting"]

# Keys that hold credentials: accepted, used, never kept in a pickle or shown.
SECRET_OPTIONS = frozenset({"key", "secret", "token", "aws_access_key_id", "aws_secret_access_key",
                            "aws_session_token", "headers"})

# What every client takes: retries, concurrency, timeouts and ranged parts.
_COMMON = frozenset({"max_attempts", "backoff", "max_backoff", "max_concurrency", "connect_timeout", "read_timeout",
                     "part_size"})

# The keys each scheme takes (a key another scheme takes is refused by name, never ignored).
ALLOWED: dict[str, frozenset] = {
    "s3": _COMMON | {"endpoint_url", "region_name", "profile", "anon", "client"} | SECRET_OPTIONS,
    "gs": _COMMON | {"endpoint_url", "anon", "token"},
    "http(s)": _COMMON | {"headers"},
}

# Defaults of the settings that have one. part_size has none here: without it the fetcher splits
# objects only where whole ones would leave requests unused, and each client says what it splits
# (configure_parts), so whether it was given is itself the setting.
DEFAULTS: dict[str, Any] = {
    "max_attempts": 6,  # tries in all, the first included
    "backoff": 0.1,  # seconds before the second try; doubled each time, with full jitter
    "max_backoff": 5.0,
    "max_concurrency": 16,  # requests at once per source (whole objects or their parts)
    "connect_timeout": 10.0,  # seconds
    "read_timeout": 60.0,  # seconds without a byte; each body also has a deadline (deadline.py)
}


def setting(opts: Mapping[str, Any], name: str) -> Any:
    """The setting `name` of checked options, or its default from DEFAULTS (as int or float)."""
    value = opts.get(name, DEFAULTS[name])
    return int(value) if isinstance(DEFAULTS[name], int) else float(value)
