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
    """The batch's tensors cloned (its Python lists, of str, bytes or parsed JSON, copied)."""
    return {k: (v.clone() if hasattr(v, "clone") else list(v)) for k, v in batch.items()}


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


def equal(a: list, b: list, nonempty: bool = False) -> None:
    """Batches equal part for part: tensors of one dtype and shape, element for element; lists
    equal. nonempty: and at least one batch (a comparison of nothing proves nothing)."""
    assert len(a) == len(b)
    assert len(a) > 0 or not nonempty
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            if isinstance(x[k], list):
                assert x[k] == y[k], k
            else:
                assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape and bool((x[k] == y[k]).all()), k



def resume_equals_local(remote, local, steps: int, **kw) -> None:
    """A Loader over `remote` stopped after `steps` batches and resumed from its state_dict gives
    the batches that a Loader over `local`, resumed from the same state, gives."""
    import fastload as fl

    with fl.Loader(remote, **kw) as first:
        it = iter(first)
        for _ in range(steps):
            next(it)
        state = first.state_dict()
        del it
    resumed, reference = fl.Loader(remote, **kw), fl.Loader(local, **kw)
    resumed.load_state_dict(state)
    reference.load_state_dict(state)
    equal(batches(resumed), batches(reference))

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


def new_bucket(endpoint: str, tag: str = "b") -> tuple:
    """(name, boto3 client) of a new bucket of the S3 server at `endpoint`."""
    import uuid  # noqa: PLC0415

    import boto3  # noqa: PLC0415

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"{tag}-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    return bucket, s3


def upload_s3(endpoint: str, local, prefix: str, tag: str = "b") -> tuple:
    """A new bucket holding every file under `local` at prefix/<relative path>: (bucket, client)."""
    bucket, s3 = new_bucket(endpoint, tag)
    upload_dir(s3, bucket, prefix, local)
    return bucket, s3


class FolderServer:
    """Python's own file server over a local folder on 127.0.0.1 (no ETag, no ranges: the version
    of an object is its Last-Modified), as a context manager; .url has no trailing slash."""

    def __init__(self, root):
        import functools  # noqa: PLC0415
        import http.server  # noqa: PLC0415
        import threading  # noqa: PLC0415

        handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
        handler.log_message = lambda *args: None
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def __enter__(self) -> "FolderServer":
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
