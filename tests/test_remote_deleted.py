"""An object deleted from its bucket after a remote source opened it, or refused to this reader
mid-epoch: the Loader raises FileNotFoundError / PermissionError naming its URL (as opening a
missing object does), for every remote source (Parquet, dataset directories, token files), both
S3 clients, gs:// and http(s)://. The error of a callback the native threads ran keeps its type
(csrc/bindings/callback_error.h)."""
from __future__ import annotations

import urllib.request
import uuid

import numpy as np
import pytest

import fastload as fl
from remote_helpers import S3_CLIENTS, opts, small_dataset, upload_dir

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
boto3 = pytest.importorskip("boto3")


def _bucket(endpoint):
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"d-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    return bucket, s3


def _parquet_bytes(tmp_path, k: int) -> bytes:
    path = tmp_path / f"p{k}.parquet"
    pq.write_table(pa.table({"id": pa.array(np.arange(k * 1000, (k + 1) * 1000), pa.int64())}), path,
                   row_group_size=250)
    return path.read_bytes()


def _iterate(source, **kw) -> None:
    loader = fl.Loader(source, batch_size=100, device="cpu", **kw)
    try:
        for _ in loader:
            pass
    finally:
        loader.close()


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_a_parquet_object_deleted_after_open(s3_server, tmp_path, client):
    bucket, s3 = _bucket(s3_server[0])
    for k in range(3):
        s3.put_object(Bucket=bucket, Key=f"pq/part-{k}.parquet", Body=_parquet_bytes(tmp_path, k))
    remote = fl.Parquet(f"s3://{bucket}/pq/", storage_options=opts(s3_server[0], client=client),
                        cache_dir=tmp_path / "cache")
    s3.delete_object(Bucket=bucket, Key="pq/part-1.parquet")
    with pytest.raises(FileNotFoundError, match=rf"failed on batch \d+ of epoch 0.*: s3://{bucket}/pq/part-1.parquet: "
                                                r"no such object") as e:
        _iterate(remote, num_threads=2)
    assert "cached copy" not in str(e.value)
    assert isinstance(e.value.__cause__, FileNotFoundError)  # the client's own error, with its traceback


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_a_token_file_and_a_dataset_shard_deleted_after_open(s3_server, tmp_path, client):
    bucket, s3 = _bucket(s3_server[0])
    for k in range(3):
        s3.put_object(Bucket=bucket, Key=f"tok/{k}.bin", Body=np.arange(1000, dtype=np.uint16).tobytes())
    tokens = fl.Windows.from_files(f"s3://{bucket}/tok/", dtype=np.uint16, length=10,
                                   storage_options=opts(s3_server[0], client=client), cache_dir=tmp_path / "c1")
    s3.delete_object(Bucket=bucket, Key="tok/1.bin")
    with pytest.raises(FileNotFoundError, match=rf"s3://{bucket}/tok/1.bin: no such object"):
        _iterate(tokens)

    small_dataset(tmp_path / "d", 4, 0)
    upload_dir(s3, bucket, "d", tmp_path / "d")
    dataset = fl.Dataset.open(f"s3://{bucket}/d", storage_options=opts(s3_server[0], client=client),
                              cache_dir=tmp_path / "c2")
    victim = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="d/")["Contents"]
                    if o["Key"].endswith(".npy"))[3]
    s3.delete_object(Bucket=bucket, Key=victim)
    with pytest.raises(FileNotFoundError, match=rf"s3://{bucket}/{victim}: no such object"):
        _iterate(dataset)


def test_gs_and_http_parquet_objects_deleted_after_open(s3_server, gcs_server, tmp_path):
    bucket = gcs_server.bucket()
    gcs_server.put(bucket, "pq/part-0.parquet", _parquet_bytes(tmp_path, 0))
    remote = fl.Parquet(f"gs://{bucket}/pq/", storage_options={"endpoint_url": gcs_server.url, "anon": True},
                        cache_dir=tmp_path / "c1")
    urllib.request.urlopen(urllib.request.Request(f"{gcs_server.url}/storage/v1/b/{bucket}/o/pq%2Fpart-0.parquet",
                                                  method="DELETE")).read()
    with pytest.raises(FileNotFoundError, match=rf"gs://{bucket}/pq/part-0.parquet: no such object"):
        _iterate(remote)

    s3_bucket, s3 = _bucket(s3_server[0])
    s3.put_object(Bucket=s3_bucket, Key="pq/part-1.parquet", Body=_parquet_bytes(tmp_path, 1), ACL="public-read")
    url = f"{s3_server[0]}/{s3_bucket}/pq/part-1.parquet"
    public = fl.Parquet([url], storage_options={"backoff": 0.01}, cache_dir=tmp_path / "c2")
    s3.delete_object(Bucket=s3_bucket, Key="pq/part-1.parquet")
    with pytest.raises(FileNotFoundError, match=rf"{url}: no such object"):
        _iterate(public)


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_access_refused_mid_epoch_is_permission_error(s3_server, s3_proxy, tmp_path, client):
    bucket, s3 = _bucket(s3_server[0])
    for k in range(2):
        s3.put_object(Bucket=bucket, Key=f"pq/part-{k}.parquet", Body=_parquet_bytes(tmp_path, k))
    remote = fl.Parquet(f"s3://{bucket}/pq/", storage_options=opts(s3_proxy.url, client=client),
                        cache_dir=tmp_path / "cache")
    s3_proxy.arm("403", match="part-1.parquet", times=1000)
    with pytest.raises(PermissionError, match=rf"s3://{bucket}/pq/part-1.parquet: access denied"):
        _iterate(remote)
    small_dataset(tmp_path / "d", 4, 0)
    upload_dir(s3, bucket, "d", tmp_path / "d")
    dataset = fl.Dataset.open(f"s3://{bucket}/d", storage_options=opts(s3_proxy.url, client=client),
                              cache_dir=tmp_path / "c2")
    s3_proxy.arm("403", match="000002.npy", times=1000)
    with pytest.raises(PermissionError, match=rf"s3://{bucket}/d/x/000002.npy: access denied"):
        _iterate(dataset)
