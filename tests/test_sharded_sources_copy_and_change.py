"""What tests/test_sources.py checks of plain arrays, on sharded and ragged sources: a sharded or
ragged Dataset, an opened dataset directory and a Windows over several arrays or files hold no
addresses (descriptions are made from the live arrays), copy and pickle (memmaps and directories
by file or path), and report a shard changed under a Loader at the next iter(); order="block" and
partition="shards" on a real dataset directory."""
from __future__ import annotations

import copy
import gc
import json
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import fastload as fl
from fastload._sources.arrays import _declare_shards


def read_all(source, **kw):
    kw.setdefault("batch_size", 37)
    loader = fl.Loader(source, shuffle=True, seed=4, with_index=True, num_threads=2, device="cpu", **kw)
    out = {}
    for b in loader:
        for k, v in b.items():
            out.setdefault(k, []).append(v.numpy().copy())
    out = {k: np.concatenate(v) for k, v in out.items()}
    order = np.argsort(out["index"])
    return {k: v[order] for k, v in out.items()}


def ragged_rows(n):
    return [np.arange(i % 6, dtype=np.int32) + 10 * i for i in range(n)]


def check_ragged(got, lengths, rows, pad=0):
    for row, length, want in zip(got, lengths, rows):
        assert length == len(want)
        np.testing.assert_array_equal(row[:length], want)
        assert (row[length:] == pad).all()


def sharded_columns(tmp_path):
    """x: three shards (numpy, memmap, torch); r: a ragged column of three shards."""
    a = np.arange(0, 300, dtype=np.float64).reshape(100, 3)
    mm = np.lib.format.open_memmap(tmp_path / "b.npy", mode="w+", dtype=np.float64, shape=(50, 3))
    mm[:] = np.arange(300, 450, dtype=np.float64).reshape(50, 3)
    mm.flush()
    t = torch.arange(450, 600, dtype=torch.float64).reshape(50, 3)
    rows = ragged_rows(200)
    parts = [rows[:100], rows[100:150], rows[150:]]  # shards must agree across columns
    values = [np.concatenate(p) for p in parts]
    offsets = [np.concatenate([[0], np.cumsum([len(r) for r in p])]) for p in parts]
    return {"x": [a, np.load(tmp_path / "b.npy", mmap_mode="r"), t], "r": (values, offsets)}, rows


# ---------------------------------------------------------------------------- copies and pickles
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_sharded_ragged_dataset_copies_and_reads_exactly_after_the_original_is_gone(tmp_path, how):
    cols, rows = sharded_columns(tmp_path)
    ds = fl.Dataset(cols)
    assert ds.shard_rows == [100, 50, 50]
    ds2 = copy.deepcopy(ds) if how == "deepcopy" else pickle.loads(pickle.dumps(ds))
    assert ds2.shard_rows == [100, 50, 50] and ds2.names == ["x", "r", "r_lengths"]
    # the memmap shard was mapped again from its file, not copied
    assert isinstance(ds2._columns["x"][1].base, np.memmap)
    del ds, cols
    gc.collect()
    got = read_all(ds2)
    np.testing.assert_array_equal(got["index"], np.arange(200))
    np.testing.assert_array_equal(got["x"], np.arange(600, dtype=np.float64).reshape(200, 3))
    check_ragged(got["r"], got["r_lengths"], rows)


def test_a_copy_of_a_sharded_dataset_is_independent_of_the_original():
    a, b = np.arange(10), np.arange(10, 30)
    ds = fl.Dataset({"x": [a, b]})
    ds2 = copy.deepcopy(ds)
    b[:] = -1
    np.testing.assert_array_equal(read_all(ds2)["x"], np.arange(30))
    assert (read_all(ds)["x"][10:] == -1).all()  # the original still reads the live arrays


@pytest.fixture
def directory(tmp_path):
    n = 600
    fl.write_dataset(tmp_path / "d", {"x": np.arange(n, dtype=np.int64), "r": ragged_rows(n)}, rows_per_shard=64)
    return tmp_path / "d", n


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_an_opened_directory_travels_by_path_and_reads_exactly(directory, how):
    path, n = directory
    ds = fl.Dataset.open(path, pad=-1)
    fl.Loader(ds, 10)  # mapped: the copy must not carry the mappings' addresses
    data = pickle.dumps(ds)
    assert len(data) < 2000  # a path and options, not 600 rows
    ds2 = copy.deepcopy(ds) if how == "deepcopy" else pickle.loads(data)
    assert isinstance(ds2, fl.DiskDataset) and ds2.path == ds.path and ds2.shard_rows == ds.shard_rows
    del ds
    gc.collect()
    got = read_all(ds2)
    np.testing.assert_array_equal(got["index"], np.arange(n))
    np.testing.assert_array_equal(got["x"], np.arange(n))
    check_ragged(got["r"], got["r_lengths"], ragged_rows(n), pad=-1)  # pad travelled too


def test_an_unpickled_directory_that_changed_meanwhile_is_refused(directory, tmp_path):
    path, _ = directory
    data = pickle.dumps(fl.Dataset.open(path))
    fl.write_dataset(path, {"x": np.arange(10), "r": ragged_rows(10)}, overwrite=True)
    with pytest.raises(fl.DatasetError, match="changed since this Dataset was pickled"):
        pickle.loads(data)


def test_a_from_files_windows_travels_by_its_files(tmp_path):
    tokens = [np.arange(k * 1000, k * 1000 + 700 + 37 * k, dtype=np.uint16) for k in range(4)]
    paths = []
    for k, t in enumerate(tokens):
        paths.append(str(tmp_path / f"{k}.bin"))
        t.tofile(paths[-1])
    w = fl.Windows.from_files(paths, np.uint16, length=65, stride=64)
    data = pickle.dumps(w)
    assert len(data) < 3000  # file names, not tokens
    copies = [pickle.loads(data), copy.deepcopy(w)]
    shard_rows, n = w.shard_rows, len(w)
    del w
    gc.collect()
    want = np.concatenate([np.stack([t[i * 64:i * 64 + 65] for i in range((len(t) - 65) // 64 + 1)]) for t in tokens])
    for w2 in copies:
        assert w2.files == paths and w2.shard_rows == shard_rows and len(w2) == n
        got = read_all(w2)
        np.testing.assert_array_equal(got["index"], np.arange(n))
        np.testing.assert_array_equal(got["tokens"], want)


def test_a_windows_over_in_memory_arrays_copies_by_value():
    tokens = [np.arange(500, dtype=np.int32), torch.arange(500, 900, dtype=torch.int32)]
    w2 = pickle.loads(pickle.dumps(fl.Windows(tokens, 10, 10)))
    del tokens
    gc.collect()
    assert w2.shard_rows == [50, 40]
    np.testing.assert_array_equal(read_all(w2)["tokens"], np.arange(900).reshape(90, 10))


def test_declared_shards_survive_a_copy_and_real_ones_cannot_be_redeclared():
    ds = _declare_shards(fl.Dataset({"x": np.arange(40)}), [10, 30])
    assert pickle.loads(pickle.dumps(ds)).shard_rows == [10, 30] and copy.deepcopy(ds).shard_rows == [10, 30]
    w = _declare_shards(fl.Windows(np.arange(100), 10), [4, 6])
    assert pickle.loads(pickle.dumps(w)).shard_rows == [4, 6]
    with pytest.raises(ValueError, match="already has shard boundaries"):
        _declare_shards(fl.Dataset({"x": [np.arange(10), np.arange(30)]}), [20, 20])


# ---------------------------------------------------------------------------- changes under a Loader
def test_a_shard_array_resized_under_the_loader_is_reported_at_iter():
    a, b = np.arange(100.0), np.arange(100.0, 300.0)
    loader = fl.Loader(fl.Dataset({"x": [a, b]}), batch_size=50, device="cpu")
    assert len(list(loader)) == 6
    b.resize(5000, refcheck=False)  # frees the memory the loader was built on
    with pytest.raises(ValueError, match=r"column 'x\[1\]' changed since the Loader was built \(address"):
        iter(loader)
    with pytest.raises(ValueError, match=r"'x\[1\]' changed"):
        loader.split(["cpu", "cpu"])


def test_a_ragged_shard_replaced_under_the_loader_is_reported_at_iter():
    values = torch.arange(100, dtype=torch.int64)
    loader = fl.Loader(fl.Dataset({"r": fl.Ragged([values], [np.arange(0, 101, 5)])}), batch_size=5, device="cpu")
    values.share_memory_()
    with pytest.raises(ValueError, match="ragged column values 'r' changed since the Loader was built"):
        iter(loader)


def test_a_windows_shard_changed_under_the_loader_is_reported_at_iter():
    tokens = [np.arange(100), np.arange(100)]
    loader = fl.Loader(fl.Windows(tokens, 10), batch_size=5, device="cpu")
    tokens[1].resize(1000, refcheck=False)
    with pytest.raises(ValueError, match=r"tokens 'tokens\[1\]' changed since the Loader was built"):
        iter(loader)


TRUNCATE = """
    import json, os, sys, numpy as np, fastload as fl
    root, kind = sys.argv[1], sys.argv[2]
    if kind == "directory":
        fl.write_dataset(root, {"x": np.arange(4000.0).reshape(1000, 4)}, rows_per_shard=100)
        source, victim = fl.Dataset.open(root), os.path.join(root, "x", "000007.npy")
    else:
        paths = [os.path.join(root + f".{k}.bin") for k in range(3)]
        for p in paths:
            np.arange(100000, dtype=np.uint16).tofile(p)
        source, victim = fl.Windows.from_files(paths, np.uint16, 1024), paths[2]
    loader = fl.Loader(source, batch_size=10, shuffle=True, device="cpu")
    assert len(list(loader)) > 0
    os.truncate(victim, 100)
    try:
        list(loader)
        print(json.dumps([victim, "no error"]))
    except ValueError as e:
        print(json.dumps([victim, str(e)]))
"""


@pytest.mark.parametrize("kind", ["directory", "from_files"])
def test_a_truncated_shard_file_is_reported_by_name_not_sigbus(tmp_path, kind):
    # In a subprocess: without the check, reading past the end of the file is SIGBUS.
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(TRUNCATE), str(tmp_path / "d"), kind],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    victim, message = json.loads(proc.stdout)
    assert victim in message and "truncated" in message and "is 100 bytes" in message, message


# ---------------------------------------------------------------------------- orders over a directory
@pytest.mark.parametrize("partition,order,shuffle", [("shards", "block", True), ("shards", "random", True),
                                                     ("shards", "random", False), ("samples", "block", True)])
def test_shard_orders_on_a_real_directory_cover_every_sample_once_over_two_ranks(directory, partition, order,
                                                                                 shuffle):
    path, n = directory
    ds = fl.Dataset.open(path)
    assert ds.shard_rows == [64] * 9 + [24]
    rows = ragged_rows(n)
    seen, counts, shards = [], [], []
    for rank in range(2):
        loader = fl.Loader(ds, 16, shuffle=shuffle, order=order, partition=partition, rank=rank, world_size=2,
                           even="mask", seed=7, with_index=True, num_threads=2, device="cpu")
        mine = []
        batches = list(loader)
        counts.append(len(batches))
        for b in batches:
            i, keep = b["index"].numpy(), b["valid"].numpy()
            np.testing.assert_array_equal(b["x"].numpy()[keep], i[keep])
            check_ragged(b["r"].numpy()[keep], b["r_lengths"].numpy()[keep], [rows[k] for k in i[keep]])
            mine.append(i[keep])
        mine = np.concatenate(mine)
        seen.append(mine)
        shards.append(set((mine // 64).tolist()))
    assert counts[0] == counts[1]  # equal batch counts on both ranks
    np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(n))
    if partition == "shards":  # whole shards per rank
        assert not shards[0] & shards[1] and len(shards[0] | shards[1]) == 10
