"""Sources over time: a copied or pickled Dataset/Windows owns what it reads (memmaps travel as
their file, everything else by value), and a source changed under a Loader is reported by the
next iter()/split() instead of being read from freed memory or a truncated file."""
from __future__ import annotations

import concurrent.futures
import copy
import gc
import hashlib
import json
import multiprocessing
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import fastload as fl


def first_batch(source, batch_size=64, seed=3):
    loader = fl.Loader(source, batch_size=batch_size, shuffle=True, seed=seed, with_index=True, device="cpu")
    return {k: v.numpy().copy() if v.dtype != torch.bfloat16 else v.view(torch.int16).numpy().copy()
            for k, v in next(iter(loader)).items()}


def expected(array, ids):
    a = array.view(torch.int16) if isinstance(array, torch.Tensor) and array.dtype == torch.bfloat16 else array
    return np.asarray(a)[ids] if not isinstance(a, torch.Tensor) else a[torch.from_numpy(ids)].numpy()


def assert_dataset_reads(ds, columns):
    batch = first_batch(ds)
    for name, array in columns.items():
        np.testing.assert_array_equal(batch[name], expected(array, batch["index"]), err_msg=name)


def windows_expected(tokens, ids, length, stride):
    tokens = np.asarray(tokens)
    return np.stack([tokens[i * stride:i * stride + length] for i in ids])


@pytest.fixture
def memmap_file(tmp_path, rng):
    path = tmp_path / "data.npy"
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(1000, 256))
    arr[:] = rng.standard_normal((1000, 256))
    arr.flush()
    del arr
    return path


# ---------------------------------------------------------------------------- copies and pickles
def test_deepcopy_keeps_no_address_of_the_original():
    # The reproducer: the copy's batches must come from the copy's own memory.
    x = np.arange(1000)
    ds2 = copy.deepcopy(fl.Dataset({"x": x}))
    del x
    gc.collect()
    junk = [np.full(1000, 7) for _ in range(50)]
    got = next(iter(fl.Loader(ds2, 1000, device="cpu")))["x"].numpy()
    assert np.array_equal(got, np.arange(1000)), got[:10]
    del junk


def test_deepcopy_of_tensor_columns_and_windows_outlives_the_original():
    t = torch.arange(4000, dtype=torch.int32).reshape(1000, 4)
    w_tokens = torch.arange(5000, dtype=torch.int64)
    ds2 = copy.deepcopy(fl.Dataset({"t": t}))
    w2 = copy.deepcopy(fl.Windows(w_tokens, 9, 4))
    del t, w_tokens
    gc.collect()
    junk = [torch.full((4000,), 7, dtype=torch.int32) for _ in range(50)]
    assert np.array_equal(next(iter(fl.Loader(ds2, 1000, device="cpu")))["t"].numpy(),
                          np.arange(4000, dtype=np.int32).reshape(1000, 4))
    got = first_batch(w2)
    np.testing.assert_array_equal(got["tokens"], windows_expected(np.arange(5000), got["index"], 9, 4))
    del junk


def test_a_deepcopy_is_independent_of_the_original():
    x = np.arange(100)
    ds2 = copy.deepcopy(fl.Dataset({"x": x}))
    x[:] = -1
    assert np.array_equal(next(iter(fl.Loader(ds2, 100, device="cpu")))["x"].numpy(), np.arange(100))


def test_a_shallow_copy_shares_the_arrays():
    x = np.arange(100)
    ds = fl.Dataset({"x": x})
    ds2 = copy.copy(ds)
    x[:] = 5
    assert (next(iter(fl.Loader(ds2, 100, device="cpu")))["x"].numpy() == 5).all()


def in_memory_columns(rng, n=500):
    base = rng.standard_normal((2 * n, 3)).astype(np.float32)
    return {
        "f32": rng.standard_normal((n, 3)).astype(np.float32),
        "strided": base[::2],                                     # leading stride with gaps
        "reversed": np.arange(n, dtype=np.int16)[::-1],           # negative leading stride
        "broadcast": np.broadcast_to(np.arange(6, dtype=np.uint8).reshape(2, 3), (n, 2, 3)),
        "tensor": torch.arange(n * 2, dtype=torch.int64).reshape(n, 2),
        "bf16": torch.randn(n, 5).to(torch.bfloat16),
        "tensor_strided": torch.arange(n * 4, dtype=torch.float64).reshape(2 * n, 2)[::2],
        "tensor_broadcast": torch.tensor([1, 2, 3], dtype=torch.int32).expand(n, 3),
        "bool": torch.from_numpy(rng.integers(0, 2, n).astype(bool)),
        "c64": (rng.standard_normal(n) + 1j * rng.standard_normal(n)).astype(np.complex64),
    }


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_pickle_round_trip_of_in_memory_columns_is_exact(rng, protocol):
    cols = in_memory_columns(rng)
    ds = pickle.loads(pickle.dumps(fl.Dataset(cols), protocol=protocol))
    assert ds.names == list(cols) and len(ds) == 500
    assert_dataset_reads(ds, cols)


def test_pickling_a_broadcast_column_does_not_materialise_it():
    huge = fl.Dataset({"x": np.broadcast_to(np.arange(3, dtype=np.uint8), (2**40, 3)),
                       "t": torch.arange(3).expand(2**40, 3)})
    data = pickle.dumps(huge)
    assert len(data) < 2000
    batch = next(iter(fl.Loader(pickle.loads(data), 4, shuffle=True, device="cpu")))
    assert (batch["x"].numpy() == [0, 1, 2]).all() and (batch["t"].numpy() == [0, 1, 2]).all()
    assert len(copy.deepcopy(huge)) == 2**40


def memmap_views(path):
    mm = np.load(path, mmap_mode="r")
    return {
        "whole": mm,
        "rows": mm[100:300],
        "every_third": mm[::3],
        "reversed": mm[::-1],
        "asarray": np.asarray(mm)[7:507],
        "np.memmap": np.memmap(path, dtype=np.float32, mode="r", offset=128 + 1024 * 10, shape=(500, 256)),
    }


@pytest.mark.parametrize("view", ["whole", "rows", "every_third", "reversed", "asarray", "np.memmap"])
def test_memmap_columns_pickle_by_file_and_read_exactly(memmap_file, view):
    arr = memmap_views(memmap_file)[view]
    ds = fl.Dataset({"x": arr, "y": np.arange(len(arr))})
    data = pickle.dumps(ds)
    assert len(data) < 8 * len(arr) + 2000  # y by value, x only as its file: never the 1 MB of x
    restored = pickle.loads(data)
    assert isinstance(restored._columns["x"].base, np.memmap)  # mapped again, not copied
    assert_dataset_reads(restored, {"x": np.array(arr), "y": np.arange(len(arr))})
    deep = copy.deepcopy(ds)
    assert_dataset_reads(deep, {"x": np.array(arr)})


def test_pickle_of_a_memmap_dataset_is_tiny(memmap_file):
    ds = fl.Dataset({"x": np.load(memmap_file, mmap_mode="r")})
    assert len(pickle.dumps(ds)) < 500  # the file is 1 MB
    w = fl.Windows(np.memmap(memmap_file, dtype=np.uint16, mode="r"), length=33, stride=16)
    data = pickle.dumps(w)
    assert len(data) < 500
    w2 = pickle.loads(data)
    assert len(w2) == len(w)
    got = first_batch(w2)
    tokens = np.fromfile(memmap_file, dtype=np.uint16)
    np.testing.assert_array_equal(got["tokens"], windows_expected(tokens, got["index"], 33, 16))


def test_a_writable_memmap_is_mapped_again_without_truncating_its_file(tmp_path):
    path = tmp_path / "w.bin"
    mm = np.memmap(path, dtype=np.int32, mode="w+", shape=(100, 4))
    mm[:] = np.arange(400).reshape(100, 4)
    mm.flush()
    ds2 = pickle.loads(pickle.dumps(fl.Dataset({"x": mm})))
    assert np.array_equal(next(iter(fl.Loader(ds2, 100, device="cpu")))["x"].numpy(), np.arange(400).reshape(100, 4))
    assert path.stat().st_size == 1600


def test_pickling_a_tensor_dataset_under_multiprocessing_leaves_its_storage_in_place():
    # torch's multiprocessing reducer would move the storage to shared memory (share_memory_()),
    # changing the source under a Loader that is reading it.
    from multiprocessing.reduction import ForkingPickler

    t = torch.arange(1000, dtype=torch.float32)
    loader = fl.Loader(fl.Dataset({"t": t}), 100, device="cpu")
    before = t.untyped_storage().data_ptr()
    ForkingPickler.dumps(loader.dataset)
    assert t.untyped_storage().data_ptr() == before and not t.is_shared()
    assert len(list(loader)) == 10


def _checksums_in_child(sources):
    out = []
    for source in sources:
        loader = fl.Loader(source, batch_size=50, shuffle=True, seed=11, with_index=True, device="cpu")
        batch = next(iter(loader))
        out.append((batch["index"].numpy().copy(),
                    {k: hashlib.sha256(v.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
                     for k, v in batch.items() if k != "index"}))
    return out


def _digest(array):
    return hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()


@pytest.mark.slow
def test_sources_sent_to_a_spawned_process_read_exactly(memmap_file, rng):
    mm = np.load(memmap_file, mmap_mode="r")
    tokens = np.memmap(memmap_file, dtype=np.uint16, mode="r")
    mem = rng.standard_normal((300, 7))
    t = torch.arange(300 * 3, dtype=torch.int32).reshape(300, 3)
    mem_tokens = torch.arange(2000, dtype=torch.int64)
    sources = [fl.Dataset({"x": mm[::2]}), fl.Dataset({"mem": mem, "t": t}), fl.Windows(tokens, 65, 64),
               fl.Windows(mem_tokens, 10, 3)]
    t_ptr = t.untyped_storage().data_ptr()
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        results = pool.submit(_checksums_in_child, sources).result(timeout=120)
    assert t.untyped_storage().data_ptr() == t_ptr  # sending did not move the parent's tensor
    (i0, d0), (i1, d1), (i2, d2), (i3, d3) = results
    assert d0 == {"x": _digest(np.asarray(mm[::2])[i0])}
    assert d1 == {"mem": _digest(mem[i1]), "t": _digest(t.numpy()[i1])}
    assert d2 == {"tokens": _digest(windows_expected(np.asarray(tokens), i2, 65, 64))}
    assert d3 == {"tokens": _digest(windows_expected(mem_tokens.numpy(), i3, 10, 3))}


# ---------------------------------------------------------------------------- changed sources
def _grow(t):
    t.resize_(10_000)


def _shrink(t):
    t.resize_(10)


def _set(t):
    t.set_(torch.zeros(1000))


def _assign_data(t):
    t.data = torch.ones(1000)


def _free_storage(t):
    t.untyped_storage().resize_(0)


def _share(t):
    t.share_memory_()


TENSOR_CHANGES = [_share, _grow, _shrink, _set, _assign_data, _free_storage]


@pytest.mark.parametrize("change", TENSOR_CHANGES, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("start", ["iter", "split"])
def test_a_tensor_changed_under_the_loader_is_reported_by_the_next_iter(change, start):
    t = torch.arange(1000, dtype=torch.float32)
    loader = fl.Loader(fl.Dataset({"y": torch.zeros(1000), "feat": t}), batch_size=100, device="cpu")
    assert len(list(loader)) == 10
    change(t)
    with pytest.raises(ValueError, match=r"column 'feat' changed since the Loader was built .*must not be resized"):
        iter(loader) if start == "iter" else loader.split(["cpu", "cpu"])
    with pytest.raises(ValueError, match="'feat' changed"):  # and it stays refused
        iter(loader)


def test_a_tensor_replaced_by_set_cannot_free_what_an_epoch_in_progress_reads():
    t = torch.arange(100_000, dtype=torch.int64)
    loader = fl.Loader(fl.Dataset({"x": t}), batch_size=1000, device="cpu", prefetch=2)
    it = iter(loader)
    first = next(it)["x"].numpy().copy()
    t.set_(torch.full((10,), -1))  # the old storage stays alive: the threads read through an alias
    gc.collect()
    rest = np.concatenate([b["x"].numpy() for b in it])
    assert np.array_equal(np.concatenate([first, rest]), np.arange(100_000))


def test_tokens_changed_under_the_loader_are_reported():
    tokens = torch.arange(1000, dtype=torch.int64)
    loader = fl.Loader(fl.Windows(tokens, 10), batch_size=10, device="cpu")
    tokens.share_memory_()
    with pytest.raises(ValueError, match="tokens 'tokens' changed since the Loader was built"):
        iter(loader)


def test_a_numpy_array_resized_under_the_loader_is_reported():
    a = np.arange(1000.0)
    loader = fl.Loader(fl.Dataset({"a": a}), batch_size=100, device="cpu")
    with pytest.raises(ValueError, match="cannot resize"):  # numpy itself refuses while referenced
        a.resize(5000)
    a.resize(5000, refcheck=False)  # frees the memory the loader was built on
    with pytest.raises(ValueError, match=r"column 'a' changed since the Loader was built \(address"):
        iter(loader)


def test_the_owner_of_a_view_resized_under_the_loader_is_reported():
    owner = np.arange(1000.0)
    loader = fl.Loader(fl.Dataset({"v": owner[100:600]}), batch_size=100, device="cpu")
    owner.resize(50_000, refcheck=False)
    with pytest.raises(ValueError, match=r"column 'v' changed .*owner address"):
        iter(loader)


def test_an_unchanged_source_starts_every_epoch(memmap_file):
    loader = fl.Loader(fl.Dataset({"x": np.load(memmap_file, mmap_mode="r"), "t": torch.arange(1000)}),
                       batch_size=300, device="cpu")
    for _ in range(3):
        assert len(list(loader)) == 4
    assert len(loader.split(["cpu", "cpu"])) == 2


def test_a_tensor_changed_before_the_dataset_is_used_is_a_clear_error():
    t = torch.arange(100)
    ds = fl.Dataset({"t": t})
    t.resize_(50)
    with pytest.raises(ValueError, match="column 't' now has 50 rows, but the Dataset was built with 100"):
        fl.Loader(ds, 10, device="cpu")


# Every truncation case runs in one subprocess (without the check, reading past the end of the
# file kills the process with SIGBUS); each case maps its own copy of the file.
TRUNCATE = """
    import json, os, shutil, sys, numpy as np, fastload as fl
    original, results = sys.argv[1], {}
    sources = {"dataset": lambda p: fl.Dataset({"x": np.load(p, mmap_mode="r")}),
               "view": lambda p: fl.Dataset({"x": np.load(p, mmap_mode="r")[500:]}),
               "windows": lambda p: fl.Windows(np.memmap(p, dtype=np.uint8, mode="r"), 64, 64)}
    starts = {"iter": lambda loader: list(loader), "split": lambda loader: [list(i) for i in loader.split(["cpu", "cpu"])]}
    for kind, make in sources.items():
        for start_name, start in list(starts.items()) + [("construction", None)]:
            path = f"{original}.{kind}.{start_name}"
            shutil.copy(original, path)
            try:
                source = make(path)
                if start is None:
                    os.truncate(path, 4096)
                loader = fl.Loader(source, batch_size=100, shuffle=True, device="cpu")
                assert len(list(loader)) > 0
                os.truncate(path, 4096)
                start(loader)
            except ValueError as e:
                results[f"{kind}-{start_name}"] = [path, str(e)]
            else:
                results[f"{kind}-{start_name}"] = [path, "no error"]
    print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def truncation_results(tmp_path_factory):
    path = tmp_path_factory.mktemp("truncate") / "data.npy"
    np.save(path, np.random.default_rng(0).standard_normal((1000, 256)).astype(np.float32))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(TRUNCATE), str(path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    return json.loads(proc.stdout)


@pytest.mark.parametrize("start", ["iter", "split", "construction"])
@pytest.mark.parametrize("kind", ["dataset", "view", "windows"])
def test_a_truncated_memmap_file_is_reported_by_name_not_sigbus(truncation_results, kind, start):
    path, message = truncation_results[f"{kind}-{start}"]
    assert path in message and "truncated" in message and "is 4096 bytes" in message, message


def test_a_memmap_file_that_grew_is_fine(memmap_file):
    loader = fl.Loader(fl.Dataset({"x": np.load(memmap_file, mmap_mode="r")}), batch_size=100, device="cpu")
    with open(memmap_file, "ab") as f:
        f.write(b"\0" * 4096)
    assert len(list(loader)) == 10
