"""Windows over several arrays, raw files and N-D time series, against a brute-force list of
every window (none may cross an array's end)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload as fl


def brute_force(arrays, length, stride):
    """Every window, in source order, and the rows left after each array's last window."""
    windows, unused = [], []
    for a in arrays:
        starts = list(range(0, len(a) - length + 1, stride))
        windows += [a[s:s + length] for s in starts]
        unused.append(len(a) - (starts[-1] + length) if starts else len(a))
    return windows, unused


def check(source, windows, batch_size=7, **kw):
    assert len(source) == len(windows)
    seen = np.zeros(len(windows), bool)
    for b in fl.Loader(source, batch_size, with_index=True, num_threads=2, **kw):
        t = b["tokens"].numpy()
        for row, i in zip(t, b["index"].numpy()):
            np.testing.assert_array_equal(row, windows[i])
            seen[i] = True
    assert seen.all()


LENGTHS = [(1, 1), (5, 5), (8, 3), (4, 9), (16, 16)]


@pytest.mark.parametrize("length,stride", LENGTHS, ids=str)
def test_many_1d_arrays_match_brute_force(rng, length, stride):
    sizes = [0, 3, 16, 17, 100, 5, 64, 1]
    arrays = [rng.integers(0, 60_000, n).astype(np.uint16) for n in sizes]
    windows, unused = brute_force(arrays, length, stride)
    w = fl.Windows(arrays, length=length, stride=stride)
    assert w.unused_tokens == sum(unused) and w.unused_per_file == unused
    assert w.num_tokens == sum(sizes)
    assert w.shard_rows == [max(0, (n - length) // stride + 1) if n >= length else 0 for n in sizes]
    check(w, windows)
    check(w, windows, shuffle=True, seed=4)


@pytest.mark.parametrize("length,stride", [(1, 1), (3, 2), (5, 7)], ids=str)
def test_nd_time_series_in_many_shards_match_brute_force(rng, length, stride):
    months = [rng.standard_normal((n, 2, 3, 4)).astype(np.float32) for n in (31, 28, 2, 30)]
    windows, unused = brute_force(months, length, stride)
    w = fl.Windows(months, length=length, stride=stride)
    assert w.unused_tokens == sum(unused)
    b = next(iter(fl.Loader(w, 4)))
    assert b["tokens"].shape == (4, length, 2, 3, 4) and b["tokens"].dtype == torch.float32
    check(w, windows, shuffle=True)


def test_one_nd_array(rng):
    series = rng.integers(0, 100, (50, 3)).astype(np.int64)
    windows, unused = brute_force([series], 6, 4)
    w = fl.Windows(series, length=6, stride=4)
    assert w.shard_rows is None and w.unused_tokens == unused[0]
    check(w, windows)


def test_one_array_keeps_its_old_behaviour(rng):
    tokens = rng.integers(0, 1000, 1000).astype(np.uint32)
    w = fl.Windows(tokens, length=65, stride=64)
    assert len(w) == (1000 - 65) // 64 + 1 and w.shard_rows is None
    assert w.unused_tokens == 1000 - ((len(w) - 1) * 64 + 65)
    check(w, brute_force([tokens], 65, 64)[0])


def test_from_files_matches_in_memory(tmp_path, rng):
    arrays = [rng.integers(0, 2**31, n).astype(np.uint32) for n in (1000, 0, 999, 3, 2049)]
    paths = []
    for k, a in enumerate(arrays):
        p = tmp_path / f"part{k}.bin"
        a.tofile(p)
        paths.append(p)
    w = fl.Windows.from_files(paths, dtype=np.uint32, length=257, stride=256)
    mem = fl.Windows(arrays, length=257, stride=256)
    assert len(w) == len(mem) and w.shard_rows == mem.shard_rows and w.unused_tokens == mem.unused_tokens
    assert w.files == [str(p) for p in paths]
    check(w, brute_force(arrays, 257, 256)[0], shuffle=True)


def test_from_files_with_a_row_shape(tmp_path, rng):
    a = rng.standard_normal((40, 3, 2)).astype(np.float16)
    a.tofile(tmp_path / "a.bin")
    a[:9].tofile(tmp_path / "b.bin")
    w = fl.Windows.from_files([tmp_path / "a.bin", tmp_path / "b.bin"], dtype="float16", length=8, stride=8,
                              row_shape=(3, 2))
    check(w, brute_force([a, a[:9]], 8, 8)[0])
    assert w.unused_per_file == [0, 1]


def test_tensors_and_arrays_mix(rng):
    a = rng.integers(0, 100, 30).astype(np.int16)
    b = torch.arange(20, dtype=torch.int16)
    check(fl.Windows([a, b], length=4, stride=3), brute_force([a, b.numpy()], 4, 3)[0])


def test_window_source_errors(tmp_path):
    a = np.arange(10, dtype=np.uint16)
    with pytest.raises(ValueError, match=r"length must be at most the tokens of the longest array \(10\), got 11"):
        fl.Windows([a, a[:4]], length=11)
    with pytest.raises(TypeError, match=r"tokens\[1\] has another dtype"):
        fl.Windows([a, a.astype(np.int32)], length=2)
    with pytest.raises(ValueError, match=r"tokens\[1\] has rows of shape \(2,\)"):
        fl.Windows([a, np.zeros((4, 2), np.uint16)], length=2)
    with pytest.raises(ValueError, match="tokens must be an array or a non-empty list"):
        fl.Windows([], length=2)
    with pytest.raises(ValueError, match=r"tokens\[0\] must be contiguous along the first axis"):
        fl.Windows([np.zeros((6, 4), np.uint8)[:, :2]], length=2)
    (tmp_path / "odd.bin").write_bytes(b"\0" * 7)
    with pytest.raises(ValueError, match=r"odd\.bin: 7 bytes is not a whole number of rows of 2 bytes"):
        fl.Windows.from_files([tmp_path / "odd.bin"], dtype=np.uint16, length=2)
    with pytest.raises(FileNotFoundError, match="missing.bin"):
        fl.Windows.from_files([tmp_path / "missing.bin"], dtype=np.uint16, length=2)
    with pytest.raises(ValueError, match="paths must be a non-empty list of file paths"):
        fl.Windows.from_files(str(tmp_path / "odd.bin"), dtype=np.uint16, length=2)
    with pytest.raises(TypeError, match="dtype must be a numpy dtype, got 'nope'"):
        fl.Windows.from_files([tmp_path / "odd.bin"], dtype="nope", length=2)
