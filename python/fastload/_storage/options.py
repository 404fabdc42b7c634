"""storage_options: the one table of the keys each scheme's clients take and of their defaults,
and the checks every client makes of what it is given. A client reads a setting as
`setting(opts, name)` and its part size from PART_SIZE, never with a default of
its own."""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["SECRET_OPTIONS", "ALLOWED", "DEFAULTS", "PART_SIZE", "setting", "check_options",
           "redacted_options"]

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

# Defaults of the settings that have one.
DEFAULTS: dict[str, Any] = {
    "max_attempts": 6,  # tries in all, the first included
    "backoff": 0.1,  # seconds before the second try; doubled each time, with full jitter
    "max_backoff": 5.0,
    "max_concurrency": 16,  # requests at once per source (whole objects or their parts)
    "connect_timeout": 10.0,  # seconds (gs:// and http(s):// over urllib: read_timeout bounds the connect too)
    "read_timeout": 60.0,  # seconds without a byte; each body also has a deadline (deadline.py)
}

# part_size, per client, where storage_options does not give it: bytes per ranged GET of an
# object of two parts or more, split only where whole objects would leave requests unused
# (fetcher.py); 0 never splits. Given, it splits every object of two parts or more (parts.py), so
# whether it was given is itself the setting. obstore hands out its own buffer for each part; the
# others read a part's body through Python into a buffer (one copy more than a whole object
# streamed to the file), and a plain HTTP server may ignore Range and send the whole object.
PART_SIZE: dict[str, int] = {"obstore": 16 << 20, "boto3": 0, "gs": 0, "http(s)": 0}


def setting(opts: Mapping[str, Any], name: str) -> Any:
    """The setting `name` of checked options, or its default from DEFAULTS (as int or float)."""
    value = opts.get(name, DEFAULTS[name])
    return int(value) if isinstance(DEFAULTS[name], int) else float(value)


def check_options(options: Mapping[str, Any], allowed: frozenset, scheme: str) -> dict[str, Any]:
    """storage_options as a dict, every key one that `scheme` takes (ALLOWED[scheme]); an
    endpoint_url with user information is refused (it would be written into messages)."""
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a dict, got {type(options).__name__}")
    unknown = sorted(str(k) for k in options if k not in allowed)
    if unknown:  # names only: a misspelt key may hold a secret
        raise ValueError(f"storage_options has keys {scheme}:// does not take: {unknown} (it takes "
                         f"{sorted(allowed)})")
    endpoint = options.get("endpoint_url")
    if isinstance(endpoint, str) and "@" in endpoint.partition("://")[2].partition("/")[0]:
        raise ValueError("storage_options['endpoint_url'] with a user name or password is refused (it would be "
                         "written into messages and saved state); pass credentials through storage_options (key, "
                         "secret, token) or the credential chain")
    return dict(options)


def redacted_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """storage_options without its credentials: what a pickle, a repr or saved state may carry
    (an unpickled source takes credentials from the standard chain of the process it lands in)."""
    return {k: v for k, v in options.items() if k not in SECRET_OPTIONS}
