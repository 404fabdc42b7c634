"""Dataset directories: write_dataset / DatasetWriter round trips, atomic writes, every corruption
case named at open (or at first use, or by verify=True), lazy mapping, and a directory Dataset
under every Loader feature."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import fastload as fl

DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
          np.float16, np.float32, np.float64, np.complex64, np.complex128]


def values(rng, dtype, shape):
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), shape, endpoint=True).astype(dtype)


def ragged_rows(rng, n, longest=9, dtype=np.int32, item_shape=()):
    return [values(rng, dtype, (int(rng.integers(0, longest + 1)),) + item_shape) for _ in range(n)]


def read_all(source, **kw):
    """Every sample once, in order, with index: dict of column -> stacked numpy."""
    out: dict[str, list] = {}
    for b in fl.Loader(source, 64, with_index=True, num_threads=2, **kw):
        for k, v in b.items():
            out.setdefault(k, []).append(v.numpy().copy())
    return {k: np.concatenate(v) for k, v in out.items()}


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("row_shape", [(), (3,), (2, 5)], ids=str)
def test_round_trip_every_dtype_and_row_shape(tmp_path, rng, dtype, row_shape):
    x = values(rng, dtype, (301,) + row_shape)
    fl.write_dataset(tmp_path / "d", {"x": x}, rows_per_shard=64)
    ds = fl.Dataset.open(tmp_path / "d", verify=True)
    assert len(ds) == 301 and ds.shard_rows == [64, 64, 64, 64, 45] and ds.names == ["x"]
    got = read_all(ds)
    assert got["x"].dtype == x.dtype and got["x"].shape == x.shape
    np.testing.assert_array_equal(got["x"], x[got["index"]])
    for k in range(ds.num_shards):  # each shard is also a plain .npy file
        np.testing.assert_array_equal(np.load(tmp_path / "d" / "x" / f"{k:06d}.npy"), x[64 * k:64 * (k + 1)])


@pytest.mark.parametrize("chunks", [[301], [1] * 301, [0, 7, 120, 0, 64, 110], [63, 1, 64, 173]], ids=str)
def test_streaming_writer_any_chunk_sizes_equals_write_dataset(tmp_path, rng, chunks):
    x = values(rng, np.float32, (301, 4))
    y = np.arange(301)
    rows = ragged_rows(rng, 301)
    fl.write_dataset(tmp_path / "ref", {"x": x, "y": y, "r": fl.Ragged.from_rows(rows)}, rows_per_shard=64)
    with fl.DatasetWriter(tmp_path / "d", rows_per_shard=64) as w:
        at = 0
        for n in chunks:
            w.append({"x": x[at:at + n], "y": torch.from_numpy(y[at:at + n]),
                      "r": rows[at:at + n] if n else (np.zeros(0, np.int32), np.zeros(1, np.int64))})
            at += n
        assert not (tmp_path / "d").exists()  # not before the end of the block
    for name in ("ref", "d"):
        ds = fl.Dataset.open(tmp_path / name, verify=True)
        assert ds.shard_rows == [64, 64, 64, 64, 45] and ds.names == ["x", "y", "r", "r_lengths"]
        got = read_all(ds)
        i = got["index"]
        np.testing.assert_array_equal(got["x"], x[i])
        np.testing.assert_array_equal(got["y"], i)
        for row, n, k in zip(got["r"], got["r_lengths"], i):
            assert n == len(rows[k])
            np.testing.assert_array_equal(row[:n], rows[k])
            assert (row[n:] == 0).all()
    ref = json.loads((tmp_path / "ref" / "manifest.json").read_text())
    new = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert ref["shards"] == new["shards"]  # same files, same checksums


def test_ragged_round_trip_with_item_shape_pad_and_cap(tmp_path, rng):
    rows = ragged_rows(rng, 200, longest=12, dtype=np.float32, item_shape=(3,))
    fl.write_dataset(tmp_path / "d", {"r": rows}, rows_per_shard=50)
    ds = fl.Dataset.open(tmp_path / "d", pad=-1.5, max_length={"r": 5})
    got = read_all(ds)
    assert got["r"].shape == (200, 5, 3)
    for row, n, k in zip(got["r"], got["r_lengths"], got["index"]):
        assert n == min(len(rows[k]), 5)
        np.testing.assert_array_equal(row[:n], rows[k][:n])
        assert (row[n:] == -1.5).all()


def test_default_rows_per_shard_and_manifest_contents(tmp_path, rng):
    x = values(rng, np.uint8, (1000, 16))
    fl.write_dataset(tmp_path / "d", {"x": x})
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert m["format"] == "fastload-dataset" and m["version"] == 1 and m["rows"] == 1000
    assert m["columns"] == [{"name": "x", "kind": "fixed", "dtype": "|u1", "row_shape": [16]}]
    assert [s["rows"] for s in m["shards"]] == [1000]  # far under 64 MiB: one shard
    assert m["checksum"] == "fl64" and len(m["shards"][0]["columns"]["x"]["fl64"]) == 16
    assert fl.Dataset.open(tmp_path / "d").shard_rows is None


# ---------------------------------------------------------------------------------- atomicity
def test_an_exception_in_the_with_block_leaves_nothing(tmp_path, rng):
    with pytest.raises(RuntimeError, match="boom"):
        with fl.DatasetWriter(tmp_path / "d", rows_per_shard=10) as w:
            w.append({"x": np.arange(35)})
            raise RuntimeError("boom")
    assert os.listdir(tmp_path) == []


def test_a_bad_chunk_aborts_the_write(tmp_path):
    w = fl.DatasetWriter(tmp_path / "d", rows_per_shard=10)
    w.append({"x": np.arange(35)})
    with pytest.raises(ValueError, match="column 'x': chunk has float64"):
        w.append({"x": np.zeros(3)})
    assert os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError, match="aborted"):
        w.append({"x": np.arange(3)})


def test_a_killed_writer_leaves_no_valid_directory(tmp_path):
    script = textwrap.dedent(f"""
        import numpy as np, fastload as fl, sys
        w = fl.DatasetWriter({str(tmp_path / 'd')!r}, rows_per_shard=1000)
        for i in range(100000):
            w.append({{"x": np.full((1000, 8), i, np.int64)}})
            if i == 20:
                print("writing", flush=True)
    """)
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout.readline().strip() == "writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (tmp_path / "d").exists()
    leftovers = os.listdir(tmp_path)
    assert len(leftovers) == 1 and leftovers[0].startswith(".d.tmp-")  # hidden, and not a dataset
    with pytest.raises(fl.DatasetError, match="manifest.json is missing.*never finished"):
        fl.Dataset.open(tmp_path / leftovers[0])


def test_existing_directory_needs_overwrite(tmp_path):
    fl.write_dataset(tmp_path / "d", {"x": np.arange(10)})
    with pytest.raises(FileExistsError, match="overwrite=True"):
        fl.write_dataset(tmp_path / "d", {"x": np.arange(5)})
    fl.write_dataset(tmp_path / "d", {"x": np.arange(5)}, overwrite=True)
    assert len(fl.Dataset.open(tmp_path / "d")) == 5
    assert os.listdir(tmp_path) == ["d"]


def test_writer_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="rows_per_shard must be positive, got 0"):
        fl.DatasetWriter(tmp_path / "a", rows_per_shard=0)
    with pytest.raises(TypeError, match="rows_per_shard must be an integer, got 1.5"):
        fl.DatasetWriter(tmp_path / "a", rows_per_shard=1.5)
    with pytest.raises(TypeError, match="columns must be a non-empty mapping"):
        fl.write_dataset(tmp_path / "a", [np.arange(3)])
    with pytest.raises(TypeError, match="unsupported dtype <U1"):
        fl.write_dataset(tmp_path / "a", {"s": np.array(["a", "b"])})
    with pytest.raises(ValueError, match="equal rows"):
        fl.write_dataset(tmp_path / "a", {"x": np.arange(3), "y": np.arange(4)})
    with pytest.raises(ValueError, match="nothing was appended"):
        with fl.DatasetWriter(tmp_path / "a"):
            pass
    with pytest.raises(FileNotFoundError, match="parent directory"):
        fl.DatasetWriter(tmp_path / "no" / "a")
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------------- corruption
@pytest.fixture
def written(tmp_path, rng):
    x = values(rng, np.float32, (100, 4))
    rows = ragged_rows(rng, 100)
    fl.write_dataset(tmp_path / "d", {"x": x, "r": rows}, rows_per_shard=30)
    return tmp_path / "d"


def manifest(path):
    return json.loads((path / "manifest.json").read_text())


def rewrite_manifest(path, m):
    (path / "manifest.json").write_text(json.dumps(m))


def test_truncated_shard_is_named_at_open(written):
    f = written / "x" / "000002.npy"
    os.truncate(f, f.stat().st_size - 4)
    with pytest.raises(fl.DatasetError, match=r"x/000002\.npy: .* bytes on disk, the manifest expects .*truncated"):
        fl.Dataset.open(written)


def test_missing_shard_is_named_at_open(written):
    os.remove(written / "r" / "000001.offsets.npy")
    with pytest.raises(fl.DatasetError, match=r"r/000001\.offsets\.npy: shard file is missing"):
        fl.Dataset.open(written)


def test_manifest_disagreeing_with_files_is_named_at_open(written):
    m = manifest(written)
    m["shards"][1]["rows"] = 31
    m["rows"] = 101
    m["shards"][1]["columns"]["x"]["shape"] = [31, 4]
    rewrite_manifest(written, m)
    with pytest.raises(fl.DatasetError, match=r"x/000001\.npy: .* bytes on disk, the manifest expects"):
        fl.Dataset.open(written)
    m["rows"] = 100
    rewrite_manifest(written, m)
    with pytest.raises(fl.DatasetError, match="do not add up to the manifest's 100 rows"):
        fl.Dataset.open(written)


def test_same_size_header_disagreement_is_named_by_verify_and_shard(written):
    m = manifest(written)
    m["columns"][0]["dtype"] = "<i4"  # same size as <f4: only the header tells
    rewrite_manifest(written, m)
    ds = fl.Dataset.open(written)  # stat-only open (and mapping for a Loader) cannot see it
    with pytest.raises(fl.DatasetError, match=r"x/000001\.npy: its \.npy header says float32"):
        ds.shard(1)
    with pytest.raises(fl.DatasetError, match=r"x/000000\.npy: its \.npy header says float32"):
        fl.Dataset.open(written, verify=True)


def test_unknown_version_and_bad_manifests(written):
    m = manifest(written)
    rewrite_manifest(written, {**m, "version": 2})
    with pytest.raises(fl.DatasetError, match="format version 2 is not one this fastload reads"):
        fl.Dataset.open(written)
    rewrite_manifest(written, {**m, "format": "mds"})
    with pytest.raises(fl.DatasetError, match="not a fastload dataset manifest"):
        fl.Dataset.open(written)
    (written / "manifest.json").write_text("{not json")
    with pytest.raises(fl.DatasetError, match="manifest.json: not valid JSON"):
        fl.Dataset.open(written)
    bad = json.loads(json.dumps(m))
    bad["shards"][0]["columns"]["x"]["path"] = "../../etc/passwd"
    rewrite_manifest(written, bad)
    with pytest.raises(fl.DatasetError, match="path outside the directory"):
        fl.Dataset.open(written)
    del bad["shards"][0]["columns"]["x"]
    rewrite_manifest(written, bad)
    with pytest.raises(fl.DatasetError, match="column 'x' shard 0 is not in the manifest"):
        fl.Dataset.open(written)
    with pytest.raises(FileNotFoundError, match="no such dataset directory"):
        fl.Dataset.open(written / "nope")


def test_verify_names_a_corrupt_shard(written):
    f = written / "x" / "000003.npy"
    data = bytearray(f.read_bytes())
    data[-3] ^= 0xFF
    f.write_bytes(bytes(data))
    fl.Dataset.open(written)  # sizes are right: only the checksum tells
    with pytest.raises(fl.DatasetError, match=r"x/000003\.npy: checksum mismatch .* the shard is corrupt"):
        fl.Dataset.open(written, verify=True)


def test_corrupt_offsets_are_a_clean_error_on_read_and_named_by_verify(written):
    f = written / "r" / "000000.offsets.npy"
    o = np.load(f)
    o[5] = 10**9  # far past the values
    np.save(f, o)
    with pytest.raises(fl.DatasetError, match=r"r/000000\.offsets\.npy(: checksum mismatch|\): offsets are not)"):
        fl.Dataset.open(written, verify=True)
    # Without max_length the offsets are read when the shards are first mapped (to check the
    # manifest's longest): the column, the shard, the row and the file are named there.
    with pytest.raises(fl.DatasetError, match=r"ragged column 'r', shard 0 \(\S*r/000000\.offsets\.npy\): offsets are "
                                              r"not non-decreasing from 0 to \d+: row 4 has offsets \[\d+, 1000000000\)"):
        fl.Loader(fl.Dataset.open(written), 100)
    # With max_length at or below longest nothing is read up front: the gather names the row.
    ds = fl.Dataset.open(written, max_length=5)
    with pytest.raises(ValueError, match=r"ragged column r, shard 0 \(\S*r/000000\.offsets\.npy\): row 4 has offsets "
                                         r"\[.*\) outside its .* values"):
        for _ in fl.Loader(ds, 100):
            pass


def test_a_corrupt_offsets_file_is_named_by_column_shard_row_and_file_on_every_path(written):
    """Issue 33: without verify, a corrupt ragged offsets file was named by its file only. Row 7 of
    shard 1 now decreases (same size, so opening notices nothing); every path that reads it names
    the column, the shard, the row and the file."""
    from fastload._columns import mapping as _mapping

    f = written / "r" / "000001.offsets.npy"
    o = np.load(f)
    o[8] = o[7] - 1
    np.save(f, o)
    m = manifest(written)
    for shard in m["shards"]:  # no checksum for the file: verify reads the offsets themselves
        shard["columns"]["r"]["offsets"].pop(m["checksum"])
    rewrite_manifest(written, m)
    where = r"ragged column 'r', shard 1 \(\S*r/000001\.offsets\.npy\)"
    with pytest.raises(fl.DatasetError, match=where + r": offsets are not non-decreasing from 0 to \d+: row 7 has "
                                                      r"offsets \[\d+, \d+\), decreasing"):
        fl.Dataset.open(written, verify=True)
    with pytest.raises(fl.DatasetError, match=where + r": offsets are not non-decreasing .*: row 7 .*found when the "
                                                      r"shards were mapped"):
        fl.Loader(fl.Dataset.open(written), 100)
    with pytest.raises(ValueError, match=where.replace("'r'", "r") + r": row 7 has offsets \[\d+, \d+\) outside"):
        list(fl.Loader(fl.Dataset.open(written, max_length=2), 100))
    with _mapping.mapping_budget(2):  # shards mapped by the collation threads on demand
        with pytest.raises(ValueError, match=where.replace("'r'", "r") + r": offsets are not non-decreasing .*row 7 "
                                                                          r"has offsets.*found when the shard was mapped"):
            list(fl.Loader(fl.Dataset.open(written), 100, device="cpu"))


# ---------------------------------------------------------------------------------- laziness
def mapped_files(root) -> list[str]:
    with open("/proc/self/maps") as f:
        return [line for line in f if str(root) in line]


def test_open_maps_nothing_until_a_loader_needs_it(written):
    ds = fl.Dataset.open(written)
    assert mapped_files(written) == []
    assert len(ds) == 100 and ds.shard_rows == [30, 30, 30, 10]
    loader = fl.Loader(ds, 10)
    assert len(mapped_files(written)) == 12  # x, r values, r offsets per shard
    next(iter(loader))
    loader.close()


def test_shard_accessor(written, rng):
    ds = fl.Dataset.open(written)
    s = ds.shard(3)
    assert s["x"].shape == (10, 4) and not s["x"].flags.writeable
    values_, offsets = s["r"]
    assert offsets[0] == 0 and offsets[-1] == len(values_)
    with pytest.raises(IndexError):
        ds.shard(4)


# ---------------------------------------------------------------------------------- Loader features
@pytest.fixture
def numbered(tmp_path):
    n = 1000
    fl.write_dataset(tmp_path / "n", {"x": np.arange(n), "r": [np.arange(i % 7) + i for i in range(n)]},
                     rows_per_shard=97)
    return fl.Dataset.open(tmp_path / "n"), n


@pytest.mark.parametrize("order", ["random", "block"])
@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("even", ["pad", "drop", "mask"])
def test_every_order_and_rank_layout_covers_every_sample_once(numbered, order, world, even):
    ds, n = numbered
    seen = []
    for rank in range(world):
        for b in fl.Loader(ds, 16, shuffle=True, order=order, rank=rank, world_size=world, even=even, seed=5,
                           with_index=True, num_threads=2):
            i = b["index"].numpy()
            np.testing.assert_array_equal(b["x"].numpy(), i)
            for row, length, k in zip(b["r"].numpy(), b["r_lengths"].numpy(), i):
                assert length == k % 7
                np.testing.assert_array_equal(row[:length], np.arange(k % 7) + k)
            keep = b["valid"].numpy() if even == "mask" else np.ones(len(i), bool)
            seen.append(i[keep])
    seen = np.concatenate(seen)
    if even == "drop":
        assert len(seen) == n // world * world and len(np.unique(seen)) == len(seen)
    elif even == "pad":  # padding repeats samples from the start of the permutation
        assert len(seen) == -(-n // world) * world and np.array_equal(np.unique(seen), np.arange(n))
    else:
        assert np.array_equal(np.sort(seen), np.arange(n))


def test_resume_mid_epoch_on_a_directory(numbered):
    ds, _ = numbered

    def make():
        return fl.Loader(ds, 32, shuffle=True, seed=3, with_index=True, num_threads=2)

    ref = make()
    ref.set_epoch(2)
    full = [b["x"].numpy().copy() for b in ref]
    run = make()
    run.set_epoch(2)
    it = iter(run)
    first = [next(it)["x"].numpy().copy() for _ in range(11)]
    state = run.state_dict()
    resumed = make()  # as after a restart: the directory reopened
    resumed.load_state_dict(json.loads(json.dumps(state)))
    rest = [b["x"].numpy().copy() for b in resumed]
    assert len(first) + len(rest) == len(full)
    for a, b in zip(first + rest, full):
        np.testing.assert_array_equal(a, b)


def test_split_over_cpu_outputs(numbered):
    ds, n = numbered
    loader = fl.Loader(ds, 25, shuffle=True, with_index=True, num_threads=2)
    its = loader.split(["cpu", "cpu"])
    seen = []
    for it in its:
        for b in it:
            np.testing.assert_array_equal(b["x"].numpy(), b["index"].numpy())
            seen.append(b["index"].numpy())
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(n))


def test_open_rejects_bad_options(written):
    with pytest.raises(TypeError, match="verify must be a bool, got 'yes'"):
        fl.Dataset.open(written, verify="yes")
    with pytest.raises(ValueError, match=r"pad names columns that are not ragged columns of this dataset: \['x'\]"):
        fl.Dataset.open(written, pad={"x": 1})
    with pytest.raises(ValueError, match=r"ragged column .r.: pad=1099511627776 cannot be stored as int32"):
        fl.Loader(fl.Dataset.open(written, pad=2**40), 4)
