"""Which client serves a URL scheme: s3:// (obstore, else boto3), gs:// (gcs.py), http(s)://
(http.py). Apart from client_protocol.py so that the protocol and the clients' common code
import none of the clients."""
from __future__ import annotations

from typing import Any, Mapping

from .boto3_s3 import S3Client
from .client_protocol import Client
from .obstore_s3 import ObstoreS3Client
from .gcs import GcsClient
from .http import HttpClient


def make_client(scheme: str, options: Mapping[str, Any] | None) -> Client:
    """The client for a scheme. s3: storage_options["client"] "obstore" or "boto3"; default
    obstore where it is installed (measured ~3x boto3's parallel GETs), else boto3."""
    options = {} if options is None else options
    if scheme == "gs":
        return GcsClient(options)
    if scheme != "s3":
        return HttpClient(options)
    choice = options.get("client")
    if choice not in (None, "obstore", "boto3"):
        raise ValueError(f"storage_options['client'] must be 'obstore' or 'boto3', got {choice!r}")
    if choice is None:
        try:
            import obstore  # noqa: F401, PLC0415
            choice = "obstore"
        except ImportError:
            choice = "boto3"
    try:
        return ObstoreS3Client(options) if choice == "obstore" else S3Client(options)
    except ImportError:
        package = "obstore" if choice == "obstore" else "boto3"
        raise ImportError(f"s3:// URLs need {package}: pip install {package} (or fastload[s3])") from None
