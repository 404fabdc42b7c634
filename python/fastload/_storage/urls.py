"""Object URLs: which strings are URLs, what they name (scheme, bucket, key), and how relative
names join them. Nothing here talks to a server."""
from __future__ import annotations

import os
import urllib.parse
from typing import Any, NamedTuple

SCHEMES = ("s3", "gs", "http", "https")
BUCKET_SCHEMES = ("s3", "gs")  # scheme://bucket/key, with a listing
# Other spellings of a scheme (fsspec's gcsfs takes gcs:// too).
ALIASES = {"gcs": "gs"}
# Schemes fastload recognises as object storage but cannot read yet: an error that says so,
# never "no such file or directory" for a path that looks like a URL.
LATER = ("az", "abfs", "abfss", "hf")


class Url(NamedTuple):
    scheme: str  # "s3", "gs", "http" or "https"
    bucket: str  # s3, gs: the bucket; http(s): the host (with port)
    key: str  # s3, gs: the object key (or a prefix); http(s): the path without its leading "/"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.key}"

    def child(self, name: str) -> "Url":
        """The object `name` (a relative path, "/"-separated) under this URL taken as a folder."""
        base = self.key if not self.key or self.key.endswith("/") else self.key + "/"
        return self._replace(key=base + name)


def is_url(value: Any) -> bool:
    """Whether `value` is a string naming an object by URL (any scheme://), not a local path."""
    if isinstance(value, os.PathLike) or not isinstance(value, str):
        return False
    scheme, sep, _ = value.partition("://")
    return bool(sep) and scheme.isalnum()  # a scheme is case-insensitive (RFC 3986): S3:// is s3://


def shown(value: str) -> str:
    """`value` as a refusal may show it: everything before its last `@` replaced by `***` (user
    information, whose secret may hold a `/`, as AWS secret keys do), so that refusing a URL never
    prints the secret it carries. A key with an `@` is cut short too: harmless in a refusal."""
    scheme, sep, rest = value.partition("://")
    if not sep or "@" not in rest:
        return value
    return f"{scheme}{sep}***@{rest.rpartition('@')[2]}"


def _has_user_info(scheme: str, authority: str) -> bool:
    """Whether the part before the first `/` carries user information: an `@`; for a bucket a
    `:` (bucket names hold none, and `key:secret/with/slashes@bucket` stops at the secret's first
    `/`); for a host, a `:` not followed by a port number."""
    if "@" in authority:
        return True
    if scheme in BUCKET_SCHEMES:
        return ":" in authority
    _, colon, port = authority.rpartition(":")
    return bool(colon) and not authority.endswith("]") and not (port.isdigit() or port == "")


def parse_url(value: str, what: str = "path") -> Url:
    """A URL this layer reads, or a ValueError naming `what` and the value. User information (a
    secret in s3://key:secret@bucket/... or https://user:secret@host/...) is refused for every
    scheme rather than sent to a server or carried into messages and state; no message repeats it."""
    scheme, _, rest = value.partition("://")
    scheme = scheme.lower()
    scheme = ALIASES.get(scheme, scheme)
    if scheme in LATER:
        raise ValueError(f"{what} {shown(value)!r}: {scheme}:// is not supported yet (s3://, gs:// and http(s):// "
                         "are); mount the bucket or copy the data locally")
    if scheme not in SCHEMES:
        raise ValueError(f"{what} {shown(value)!r}: unknown URL scheme {scheme!r} (supported: s3://, gs://, http://, "
                         "https://)")
    if _has_user_info(scheme, rest.partition("/")[0]):
        how = ("the credential chain or storage_options (key, secret, token)" if scheme in BUCKET_SCHEMES else
               "storage_options={'headers': {...}}")
        raise ValueError(f"{what} {shown(value)!r}: an {scheme}:// URL with a user name or password is refused (it "
                         f"would be sent to the server and written into messages and saved state); pass credentials "
                         f"through {how}")
    if scheme in BUCKET_SCHEMES:
        bucket, _, key = rest.partition("/")
        if not bucket:
            raise ValueError(f"{what} {value!r}: an {scheme}:// URL needs a bucket ({scheme}://bucket/prefix)")
        return Url(scheme, bucket, key)
    parts = urllib.parse.urlsplit(value)
    if not parts.netloc:
        raise ValueError(f"{what} {value!r}: an {scheme}:// URL needs a host")
    if parts.query or parts.fragment:
        raise ValueError(f"{what} {value!r}: query strings and fragments are not supported in object URLs "
                         "(a signed URL would carry its signature into messages and saved state)")
    return Url(scheme, parts.netloc, parts.path.lstrip("/"))
