"""Object storage under the file-backed sources: URLs (urls.py), the clients and their retries
(client.py), the bounded on-disk cache shared by a node's processes (cache.py), the plan-driven
fetcher (fetcher.py, plan.py) and the remote sources built on them (sources.py). Imported only
when a URL is given: a local-only user never loads boto3."""
from .urls import is_url

__all__ = ["is_url"]
