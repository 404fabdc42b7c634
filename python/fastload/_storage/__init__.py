"""Object storage under the file-backed sources: URLs (urls.py), the clients and their retries
(client.py with boto3, obstore_s3.py, gcs.py, http.py; clients.py picks one; credentials.py;
deadline.py bounds each body; quiet.py keeps third-party logs quiet), the bounded on-disk cache
shared by a node's processes (cache.py), the plan-driven fetcher (fetcher.py, plan.py) and its
counters (stats.py); the remote sources built on them are _sources/remote.py and
remote_parquet.py. Imported only when a URL is given: a local-only user never loads boto3."""
from .urls import is_url

__all__ = ["is_url"]
