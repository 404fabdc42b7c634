"""The errors of object storage, shared by the clients (one file per client; client_protocol.py) and
the ranged parts (parts.py): a failure after the retry budget, an object rewritten since it was
listed, credentials refused, and the transient failure that is retried."""
from __future__ import annotations

from .urls import Url

__all__ = ["FetchError", "ObjectChanged", "Refused", "Transient", "changed_error", "refused_error"]


class FetchError(OSError):
    """A request that failed after its retry budget: names the URL, the last status, the attempts."""


class ObjectChanged(OSError):
    """The object was rewritten since it was listed (its version tag no longer matches)."""


class Refused(PermissionError):
    """401/403: the credentials were refused (a client asks its chain for new ones first)."""


def changed_error(url: Url, version: str) -> ObjectChanged:
    return ObjectChanged(f"{url}: the object changed since the source was opened (it is no longer version "
                         f"{version}); open the source again")


def refused_error(url: Url, label: str, renewable: bool) -> PermissionError:
    more = ("; the credential chain gave no new credentials" if renewable else
            "; check the credentials (environment, config files, instance role) and the bucket's policy")
    return PermissionError(f"{url}: access denied ({label}){more}")


class Transient(Exception):
    """A failure worth retrying (a reset, a timeout, a 5xx, throttling, a short body)."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status
