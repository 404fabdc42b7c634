"""Sources of more files than the process may map at once: past the mapping budget, shards and
token files are mapped by the collation threads on demand through a bounded cache of pinned
mappings (csrc/core/lazy_mappings.h). Every value is compared with numpy indexing of the same
data; the cache's counters show the bound, the evictions and the re-mappings."""
from __future__ import annotations

import gc
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import fastload as fl
from fastload._columns import mapping as _mapping


def ragged_rows(n, longest=5, seed=0):
    rng = np.random.default_rng(seed)
    return [(np.arange(int(rng.integers(0, longest + 1)), dtype=np.int32) + 7 * i) for i in range(n)]


def write_dir(path, n, rows_per_shard=2, longest=5):
    x = (np.arange(n * 3, dtype=np.float64) * 1.5).reshape(n, 3)
    y = np.arange(n, dtype=np.int16)
    r = ragged_rows(n, longest)
    fl.write_dataset(path, {"x": x, "y": y, "r": r}, rows_per_shard=rows_per_shard, fsync=False, checksum=False)
    return x, y, r


def check_batch(b, x, y, r):
    idx = b["index"].numpy()
    np.testing.assert_array_equal(b["x"].numpy(), x[idx])
    np.testing.assert_array_equal(b["y"].numpy(), y[idx])
    lengths = b["r_lengths"].numpy()
    slots = b["r"].numpy()
    for j, i in enumerate(idx):
        assert lengths[j] == len(r[i])
        np.testing.assert_array_equal(slots[j, :lengths[j]], r[i])
        assert (slots[j, lengths[j]:] == 0).all()


def mapped_files_under(root):
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if str(root) in line)


def test_a_small_budget_with_four_threads_and_shuffled_batches_reads_exact_values(tmp_path):
    n = 150  # 75 shards x 4 files (x, y, r values, r offsets) = 300 files, budget 8
    x, y, r = write_dir(tmp_path / "d", n)
    with _mapping.mapping_budget(8) as cache:
        ds = fl.Dataset.open(tmp_path / "d")
        loader = fl.Loader(ds, 12, shuffle=True, seed=3, device="cpu", num_threads=4, with_index=True)
        seen = []
        for epoch in range(2):
            for b in loader:
                check_batch(b, x, y, r)
                seen.append(b["index"].numpy())
                s = cache.stats()
                assert s["live"] <= s["budget"] + s["pinned"]
        assert sorted(np.concatenate(seen).tolist()) == sorted(list(range(n)) * 2)
        s = cache.stats()
        assert type(ds._maps).__name__ == "_LazyShards"
        assert s["peak_excess"] <= 0, s  # live never exceeded budget + files pinned
        assert s["pinned"] == 0 and s["live"] <= 8, s
        assert s["evictions"] > 0 and s["maps"] > 300, s  # evicted, and mapped again when needed
        assert s["failures"] == 0
        # The counter is the truth: the dataset's files mapped now are the live mappings.
        assert mapped_files_under(tmp_path / "d") == s["live"]
        # A thread pins one block of one column at a time: at most 4 threads x 12 rows x 2 files.
        assert s["peak_pinned"] <= 4 * 12 * 2, s
        del loader, ds, b
        gc.collect()
        for _ in range(100):
            if cache.stats()["live"] == 0:
                break
            time.sleep(0.05)  # the loader's threads drop the source as they stop
        assert cache.stats()["live"] == 0
        assert mapped_files_under(tmp_path / "d") == 0


@pytest.mark.parametrize("options", [
    dict(shuffle=True, seed=1),
    dict(shuffle=True, order="block", seed=2),
    dict(shuffle=True, partition="shards", rank=1, world_size=3, seed=4),
    dict(shuffle=False, rank=0, world_size=2, even="mask"),
    dict(shuffle=True, drop_last=True, seed=5),
], ids=["random", "block", "shards", "mask", "drop_last"])
def test_lazy_batches_equal_the_eager_ones_for_every_order(tmp_path, options):
    write_dir(tmp_path / "d", 90, rows_per_shard=3)
    eager_ds = fl.Dataset.open(tmp_path / "d")
    with _mapping.mapping_budget(5):
        lazy_ds = fl.Dataset.open(tmp_path / "d")
        got = [b for b in fl.Loader(lazy_ds, 8, device="cpu", num_threads=2, with_index=True, **options)]
    assert type(lazy_ds._maps).__name__ == "_LazyShards"
    want = [b for b in fl.Loader(eager_ds, 8, device="cpu", num_threads=2, with_index=True, **options)]
    assert type(eager_ds._maps).__name__ == "list"
    assert len(got) == len(want) > 0
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            assert g[k].dtype == w[k].dtype
            np.testing.assert_array_equal(g[k].numpy(), w[k].numpy())


def test_a_lazy_loader_resumes_mid_epoch_exactly(tmp_path):
    x, y, r = write_dir(tmp_path / "d", 80)
    with _mapping.mapping_budget(6):
        ds = fl.Dataset.open(tmp_path / "d")
        loader = fl.Loader(ds, 8, shuffle=True, device="cpu", num_threads=3, with_index=True)
        it = iter(loader)
        first = [next(it)["index"].numpy() for _ in range(4)]
        state = loader.state_dict()
        rest = [b["index"].numpy() for b in it]
        again = fl.Loader(fl.Dataset.open(tmp_path / "d"), 8, shuffle=True, device="cpu", num_threads=1,
                          with_index=True)
        again.load_state_dict(state)
        resumed = []
        for b in again:
            check_batch(b, x, y, r)
            resumed.append(b["index"].numpy())
    np.testing.assert_array_equal(np.concatenate(resumed), np.concatenate(rest))
    assert sorted(np.concatenate(first + rest).tolist()) == list(range(80))


def test_the_budget_decides_eager_or_lazy(tmp_path):
    write_dir(tmp_path / "d", 8, rows_per_shard=2)  # 4 shards x 4 files = 16 files
    with _mapping.mapping_budget(16):
        ds = fl.Dataset.open(tmp_path / "d")
        fl.Loader(ds, 4, device="cpu")
        assert isinstance(ds._maps, list)  # 16 files fit a budget of 16: mapped as arrays
    with _mapping.mapping_budget(15) as cache:
        ds = fl.Dataset.open(tmp_path / "d")
        fl.Loader(ds, 4, device="cpu")
        assert type(ds._maps).__name__ == "_LazyShards"
        assert cache.stats()["maps"] == 0  # nothing mapped before a batch needs it
    # The default: a quarter of what vm.max_map_count leaves free, read once per process.
    budget = _mapping.mapping_cache().budget
    assert _mapping.mapping_cache() is _mapping.mapping_cache()
    if os.path.exists("/proc/sys/vm/max_map_count"):
        with open("/proc/sys/vm/max_map_count") as f:
            assert 64 <= budget <= int(f.read()) // 4
    with pytest.raises(ValueError, match="mapping budget must be at least 1, got 0"):
        fl._C.MappingCache(0)


def token_files(root, n, seed=0):
    rng = np.random.default_rng(seed)
    paths, data = [], []
    os.makedirs(root, exist_ok=True)
    for k in range(n):
        a = rng.integers(0, 65535, size=int(rng.integers(0, 30)), dtype=np.uint16)
        paths.append(os.path.join(root, f"{k:05d}.bin"))
        a.tofile(paths[-1])
        data.append(a)
    return paths, data


def windows_of(data, length, stride):
    out = [np.stack([d[s:s + length] for s in range(0, len(d) - length + 1, stride)])
           for d in data if len(d) >= length]
    return np.concatenate(out)


def test_windows_from_files_past_the_budget_are_exact_and_pickle(tmp_path):
    paths, data = token_files(tmp_path / "t", 120)
    ref = windows_of(data, 6, 4)
    with _mapping.mapping_budget(8) as cache:
        w = fl.Windows.from_files(paths, np.uint16, 6, 4)
        assert type(w._tokens).__name__ == "TokenFiles"
        assert len(w) == len(ref) and w.files == paths
        assert w.unused_tokens == sum(len(d) - (((len(d) - 6) // 4) * 4 + 6) if len(d) >= 6 else len(d) for d in data)
        loader = fl.Loader(w, 10, shuffle=True, device="cpu", num_threads=4, with_index=True)
        for _ in range(2):
            for b in loader:
                np.testing.assert_array_equal(b["tokens"].numpy(), ref[b["index"].numpy()])
        s = cache.stats()
        assert s["peak_excess"] <= 0 and s["evictions"] > 0 and s["pinned"] == 0, s
        blob = pickle.dumps(w)
        assert len(blob) < 20_000  # the paths, not the tokens
        w2 = pickle.loads(blob)
        assert type(w2._tokens).__name__ == "TokenFiles" and len(w2) == len(w)
        for b in fl.Loader(w2, 10, device="cpu", with_index=True):
            np.testing.assert_array_equal(b["tokens"].numpy(), ref[b["index"].numpy()])
    # Unpickled where the budget is large: the same windows, mapped as arrays.
    w3 = pickle.loads(blob)
    assert isinstance(w3._tokens, list)
    for b in fl.Loader(w3, 10, device="cpu", with_index=True):
        np.testing.assert_array_equal(b["tokens"].numpy(), ref[b["index"].numpy()])


def test_windows_from_files_past_the_budget_refuse_what_map_file_refuses(tmp_path):
    paths, _ = token_files(tmp_path / "t", 20)
    with _mapping.mapping_budget(4):
        with pytest.raises(FileNotFoundError, match="missing.bin"):
            fl.Windows.from_files(paths + [str(tmp_path / "missing.bin")], np.uint16, 2)
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(ValueError, match="fifo: not a regular file"):
            fl.Windows.from_files(paths + [str(tmp_path / "fifo")], np.uint16, 2)
        np.zeros(3, np.uint8).tofile(tmp_path / "odd.bin")
        with pytest.raises(ValueError, match="odd.bin: 3 bytes is not a whole number of rows of 2 bytes"):
            fl.Windows.from_files(paths + [str(tmp_path / "odd.bin")], np.uint16, 2)


def swap_in(path, other):
    os.rename(other, path)


@pytest.mark.parametrize("which", ["x/000040.npy", "r/000040.offsets.npy", "r/000040.values.npy"])
def test_a_shard_swapped_after_the_epoch_began_is_named_where_it_is_mapped(tmp_path, which):
    write_dir(tmp_path / "d", 100, rows_per_shard=1)
    with _mapping.mapping_budget(8):
        ds = fl.Dataset.open(tmp_path / "d")
        loader = fl.Loader(ds, 10, device="cpu", num_threads=1, prefetch=1)
        it = iter(loader)  # the per-iter() check passes: nothing changed yet
        next(it)
        target = tmp_path / "d" / which
        copy = tmp_path / "copy.npy"
        copy.write_bytes(target.read_bytes())  # the same bytes, another file
        swap_in(target, copy)
        with pytest.raises(ValueError, match=rf"batch \d+ of epoch 0 .*{which}: the file was replaced by another "
                                             r"file \(a new inode\) since it was opened"):
            for _ in it:
                pass
        with pytest.raises(fl.DatasetError, match=rf"{which}: the shard was replaced"):
            iter(loader)  # and the next iter() names it before any batch


def test_a_token_file_changed_after_from_files_is_named_at_iter_and_where_mapped(tmp_path):
    paths, _ = token_files(tmp_path / "t", 60, seed=1)
    paths = [p for p in paths if os.path.getsize(p) >= 8]
    with _mapping.mapping_budget(4):
        w = fl.Windows.from_files(paths, np.uint16, 4)
        loader = fl.Loader(w, 4, device="cpu", num_threads=1, prefetch=1)
        it = iter(loader)
        next(it)
        last = paths[-1]
        with open(last, "ab") as f:
            f.write(b"\0\0")  # grown: the mapped bytes would still be there, but it is not the file opened
        with pytest.raises(ValueError, match=rf"{os.path.basename(last)}: the file is \d+ bytes, but it was \d+ when it "
                                             "was opened: it was written to"):
            for _ in it:
                pass
        with pytest.raises(ValueError, match=rf"{os.path.basename(last)}: the token file is \d+ bytes.*written to; call "
                                             "Windows.from_files again"):
            iter(loader)


def test_a_lazy_ragged_row_longer_than_the_manifest_says_is_named_when_mapped(tmp_path):
    write_dir(tmp_path / "d", 60, rows_per_shard=2, longest=5)
    m = json.loads((tmp_path / "d" / "manifest.json").read_text())
    m["columns"][2]["longest"] = 2
    (tmp_path / "d" / "manifest.json").write_text(json.dumps(m))
    with _mapping.mapping_budget(8):
        ds = fl.Dataset.open(tmp_path / "d")
        with pytest.raises(ValueError, match=r"ragged column r, shard \d+ \(\S*r/\d+\.offsets\.npy\): row \d+ holds [3-5] "
                                             r"items, longer than the manifest's columns\[\]\.longest \(2\) for column 'r'"):
            for _ in fl.Loader(ds, 8, device="cpu"):
                pass
        # max_length at or below `longest`: the cut is the one asked for, no error.
        ds = fl.Dataset.open(tmp_path / "d", max_length=2)
        r = ragged_rows(60, 5)
        for b in fl.Loader(ds, 8, device="cpu", with_index=True):
            for j, i in enumerate(b["index"].numpy()):
                assert b["r_lengths"][j] == min(len(r[i]), 2)


def test_a_lazy_ragged_offsets_file_that_is_corrupt_is_named(tmp_path):
    write_dir(tmp_path / "d", 40, rows_per_shard=2)
    path = tmp_path / "d" / "r" / "000003.offsets.npy"
    a = np.load(path)
    a[1] = a[2] + 1  # decreasing, same size
    raw = path.read_bytes()
    header = len(raw) - a.nbytes
    path.write_bytes(raw[:header] + a.tobytes())
    with _mapping.mapping_budget(8):
        ds = fl.Dataset.open(tmp_path / "d")  # opened after the change: its identity is the new one
        with pytest.raises(ValueError, match=r"ragged column r, shard 3 \(\S*r/000003\.offsets\.npy\): offsets are not "
                                             r"non-decreasing from 0 to \d+: row \d+ has offsets \[\d+, \d+\)"):
            for _ in fl.Loader(ds, 8, device="cpu"):
                pass


def test_a_mix_reads_lazily_mapped_sources_like_eager_ones(tmp_path):
    # The mixture gathers from each child source natively: a lazily mapped child is no different.
    paths, _ = token_files(tmp_path / "t", 80, seed=2)
    big = np.arange(4000, dtype=np.uint16) % 997
    big.tofile(tmp_path / "big.bin")

    def batches(budget):
        with _mapping.mapping_budget(budget):
            lazy = fl.Windows.from_files(paths, np.uint16, 5, 3)
            eager = fl.Windows.from_files([str(tmp_path / "big.bin")], np.uint16, 5, 3)
            kinds = (type(lazy._tokens).__name__, type(eager._tokens).__name__)
            mix = fl.Mix({"many": lazy, "one": eager}, weights={"many": 0.5, "one": 0.5}, with_source=True)
            loader = fl.Loader(mix, 16, steps=30, shuffle=True, seed=7, device="cpu", num_threads=3,
                               with_index=True)
            return kinds, [{k: v.numpy().copy() for k, v in b.items()} for b in loader]

    (lazy_kind, _), got = batches(6)
    (eager_kind, _), want = batches(1 << 20)
    assert (lazy_kind, eager_kind) == ("TokenFiles", "list")
    assert len(got) == len(want) == 30
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        for k in g:
            np.testing.assert_array_equal(g[k], w[k])


def test_a_forked_child_reads_a_lazy_source_through_its_own_cache(tmp_path):
    x, y, r = write_dir(tmp_path / "d", 40)
    with _mapping.mapping_budget(4):
        ds = fl.Dataset.open(tmp_path / "d")
        for b in fl.Loader(ds, 8, shuffle=True, device="cpu", num_threads=2, with_index=True):
            check_batch(b, x, y, r)  # the parent's cache holds mappings, its threads have run
        pid = os.fork()
        if pid == 0:  # the child: its own LazyFiles and cache, never the parent's lock
            status = 1
            try:
                for b in fl.Loader(ds, 8, shuffle=True, device="cpu", num_threads=2, with_index=True):
                    check_batch(b, x, y, r)
                status = 0 if _mapping.mapping_cache().stats()["maps"] > 0 else 2
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        for b in fl.Loader(ds, 8, device="cpu", with_index=True):  # the parent's still works
            check_batch(b, x, y, r)


# -------------------------------------------------------------------- past vm.max_map_count
MANY = """
    import os, resource, sys, numpy as np, fastload as fl
    kind, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))
    with open("/proc/sys/vm/max_map_count") as f:
        limit = int(f.read())
    assert n > limit  # one mapping per file would not fit
    if kind in ("dir", "ragged"):
        src = fl.Dataset.open(os.path.join(root, "d"))
    else:
        paths = [os.path.join(root, "t", f"{k}.bin") for k in range(n)]
        src = fl.Windows.from_files(paths, np.uint16, 2)
    loader = fl.Loader(src, 256, shuffle=True, device="cpu", num_threads=2, with_index=True)
    seen = np.zeros(len(src), np.int64)
    peak = 0
    for k, b in enumerate(loader):
        idx = b["index"].numpy()
        seen[idx] += 1
        if kind == "dir":
            assert (b["x"].numpy() == idx * 3 + 1).all()
        elif kind == "ragged":
            n_items = b["r_lengths"].numpy()
            assert (n_items == idx % 3).all()
            for j, i in enumerate(idx):
                assert (b["r"].numpy()[j, :n_items[j]] == i).all()
        else:
            assert (b["tokens"].numpy() == (idx % 60000)[:, None]).all()
        if k % 50 == 0:
            with open("/proc/self/maps") as f:
                peak = max(peak, sum(1 for _ in f))
    assert (seen == 1).all()
    print(type(getattr(src, "_maps", getattr(src, "_tokens", None))).__name__, peak, limit)
"""


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/sys/vm/max_map_count"), reason="Linux's mapping limit")
@pytest.mark.parametrize("kind", ["dir", "ragged", "files"])
def test_more_files_than_vm_max_map_count_under_a_descriptor_limit_of_1024(tmp_path, kind):
    # 100,000 one-row shards; 40,000 ragged shards (80,000 files); 70,000 token files: each more
    # files than vm.max_map_count (65,530 by default) allows mappings. Before: Loader() failed
    # ("cannot map the shard (Cannot allocate memory ... vm.max_map_count)").
    with open("/proc/sys/vm/max_map_count") as f:
        limit = int(f.read())
    if limit > 100_000:
        pytest.skip(f"vm.max_map_count is {limit} here: these file counts fit")
    if kind == "dir":
        n = 100_000
        fl.write_dataset(tmp_path / "d", {"x": np.arange(n, dtype=np.int64) * 3 + 1}, rows_per_shard=1,
                         fsync=False, checksum=False)
    elif kind == "ragged":
        n = 40_000
        fl.write_dataset(tmp_path / "d", {"r": [np.full(i % 3, i, np.int32) for i in range(n)]}, rows_per_shard=1,
                         fsync=False, checksum=False)
    else:
        n = 70_000
        (tmp_path / "t").mkdir()
        for k in range(n):
            np.full(2, k % 60000, np.uint16).tofile(tmp_path / "t" / f"{k}.bin")
    files = 2 * n if kind == "ragged" else n
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(MANY), kind, str(tmp_path), str(files)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kind_name, peak, limit = proc.stdout.split()
    assert kind_name in ("_LazyShards", "TokenFiles")
    assert int(peak) < int(limit) // 2  # the mappings stayed well under the limit


def test_the_mapping_limit_hint_says_the_mappings_in_use_and_the_limit(monkeypatch):
    from fastload._columns import mapping as _mapping

    monkeypatch.setattr(_mapping, "_max_map_count", lambda: 65530)
    monkeypatch.setattr(_mapping, "_mappings_in_use", lambda: 65529)
    assert _mapping.mapping_limit_hint().startswith("this process holds 65529 memory mappings and the system allows "
                                                    "65530 (vm.max_map_count)")
    for missing in ("_max_map_count", "_mappings_in_use"):  # not Linux, or /proc unreadable
        with monkeypatch.context() as m:
            m.setattr(_mapping, missing, lambda: None)
            assert _mapping.mapping_limit_hint() == ("the process may have reached its limit of memory mappings "
                                                     "(vm.max_map_count)")
