"""Dates, times, timestamps and durations arrive as their stored integers, in the unit of the
Arrow type read, and `source.schema` names that type (unit and time zone included), for fl.Arrow
and for fl.Parquet (local and s3://), whose unit is the one pyarrow reads from the file
(timestamp[s] is stored as milliseconds, date64 as days). The reference is pyarrow itself:
`column.cast(int)` of the table fl.Arrow is given, or of `pq.read_table(path)`."""
from __future__ import annotations

import datetime
import uuid

import numpy as np
import pytest
import torch

import fastload as fl
from remote_helpers import opts

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

_PARIS = datetime.timezone(datetime.timedelta(hours=1))  # a fixed offset: no tz database needed
_NOON_PARIS = datetime.datetime(2024, 1, 15, 12, 30, 5, tzinfo=_PARIS)
_UTC_SECONDS = int(_NOON_PARIS.timestamp())  # 11:30:05 UTC


def _temporal_table() -> "pa.Table":
    s = np.array([_UTC_SECONDS, 0, -86400, 1_700_000_000], dtype=np.int64)
    return pa.table({
        "ts_s": pa.array(s, pa.timestamp("s")),
        "ts_ms_utc": pa.array(s * 1000 + 7, pa.timestamp("ms", tz="UTC")),
        "ts_us_paris": pa.array(s * 10**6 + 9, pa.timestamp("us", tz="+01:00")),
        "ts_ns": pa.array(s * 10**9 + 11, pa.timestamp("ns")),
        "date32": pa.array((s // 86400).astype(np.int32), pa.date32()),
        "date64": pa.array(s // 86400 * 86_400_000, pa.date64()),
        "time32_s": pa.array(np.array([1, 2, 3, 86399], np.int32), pa.time32("s")),
        "time32_ms": pa.array(np.array([1, 2, 3, 86_399_999], np.int32), pa.time32("ms")),
        "time64_us": pa.array(np.array([1, 2, 3, 4], np.int64), pa.time64("us")),
        "time64_ns": pa.array(np.array([1, 2, 3, 5], np.int64), pa.time64("ns")),
        "dur_s": pa.array(np.array([-1, 0, 1, 2], np.int64), pa.duration("s")),
        "dur_ns": pa.array(np.array([-1, 0, 1, 3], np.int64), pa.duration("ns")),
    })


def _stored_integers(column: "pa.ChunkedArray") -> np.ndarray:
    """The integers Arrow stores for a temporal column (pyarrow's own cast to its width)."""
    width = pa.int32() if column.type.bit_width == 32 else pa.int64()
    return column.cast(width).to_numpy()


def _one_batch(source) -> dict:
    loader = fl.Loader(source, batch_size=len(source), device="cpu")
    try:
        return next(iter(loader))
    finally:
        loader.close()


def _check(source, reference: "pa.Table") -> None:
    batch = _one_batch(source)
    for name in reference.column_names:
        expected = _stored_integers(reference.column(name))
        assert batch[name].dtype == (torch.int32 if expected.dtype == np.int32 else torch.int64), name
        np.testing.assert_array_equal(batch[name].numpy(), expected, err_msg=name)
        assert source.schema[name].arrow_type == str(reference.schema.field(name).type), name
        assert source.schema[name].dtype == batch[name].dtype and source.schema[name].shape == ()


def test_arrow_gives_the_stored_integers_and_names_their_unit():
    table = _temporal_table()
    source = fl.Arrow(table)
    _check(source, table)
    assert source.schema["ts_ms_utc"].arrow_type == "timestamp[ms, tz=UTC]"
    assert source.schema["ts_us_paris"].arrow_type == "timestamp[us, tz=+01:00]"
    assert source.schema["date64"].arrow_type == "date64[ms]"
    assert source.schema["time32_s"].arrow_type == "time32[s]" and source.schema["dur_ns"].arrow_type == "duration[ns]"
    # A time zone changes no integer: they count from 1970-01-01 UTC (12:30:05 in Paris is 11:30:05 UTC).
    assert int(_one_batch(source)["ts_us_paris"][0]) == _UTC_SECONDS * 10**6 + 9


def test_parquet_gives_the_unit_pyarrow_reads_from_the_file(tmp_path):
    path = tmp_path / "t.parquet"
    pq.write_table(_temporal_table(), path)
    read = pq.read_table(path)
    source = fl.Parquet(str(path))
    _check(source, read)
    # Parquet has no seconds: timestamp[s] was stored in milliseconds, date64 as days, time32[s] as ms.
    assert source.schema["ts_s"].arrow_type == "timestamp[ms]"
    assert int(_one_batch(source)["ts_s"][0]) == _UTC_SECONDS * 1000
    assert source.schema["date64"].arrow_type == "date32[day]" and source.schema["date64"].dtype == torch.int32
    assert source.schema["time32_s"].arrow_type == "time32[ms]"


def test_parquet_int96_timestamps_arrive_in_nanoseconds(tmp_path):
    path = tmp_path / "spark.parquet"  # as Spark wrote timestamps for years
    pq.write_table(_temporal_table().select(["ts_s", "ts_ns"]), path, use_deprecated_int96_timestamps=True)
    source = fl.Parquet(str(path))
    _check(source, pq.read_table(path))
    assert source.schema["ts_s"].arrow_type == "timestamp[ns]"
    assert int(_one_batch(source)["ts_s"][0]) == _UTC_SECONDS * 10**9


def test_remote_parquet_names_the_same_units_as_local(tmp_path, s3_server):
    import boto3

    path = tmp_path / "t.parquet"
    pq.write_table(_temporal_table(), path)
    s3 = boto3.client("s3", endpoint_url=s3_server[0], region_name="us-east-1")
    bucket = f"u-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="t/t.parquet", Body=path.read_bytes())
    remote = fl.Parquet(f"s3://{bucket}/t/", storage_options=opts(s3_server[0]), cache_dir=tmp_path / "c")
    assert remote.schema == fl.Parquet(str(path)).schema
    _check(remote, pq.read_table(path))


def test_schema_of_other_columns():
    table = pa.table({"x": pa.array([[1.0, 2.0]] * 3, pa.list_(pa.float32(), 2)), "s": ["a", "b", "c"],
                      "b": [b"x", b"y", b"z"], "ids": pa.array([[1], [2, 3], []], pa.list_(pa.int32())),
                      "flag": [True, False, True]})
    schema = fl.Arrow(table, max_length={"ids": 4}).schema
    assert schema == {
        "x": (torch.float32, (2,), "fixed_size_list<float32, 2>"), "s": (str, (), "string"),
        "b": (bytes, (), "binary"), "ids": (torch.int32, (4,), "list<int32>"), "flag": (torch.bool, (), "bool")}
