"""Credentials from each cloud's standard chain, asked again when the server refuses them.

A long run outlives temporary credentials (an assumed role's, an SSO session's, an instance
role's, a rotated key file's). Two mechanisms keep it going: a chain that refreshes by itself
(boto3's refreshable credentials, google-auth's tokens) is asked before each use and tells the
client when its answer expires; and when a request is refused (401/403) anyway, the client asks
the chain again from the start (environment, files, metadata server) and, if that gives other
credentials, rebuilds its connection and sends the request again. If the chain gives the same
ones, the refusal is the error. Credentials live in memory only: no message, repr, log line or
pickle carries them (they are compared by a digest)."""
from __future__ import annotations

import datetime
import hashlib
import threading
from typing import Any, Callable

from .quiet import quiet

# Handed to obstore as the expiry of credentials that do not expire by themselves, so that it
# asks this module again now and then (cheap: no I/O) rather than caching them for good.
_RECHECK = datetime.timedelta(minutes=5)


def _digest(*parts: Any) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(repr(p).encode())
    return h.digest()


class Renewable:
    """Credentials from a chain (`resolve()` asks it from the start: an object, or None where it
    finds none), with a generation that counts renewals. `identity(creds)` is what tells two
    answers apart (the key and token, digested here)."""

    def __init__(self, resolve: Callable[[], Any], identity: Callable[[Any], tuple]):
        self._resolve, self._identity = resolve, identity
        self._lock = threading.Lock()
        self.generation = 0
        self.creds = resolve()

    def renew(self, generation: int) -> bool:
        """After a request made with generation `generation`'s credentials was refused: True when
        there are other credentials to try (the chain gave new ones now, or another thread's
        renewal did meanwhile); False when the chain gives the same ones, none, or fails.
        The chain is asked with no lock held: asking may take a while (a metadata server) and
        may run anything (a garbage collection runs finalizers, a Loader's close among them, which
        waits for threads that may be waiting here)."""
        with self._lock:
            if self.generation != generation:
                return True
            old = None if self.creds is None else _digest(*self._identity(self.creds))
        try:
            new = self._resolve()
        except Exception:  # noqa: BLE001 - a broken chain is "no new credentials"; the refusal is reported
            return False
        if new is None or _digest(*self._identity(new)) == old:
            with self._lock:
                return self.generation != generation
        with self._lock:
            if self.generation == generation:
                self.creds = new
                self.generation += 1
            return True


def aws_chain(profile: str | None) -> Renewable | None:
    """boto3's standard chain (environment, shared credentials and config files, profiles, SSO,
    credential_process, container and instance roles): credentials `(session, credentials)`, the
    session being the one that resolved them (a boto3 client made from it signs with them); None
    where boto3 is not installed or the chain finds nothing."""
    try:
        import boto3  # noqa: PLC0415
    except ImportError:
        return None

    def resolve() -> Any:
        with quiet():  # a role's or SSO's chain makes requests, which botocore logs with the tokens
            session = boto3.session.Session(profile_name=profile)
            creds = session.get_credentials()
        return None if creds is None else (session, creds)

    def identity(pair: Any) -> tuple:
        f = pair[1].get_frozen_credentials()
        return (f.access_key, f.secret_key, f.token)

    chain = Renewable(resolve, identity)
    return chain if chain.creds is not None else None


def obstore_s3_provider(chain: Renewable) -> Callable[[], dict[str, Any]]:
    """obstore's credential callback over boto3's chain: the current credentials (refreshed by
    boto3 when they are temporary) and when obstore must ask again: the credentials' expiry, or
    _RECHECK from now for those that do not expire (so that a renewal is seen)."""

    def provide() -> dict[str, Any]:
        creds = chain.creds[1]
        with quiet():
            frozen = creds.get_frozen_credentials()  # refreshes temporary credentials near their expiry
        now = datetime.datetime.now(datetime.timezone.utc)
        expires = now + _RECHECK
        expiry = getattr(creds, "_expiry_time", None)  # botocore's RefreshableCredentials
        if isinstance(expiry, datetime.datetime):
            if expiry.tzinfo is None:
                expiry = expiry.replace(tzinfo=datetime.timezone.utc)
            expires = min(expires, expiry)
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key, "token": frozen.token,
                "expires_at": expires}

    return provide


def google_chain(scopes: list[str]) -> Renewable | None:
    """google-auth's Application Default Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's
    application_default_credentials.json, workload identity, the metadata server), or None where
    google-auth is not installed."""
    try:
        import google.auth  # noqa: PLC0415
    except ImportError:
        return None

    def resolve() -> Any:
        creds, _ = google.auth.default(scopes=scopes)
        return creds

    def identity(creds: Any) -> tuple:
        return (getattr(creds, "token", None), getattr(creds, "service_account_email", None),
                getattr(creds, "refresh_token", None))

    return Renewable(resolve, identity)


class BearerTokens:
    """The Authorization header of a google-auth chain: a valid token (refreshed under a lock
    when it is missing or near its expiry), and `renew` after a 401: the token refreshed at once
    and, if it did not change, the chain read again."""

    def __init__(self, chain: Renewable):
        self.chain = chain

    def header(self) -> tuple[dict[str, str], int]:
        """({"Authorization": ...}, the generation it belongs to). A refresh runs with no lock
        held (see Renewable.renew); two threads refreshing at once each set a valid token."""
        import google.auth.transport.requests  # noqa: PLC0415

        gen, creds = self.chain.generation, self.chain.creds
        if not creds.valid:
            creds.refresh(google.auth.transport.requests.Request())
        return {"Authorization": f"Bearer {creds.token}"}, gen

    def renew(self, generation: int, refused_header: dict[str, str]) -> bool:
        import google.auth.transport.requests  # noqa: PLC0415

        if self.chain.generation != generation:
            return True
        creds = self.chain.creds
        try:
            creds.refresh(google.auth.transport.requests.Request())
        except Exception:  # noqa: BLE001 - then the chain from the start
            pass
        else:
            if refused_header.get("Authorization") != f"Bearer {creds.token}":
                return True
        return self.chain.renew(generation)
