"""Hive partition columns of fl.Parquet (`year=2024/month=1/part-0.parquet`, as pyarrow's
write_to_dataset(partition_cols=...) writes them): read back as pyarrow's dataset discovery reads
them (`pyarrow.dataset.dataset(root, partitioning="hive")`, the reference of every test here),
locally and over s3:// (both clients), gs:// and http(s)://; selected, dropped, filled and
refused like any column; a clash with a file's own column refused naming both."""
from __future__ import annotations

import os
import pickle
import uuid

import numpy as np
import pytest
import torch

import fastload as fl
from remote_helpers import S3_CLIENTS, opts, upload_dir

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
ds = pytest.importorskip("pyarrow.dataset")


def _table(rows: int, seed: int = 0) -> "pa.Table":
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": pa.array(np.arange(rows), pa.int64()),
        "x": pa.array(rng.standard_normal(rows).astype(np.float32)),
        "year": pa.array(rng.choice([2023, 2024, 2025], rows), pa.int64()),
        "month": pa.array(rng.integers(1, 4, rows), pa.int64()),
        "city": pa.array(rng.choice(["a b", "x/y", "é", "a=b", "plain"], rows)),
    })


def _written(root, table, partition_cols) -> str:
    pq.write_to_dataset(table, str(root), partition_cols=partition_cols, row_group_size=50)
    return str(root)


def _by_id(batch_list: list) -> dict:
    """The batches' columns, rows put in id order (tensors to lists)."""
    cols: dict = {}
    for b in batch_list:
        for k, v in b.items():
            cols.setdefault(k, []).extend(v if isinstance(v, list) else v.tolist())
    order = np.argsort(cols["id"], kind="stable")
    return {k: [v[i] for i in order] for k, v in cols.items()}


def _reference(root, **kw) -> dict:
    """pyarrow's reading of the directory, rows in id order."""
    t = ds.dataset(root, partitioning="hive", **kw).to_table()
    t = t.take(pa.compute.sort_indices(t, [("id", "ascending")]))
    return t.to_pydict()


def batches(loader) -> list:
    """The loader's batches (tensors copied, lists of strings as they are), the loader closed."""
    try:
        return [{k: v if isinstance(v, list) else v.clone() for k, v in b.items()} for b in loader]
    finally:
        loader.close()


def _read_keys(source) -> tuple:
    """(year, city) of every row, in the source's order (no id column to sort by)."""
    got = batches(fl.Loader(source, batch_size=1000, device="cpu"))
    return [v for b in got for v in b["year"].tolist()], [v for b in got for v in b["city"]]


def _read(source, **kw) -> dict:
    return _by_id(batches(fl.Loader(source, batch_size=64, device="cpu", **kw)))


@pytest.mark.parametrize("partition_cols", [["year"], ["year", "month"], ["year", "month", "city"]])
def test_partition_columns_are_read_as_pyarrow_reads_them(tmp_path, partition_cols):
    table = _table(600)
    root = _written(tmp_path / "t", table, partition_cols)
    reference = _reference(root)
    src = fl.Parquet(root)
    assert src.partition_columns == partition_cols
    assert src.names == list(reference)  # the files' columns, then the partitions' (pyarrow's order)
    assert _read(src) == reference
    # Shuffled, 3 threads, 2 ranks: the same rows, each with its own partition values.
    got = [_read(src, shuffle=True, seed=3, num_threads=3, rank=r, world_size=2, even="drop") for r in range(2)]
    merged = {k: got[0][k] + got[1][k] for k in reference}
    assert _by_id([merged]) == reference
    kinds = ds.dataset(root, partitioning="hive").schema
    for name in partition_cols:
        assert src.schema[name].arrow_type == str(kinds.field(name).type)  # int32 / string, as pyarrow infers
    assert src.schema["year"].dtype == torch.int32
    if "city" in partition_cols:
        assert src.schema["city"].dtype is str  # a Python list of the batch's values, as any string column


def test_values_are_url_decoded_null_and_typed_as_pyarrow_does(tmp_path):
    """Directory names written by hand: each key's type and values against pyarrow's reading."""
    dirs = {
        "k=%41b/n=-5/big=1/s=01": 0, "k=a%2Fb/n=7/big=3000000000/s=1": 1, "k=a%2/n=0x10/big=2/s=2": 2,
        "k=__HIVE_DEFAULT_PARTITION__/n=8/big=4/s=3": 3, "k=/n=9/big=5/s=4": 4,
    }
    root = tmp_path / "hand"
    for d, i in dirs.items():
        os.makedirs(root / d)
        pq.write_table(pa.table({"id": pa.array([10 * i, 10 * i + 1], pa.int64())}), root / d / "p.parquet")
    reference = _reference(str(root))
    src = fl.Parquet(str(root), fill_null={"k": None})
    kinds = ds.dataset(str(root), partitioning="hive").schema
    assert {n: src.schema[n].arrow_type for n in "k n big s".split()} == \
        {n: str(kinds.field(n).type) for n in "k n big s".split()}
    assert [src.schema[n].arrow_type for n in "k n big s".split()] == ["string", "int32", "string", "int32"]
    assert _read(src) == reference
    assert None in reference["k"] and "a/b" in reference["k"] and "Ab" in reference["k"] and "a%2" in reference["k"]


def test_null_partitions_are_refused_unless_filled(tmp_path):
    table = pa.table({"id": pa.array(np.arange(300), pa.int64()),
                      "year": pa.array([2024 if i % 3 else None for i in range(300)], pa.int64())})
    root = _written(tmp_path / "t", table, ["year"])  # year=__HIVE_DEFAULT_PARTITION__ for the nulls
    with pytest.raises(ValueError, match=r"partition column 'year' is null for the rows of .*year=__HIVE_DEFAULT_"
                                         r"PARTITION__.*fill_null=\{'year': value\}"):
        fl.Parquet(root)
    src = fl.Parquet(root, fill_null={"year": -1}, with_valid=True)
    got, reference = _read(src), _reference(root)
    assert got["year"] == [-1 if y is None else y for y in reference["year"]]
    assert got["year_valid"] == [y is not None for y in reference["year"]]
    assert fl.Parquet(root, ["id"]).names == ["id"]  # dropped: nothing to refuse


def test_a_key_missing_from_some_files_is_null_for_their_rows(tmp_path):
    root = tmp_path / "mixed"
    for d, i in (("", 0), ("k=1", 1), ("k=2/j=x", 2)):
        os.makedirs(root / d, exist_ok=True)
        pq.write_table(pa.table({"id": pa.array([i], pa.int64())}), root / d / f"p{i}.parquet")
    reference = _reference(str(root))
    with pytest.raises(ValueError, match=r"partition column 'k' is null for the rows of .*p0.parquet"):
        fl.Parquet(str(root))
    got = _read(fl.Parquet(str(root), fill_null={"k": -1, "j": None}))
    assert got == {**reference, "k": [-1 if v is None else v for v in reference["k"]]}


def test_columns_select_and_drop_partition_columns(tmp_path):
    root = _written(tmp_path / "t", _table(400), ["year", "month"])
    reference = _reference(root)
    only = fl.Parquet(root, ["id", "month"])
    assert only.names == ["id", "month"] and only.partition_columns == ["year", "month"]
    assert _read(only) == {k: reference[k] for k in ("id", "month")}
    assert fl.Parquet(root, ["x"]).names == ["x"]
    # Partition columns alone: constants of each file's path, no file is decoded.
    keys = fl.Parquet(root, ["year", "month"])
    keys._fragment = None  # decoding a row group would call it
    got = batches(fl.Loader(keys, batch_size=1000, device="cpu"))
    rows = sorted(zip(got[0]["year"].tolist(), got[0]["month"].tolist()))
    assert rows == sorted(zip(reference["year"], reference["month"]))


def test_a_partition_key_that_is_also_a_column_is_refused_naming_both(tmp_path):
    root = tmp_path / "clash"
    os.makedirs(root / "year=2024")
    pq.write_table(pa.table({"id": [1], "year": [2023]}), root / "year=2024" / "p.parquet")
    with pytest.raises(ValueError, match=r"partition key 'year' \(directories named year=\.\.\.\) is also a column "
                                         r"of the Parquet files \('year': int64\)"):
        fl.Parquet(str(root))
    nested = tmp_path / "struct"
    os.makedirs(nested / "meta.id=3")
    pq.write_table(pa.table({"meta": [{"id": 1}]}), nested / "meta.id=3" / "p.parquet")
    with pytest.raises(ValueError, match=r"partition key 'meta.id' .* is also a column .*a struct field"):
        fl.Parquet(str(nested))
    twice = tmp_path / "twice"
    os.makedirs(twice / "k=1" / "k=2")
    pq.write_table(pa.table({"id": [1]}), twice / "k=1" / "k=2" / "p.parquet")
    with pytest.raises(ValueError, match=r"partition key 'k' appears twice .*'1' and '2'"):
        fl.Parquet(str(twice))
    bad = tmp_path / "bad"
    os.makedirs(bad / "k=%FF")
    pq.write_table(pa.table({"id": [1]}), bad / "k=%FF" / "p.parquet")
    with pytest.raises(ValueError, match=r"the directory name 'k=%FF' is not valid UTF-8 once URL-decoded"):
        fl.Parquet(str(bad))  # pyarrow refuses it too


def test_a_key_null_in_every_file_is_a_string_column_of_nulls(tmp_path):
    """pyarrow refuses to type it; here it is refused only when read without a fill."""
    root = tmp_path / "nulls"
    os.makedirs(root / "k=__HIVE_DEFAULT_PARTITION__")
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64())}), root / "k=__HIVE_DEFAULT_PARTITION__" / "p.parquet")
    with pytest.raises(ValueError, match=r"partition column 'k' is null"):
        fl.Parquet(str(root))
    assert fl.Parquet(str(root), ["id"]).names == ["id"]
    filled = fl.Parquet(str(root), fill_null={"k": None})
    assert filled.schema["k"].arrow_type == "string" and _read(filled)["k"] == [None, None]


def test_lists_of_files_and_single_files_follow_pyarrow(tmp_path):
    root = _written(tmp_path / "t", _table(300), ["year"])
    files = sorted(os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs)
    rel = [os.path.relpath(f) for f in files]  # as given: pyarrow reads every directory of the path
    listed = fl.Parquet(rel)
    assert listed.partition_columns == ["year"]
    t = ds.dataset(rel, partitioning="hive").to_table()
    assert _read(listed) == _by_id([t.to_pydict()])
    alone = fl.Parquet(files[0])  # pq.read_table(one file) has no partition columns either
    assert alone.partition_columns == [] and alone.names == pq.read_table(files[0]).column_names
    below = fl.Parquet(os.path.join(root, "year=2024"))  # a partition's directory: the keys below it only
    assert below.partition_columns == [] and "year" not in below.names


def test_a_pickled_source_keeps_its_partition_columns(tmp_path):
    root = _written(tmp_path / "t", _table(200), ["year", "city"])
    src = fl.Parquet(root)
    back = pickle.loads(pickle.dumps(src))
    assert back.names == src.names and _read(back) == _reference(root)


# ---------------------------------------------------------------- object storage
def _bucket(endpoint) -> tuple:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    bucket = f"h-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    return bucket, s3


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_s3_partition_columns_equal_local(tmp_path, s3_server, client):
    root = _written(tmp_path / "t", _table(500), ["year", "city"])
    bucket, s3 = _bucket(s3_server[0])
    upload_dir(s3, bucket, "run=1/tbl", root)  # a key=value above the prefix: not a partition
    reference = _reference(root)
    for prefix in (f"s3://{bucket}/run=1/tbl/", f"s3://{bucket}/run=1/tbl"):
        remote = fl.Parquet(prefix, storage_options=opts(s3_server[0], client=client), cache_dir=tmp_path / "c")
        assert remote.partition_columns == ["year", "city"] and remote.names == list(reference)
        assert _read(remote, shuffle=True, seed=1, num_threads=2) == reference
    back = pickle.loads(pickle.dumps(remote))
    assert back.names == remote.names and _read(back) == reference
    # Partition columns only: an epoch fetches no file (nothing to decode, nothing prefetched).
    keys = fl.Parquet(f"s3://{bucket}/run=1/tbl/", ["year", "city"], storage_options=opts(s3_server[0], client=client),
                      cache_dir=tmp_path / "keys")
    assert sorted(zip(*_read_keys(keys))) == sorted(zip(reference["year"], reference["city"]))
    assert keys.storage_stats().bytes_fetched == 0
    # A list of URLs: every directory of each key counts (run=1 too), as pyarrow reads a list of files.
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"])
    listed = fl.Parquet([f"s3://{bucket}/{k}" for k in keys], storage_options=opts(s3_server[0], client=client),
                        cache_dir=tmp_path / "c")
    assert listed.partition_columns == ["run", "year", "city"]
    assert _read(listed) == {**reference, "run": [1] * len(reference["id"])}


def test_gs_partition_columns_equal_local(tmp_path, gcs_server):
    root = _written(tmp_path / "t", _table(300), ["year", "month"])
    bucket = gcs_server.bucket()
    gcs_server.put_dir(bucket, "tbl", root)
    remote = fl.Parquet(f"gs://{bucket}/tbl/", storage_options={"endpoint_url": gcs_server.url, "anon": True},
                        cache_dir=tmp_path / "c")
    assert _read(remote) == _reference(root)


def test_http_urls_read_the_partitions_of_their_paths(tmp_path):
    import functools
    import http.server
    import threading

    root = _written(tmp_path / "t", _table(300), ["year"])
    rel = sorted(os.path.relpath(os.path.join(r, f), root) for r, _, fs in os.walk(root) for f in fs)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=root)
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        remote = fl.Parquet([f"{base}/{r}" for r in rel], storage_options={"backoff": 0.01}, cache_dir=tmp_path / "c")
        assert remote.partition_columns == ["year"]
        assert _read(remote) == _reference(root)
    finally:
        server.shutdown()
        server.server_close()


def test_pandas_partitioned_output_and_string_keys_as_padded_bytes(tmp_path):
    import pandas as pd

    frame = _table(300).to_pandas()
    root = str(tmp_path / "pd")
    frame.to_parquet(root, partition_cols=["city", "year"])
    reference = _reference(root)
    src = fl.Parquet(root)
    assert src.partition_columns == ["city", "year"] and _read(src) == reference
    assert pd.read_parquet(root).shape[0] == len(src)
    padded = fl.Parquet(root, ["id", "city"], max_length={"city": 6})
    assert padded.schema["city"] == (torch.uint8, (6,), "string")
    got = _by_id([{k: v.tolist() for k, v in b.items()} for b in batches(fl.Loader(padded, batch_size=64,
                                                                                  device="cpu"))])
    for row, n, city in zip(got["city"], got["city_lengths"], reference["city"]):
        raw = city.encode()[:6]
        assert n == len(raw) and bytes(row[:n]) == raw and not any(row[n:])
