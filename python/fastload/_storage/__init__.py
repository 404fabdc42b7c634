"""Object storage under the file-backed sources. file_set.py: FileSet, the one seam the sources
are built on (local paths or URLs, listed, pinned, fetched into the cache). Below it: URLs
(urls.py); the clients, one file each (client_protocol.py: the Client protocol; boto3_s3.py,
obstore_s3.py, gcs.py, http.py; choose_client.py picks one per scheme; retries.py: the retry
policy; bodies.py: a body written and checked; options.py: storage_options, their checks and
defaults; errors.py; credentials.py; deadline.py bounds each body; quiet.py keeps third-party
logs quiet); the bounded on-disk cache shared by a node's processes (cache.py); the plan-driven
fetcher (fetcher.py, plan.py) and its counters (stats.py). A client library (boto3, obstore) is
imported only when a URL is given: a local-only user never loads one."""
from .urls import is_url

__all__ = ["is_url"]
