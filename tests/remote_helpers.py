"""Helpers shared by the object-storage tests: the clients installed, storage_options for the
local servers, and batches compared element for element with those of the same data read
locally."""
from __future__ import annotations


def has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


S3_CLIENTS = ["boto3"] + (["obstore"] if has("obstore") else [])  # every S3 client installed


def opts(endpoint: str, **more) -> dict:
    """storage_options for a server on 127.0.0.1, with short backoffs (faults retry fast)."""
    return {"endpoint_url": endpoint, "backoff": 0.01, "max_backoff": 0.05, **more}


def copy(batch: dict) -> dict:
    return {k: v.clone() for k, v in batch.items()}


def batches(loader, epoch=None) -> list:
    """The loader's batches (copies), the loader closed at once: a Loader left to the garbage
    collector is closed by its finaliser, on whatever thread the collection runs (a download
    thread included), which may wait there for its collation threads."""
    try:
        if epoch is not None:
            loader.set_epoch(epoch)
        return [copy(b) for b in loader]
    finally:
        loader.close()


def equal(a: list, b: list) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and bool((x[k] == y[k]).all()), k


def small_dataset(local, width: int, seed: int) -> dict:
    """A dataset directory of 8 shards of 125 rows written at `local` (x: `width` float32s of a
    seeded normal, y: the row's index); returns its columns."""
    import numpy as np  # noqa: PLC0415

    import fastload as fl  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    cols = {"x": rng.standard_normal((1000, width)).astype(np.float32), "y": np.arange(1000, dtype=np.int64)}
    fl.write_dataset(local, cols, rows_per_shard=125, fsync=False)
    return cols


def upload_dir(s3, bucket: str, prefix: str, local) -> None:
    """Every file under `local` put at s3://bucket/prefix/<its relative path> (a boto3 client)."""
    import os  # noqa: PLC0415

    for dirpath, _, names in os.walk(local):
        for name in names:
            full = os.path.join(dirpath, name)
            with open(full, "rb") as f:
                s3.put_object(Bucket=bucket, Key=f"{prefix}/{os.path.relpath(full, local)}", Body=f.read())
