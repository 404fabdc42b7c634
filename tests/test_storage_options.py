"""storage_options' one table (python/fastload/_storage/options.py): every client takes its
defaults from it (a default changed in the table changes every client), and every client
satisfies the one Client protocol (client_protocol.py). No request is sent: the clients are
only built (an endpoint on 127.0.0.1 that nothing listens on)."""
from __future__ import annotations

import pytest

from remote_helpers import S3_CLIENTS

ENDPOINT = "http://127.0.0.1:1"


def _clients():
    """(name in options.PART_SIZE, client) for every client installed, built with no settings."""
    from fastload._storage.choose_client import make_client

    out = [(name, make_client("s3", {"endpoint_url": ENDPOINT, "anon": True, "client": name})) for name in S3_CLIENTS]
    out.append(("gs", make_client("gs", {"endpoint_url": ENDPOINT, "anon": True})))
    out.append(("http(s)", make_client("http", {})))
    return out


def test_every_client_takes_its_defaults_from_the_table():
    from fastload._storage.options import DEFAULTS, PART_SIZE
    from fastload._storage.retries import RetryPolicy

    for name, client in _clients():
        assert client.concurrency == DEFAULTS["max_concurrency"], name
        assert client.policy == RetryPolicy(DEFAULTS["max_attempts"], DEFAULTS["backoff"], DEFAULTS["max_backoff"])
        assert client.part_size == PART_SIZE[name] and not client.parts_always, name


def test_a_default_changed_in_the_table_changes_every_client(monkeypatch):
    from fastload._storage import options

    monkeypatch.setitem(options.DEFAULTS, "max_concurrency", 7)
    monkeypatch.setitem(options.DEFAULTS, "max_attempts", 2)
    monkeypatch.setitem(options.DEFAULTS, "backoff", 0.5)
    for name in options.PART_SIZE:
        monkeypatch.setitem(options.PART_SIZE, name, 3 << 20)
    for name, client in _clients():
        assert (client.concurrency, client.policy.attempts, client.policy.backoff) == (7, 2, 0.5), name
        assert client.part_size == 3 << 20, name


def test_given_settings_override_the_table():
    from fastload._storage.choose_client import make_client

    c = make_client("http", {"max_concurrency": 3, "max_attempts": 4, "backoff": 0.2, "part_size": "1MiB"})
    assert (c.concurrency, c.policy.attempts, c.policy.backoff, c.part_size, c.parts_always) == (3, 4, 0.2, 1 << 20, True)
    with pytest.raises(ValueError, match=r"storage_options\['max_attempts'\] must be an integer >= 1, got 0"):
        make_client("http", {"max_attempts": 0})


def test_every_client_satisfies_the_client_protocol():
    from fastload._storage.client_protocol import Client

    for name, client in _clients():
        assert isinstance(client, Client), name
        for member in ("list", "stat", "get_whole", "read_range", "get", "requests_for", "get_range", "unreadable"):
            assert callable(getattr(client, member)), (name, member)
