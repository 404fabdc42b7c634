"""The network ceiling of the object-storage benchmarks: parallel GETs of every object with one
client, bytes/s (bench_remote.py and remote_peers.py both measure against it)."""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import tempfile
import time

BUCKET = "bench-remote"  # the bucket both benchmarks write


def ceiling_boto3(endpoint: str, keys: list[str], concurrency: int) -> float:
    import boto3
    import botocore.config

    c = boto3.client("s3", endpoint_url=endpoint, config=botocore.config.Config(max_pool_connections=concurrency))
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        n = sum(pool.map(lambda k: len(c.get_object(Bucket=BUCKET, Key=k)["Body"].read()), keys))
    return n / (time.perf_counter() - t)


def ceiling_obstore(endpoint: str, keys: list[str], concurrency: int) -> float:
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, region="us-east-1", client_options={"allow_http": True},
                    access_key_id=os.environ["AWS_ACCESS_KEY_ID"], secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        n = sum(pool.map(lambda k: len(obstore.get(store, k).bytes()), keys))
    return n / (time.perf_counter() - t)


def ceiling_obstore_files(endpoint: str, keys: list[str], concurrency: int) -> float:
    """obstore's parallel GETs, each body written to a file (what a cache on disk costs beyond
    the GET; fastload also verifies and renames)."""
    import obstore
    from obstore.store import S3Store

    store = S3Store(BUCKET, endpoint=endpoint, region="us-east-1", client_options={"allow_http": True},
                    access_key_id=os.environ["AWS_ACCESS_KEY_ID"], secret_access_key=os.environ["AWS_SECRET_ACCESS_KEY"])
    folder = tempfile.mkdtemp(prefix="bench_remote_files_")

    def one(k: str) -> int:
        with open(os.path.join(folder, k.replace("/", "_")), "wb") as f:
            return f.write(obstore.get(store, k).bytes())

    try:
        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            n = sum(pool.map(one, keys))
        return n / (time.perf_counter() - t)
    finally:
        shutil.rmtree(folder)


def ceiling_s3fs(endpoint: str, keys: list[str], concurrency: int) -> float:
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint}, max_concurrency=concurrency,
                           skip_instance_cache=True)
    t = time.perf_counter()
    out = fs.cat([f"{BUCKET}/{k}" for k in keys])
    n = sum(len(v) for v in out.values())
    return n / (time.perf_counter() - t)
