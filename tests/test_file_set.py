"""FileSet (_storage/file_set.py), the storage seam under the file-backed sources: local paths and
URLs resolved to the same answers (names, sizes, pins, folders, ranged reads, a local path to
open), against what the files hold (read back by hand) and against a real S3 server (moto)."""
from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

from fastload._storage.file_set import FileSet
from remote_helpers import S3_CLIENTS, opts


def _tree(root):
    """year=2024/a.bin, year=2024/b.bin, year=2025/c.bin, _SUCCESS, .hidden/d.bin: their bytes."""
    files = {"year=2024/a.bin": b"A" * 10, "year=2024/b.bin": bytes(range(200)), "year=2025/c.bin": b"C" * 7,
             "_SUCCESS": b"", ".hidden/d.bin": b"D"}
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _hidden(name):
    return name.startswith((".", "_"))


def test_a_local_folder_is_listed_in_name_order_skipping_what_the_source_skips(tmp_path):
    files = _tree(tmp_path / "t")
    fs = FileSet.resolve(tmp_path / "t", skip=_hidden, kind="data file")
    rels = [os.path.relpath(n, tmp_path / "t") for n in fs.names]
    assert rels == ["year=2024/a.bin", "year=2024/b.bin", "year=2025/c.bin"]
    assert fs.sizes == [len(files[r]) for r in rels] and not fs.fetched and fs.paths == fs.names
    assert fs.folders == [["year=2024"], ["year=2024"], ["year=2025"]]
    st = os.stat(fs.names[1])
    assert fs.pins[1] == (fs.names[1], st.st_size, st.st_mtime_ns, st.st_ino)
    assert fs.read_range(1, 5, 9) == bytes(range(5, 9))
    assert fs.read_ranges([(0, 0, 3), (2, 6, 7)]) == [b"AAA", b"C"]
    assert fs.opened(2, _read) == b"C" * 7
    # A file rewritten since is seen (its pin differs); the others are not.
    (tmp_path / "t" / "year=2025" / "c.bin").write_bytes(b"CC")
    assert fs.current_pin(2) != fs.pins[2] and fs.current_pin(0) == fs.pins[0]


def test_local_lists_single_files_and_bad_paths(tmp_path):
    _tree(tmp_path / "t")
    one = FileSet.resolve(str(tmp_path / "t" / "year=2024" / "a.bin"))
    assert one.folders == [[]]  # a file alone: no partition directories (pyarrow's rule)
    listed = FileSet.resolve([tmp_path / "t" / "year=2025" / "c.bin"])
    assert listed.folders[0][-1] == "year=2025"  # named in a list: every directory of its path
    with pytest.raises(FileNotFoundError, match="no data file or directory at"):
        FileSet.resolve(tmp_path / "nope", kind="data file")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no data files"):
        FileSet.resolve(tmp_path / "empty", kind="data file")
    with pytest.raises(ValueError, match="path must name at least one data file, got an empty list"):
        FileSet.resolve([], what="path", kind="data file")
    with pytest.raises(ValueError, match="storage_options, cache_dir and cache_limit are for URLs"):
        FileSet.resolve(tmp_path / "t", cache_limit="1GB")


@pytest.fixture
def bucket_tree(s3_server, tmp_path):
    boto3 = pytest.importorskip("boto3")
    s3 = boto3.client("s3", endpoint_url=s3_server[0], region_name="us-east-1")
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    files = _tree(tmp_path / "t")
    for rel, data in files.items():
        s3.put_object(Bucket=bucket, Key=f"tbl/{rel}", Body=data)
    s3.put_object(Bucket=bucket, Key="tbl2/x.bin", Body=b"sibling")  # a prefix is a folder: never read
    return s3, bucket, files


@pytest.mark.parametrize("client", S3_CLIENTS)
def test_a_prefix_resolves_as_the_local_folder_does_and_fetches_pinned(bucket_tree, s3_server, tmp_path, client):
    s3, bucket, files = bucket_tree
    fs = FileSet.resolve(f"s3://{bucket}/tbl", skip=_hidden, kind="data file", salt=b"test",
                         storage_options=opts(s3_server[0], client=client), cache_dir=tmp_path / "cache")
    rels = ["year=2024/a.bin", "year=2024/b.bin", "year=2025/c.bin"]
    assert fs.names == [f"s3://{bucket}/tbl/{r}" for r in rels] and fs.fetched
    assert fs.sizes == [len(files[r]) for r in rels]
    assert fs.folders == [["year=2024"], ["year=2024"], ["year=2025"]]
    assert all(pin[0] == name and pin[1] == n and pin[2] for pin, name, n in zip(fs.pins, fs.names, fs.sizes))
    assert fs.cache_dir.startswith(str(tmp_path / "cache"))
    assert fs.read_range(1, 5, 9) == bytes(range(5, 9))  # a ranged GET: nothing fetched
    assert not [f for _, _, names in os.walk(fs.cache_dir) for f in names if f.endswith(".bin")]
    assert fs.opened(1, _read) == files[rels[1]]  # fetched into the cache
    assert fs.stats().bytes_fetched == 200
    # Rewritten after it was resolved: a GET pinned to the old version refuses the new bytes.
    s3.put_object(Bucket=bucket, Key="tbl/year=2025/c.bin", Body=b"new bytes")
    with pytest.raises(OSError, match="year=2025/c.bin"):
        fs.opened(2, _read)


def test_the_shards_a_source_reads_map_onto_files(bucket_tree, s3_server, tmp_path):
    # A source whose shards are not its files (Parquet's row groups) says which file each reads;
    # the plan it follows is of shards, the fetcher's of files.
    _, bucket, _ = bucket_tree
    fs = FileSet.resolve(f"s3://{bucket}/tbl", skip=_hidden, storage_options=opts(s3_server[0]),
                         cache_dir=tmp_path / "cache", cache_limit="1MB")
    fs.shards_read(unit_of_shard=[0, 0, 1, 2], shard_bytes=[5, 5, 200, 7])
    assert fs.shard_bytes.tolist() == [5, 5, 200, 7] and fs.limit == 10**6
    from fastload._storage.fetcher import PlanWindow

    class Plan:
        def window(self, at):
            return PlanWindow(np.array([3, 2, 0, 1]), np.arange(4), 4, True)

    seen = []
    fs.fetcher.follow = lambda plan, position, boundary=None: seen.append(plan.window(0).shards.tolist())
    fs.follow(Plan(), lambda: 0)
    assert seen == [[2, 1, 0, 0]]


def test_a_cache_smaller_than_the_largest_file_is_refused_at_resolve(bucket_tree, s3_server, tmp_path):
    _, bucket, _ = bucket_tree
    with pytest.raises(ValueError, match=r"cache_limit is 100 bytes, smaller than the largest shard of "
                                         r"s3://.*/b.bin \(200 bytes\): raise cache_limit to at least 200 bytes"):
        FileSet.resolve(f"s3://{bucket}/tbl", skip=_hidden, storage_options=opts(s3_server[0]),
                        cache_dir=tmp_path / "cache", cache_limit=100)
