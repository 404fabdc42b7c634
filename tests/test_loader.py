"""The CPU Loader against numpy: every sample once per epoch, values equal arr[index] for every
column, dtypes kept, order independent of threads and prefetch, batches owned by the user."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import fastload as fl
from fastload import _C


def collect(loader):
    return [{k: v.clone() for k, v in b.items()} for b in loader]


def make_columns(rng, n):
    return {
        "f32": rng.standard_normal((n, 3)).astype(np.float32),
        "i64": np.arange(n, dtype=np.int64) * 7,
        "u16": rng.integers(0, 65535, (n, 2, 5), dtype=np.uint16),
        "b": rng.integers(0, 2, n).astype(bool),
        "f16": rng.standard_normal((n, 4)).astype(np.float16),
        "i8": rng.integers(-128, 127, (n, 1), dtype=np.int8),
        "f64": rng.standard_normal(n),
        "c64": (rng.standard_normal((n, 2)) + 1j * rng.standard_normal((n, 2))).astype(np.complex64),
        "u8": rng.integers(0, 255, (n, 33), dtype=np.uint8),  # odd row size: the generic copy path
    }


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_and_values_match(rng, shuffle, drop_last):
    n, b = 1003, 64
    cols = make_columns(rng, n)
    loader = fl.Loader(fl.Dataset(cols), batch_size=b, shuffle=shuffle, drop_last=drop_last, seed=3,
                       with_index=True)
    batches = collect(loader)
    assert len(batches) == len(loader) == (n // b if drop_last else -(-n // b))
    index = torch.cat([x["index"] for x in batches]).numpy()
    if drop_last:
        assert len(index) == n // b * b and len(np.unique(index)) == len(index)
    else:
        assert np.array_equal(np.sort(index), np.arange(n))
    if not shuffle:
        assert np.array_equal(index, np.arange(len(index)))
    for batch in batches:
        idx = batch["index"].numpy()
        for name, arr in cols.items():
            t = batch[name]
            assert t.dtype == torch.from_numpy(arr[:1]).dtype, name
            np.testing.assert_array_equal(t.numpy(), arr[idx], err_msg=name)


def test_memmap_source_is_read_in_place(tmp_path, rng):
    path = tmp_path / "x.npy"
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(5000, 16))
    arr[:] = rng.standard_normal((5000, 16))
    arr.flush()
    mm = np.load(path, mmap_mode="r")
    loader = fl.Loader(fl.Dataset({"x": mm}), batch_size=256, shuffle=True, with_index=True)
    for batch in loader:
        np.testing.assert_array_equal(batch["x"].numpy(), mm[batch["index"].numpy()])


def test_torch_tensor_columns_including_bfloat16(rng):
    n = 300
    x = torch.randn(n, 4, dtype=torch.bfloat16)
    y = torch.arange(n, dtype=torch.int32)
    u = torch.arange(n, dtype=torch.int64).to(torch.uint16)
    loader = fl.Loader(fl.Dataset({"x": x, "y": y, "u": u}), batch_size=32, shuffle=True, with_index=True)
    for batch in loader:
        idx = batch["index"]
        assert batch["x"].dtype == torch.bfloat16 and batch["u"].dtype == torch.uint16
        assert torch.equal(batch["x"], x[idx])
        assert torch.equal(batch["y"], y[idx])
        assert torch.equal(batch["u"].to(torch.int64), u[idx].to(torch.int64))


def test_strided_rows_are_gathered(rng):
    base = rng.standard_normal((400, 6)).astype(np.float32)
    every_other = base[::2]  # rows contiguous, leading stride twice the row
    transposed_view = np.ascontiguousarray(base.T).T  # column-major: rows not contiguous
    loader = fl.Loader(fl.Dataset({"x": every_other}), batch_size=50, shuffle=True, with_index=True)
    for batch in loader:
        np.testing.assert_array_equal(batch["x"].numpy(), every_other[batch["index"].numpy()])
    with pytest.raises(ValueError, match="not contiguous"):
        fl.Dataset({"x": transposed_view})


@pytest.mark.parametrize("length,stride", [(1025, 1024), (16, 16), (10, 3), (7, 20)])
def test_windows_match_numpy_slices(rng, length, stride):
    tokens = rng.integers(0, 50_000, 20_000, dtype=np.uint16)
    win = fl.Windows(tokens, length=length, stride=stride)
    assert len(win) == (len(tokens) - length) // stride + 1
    loader = fl.Loader(win, batch_size=8, shuffle=True, with_index=True)
    seen = []
    for batch in loader:
        assert batch["tokens"].dtype == torch.uint16 and batch["tokens"].shape[1] == length
        for row, i in zip(batch["tokens"].numpy(), batch["index"].numpy()):
            np.testing.assert_array_equal(row, tokens[i * stride:i * stride + length])
        seen.append(batch["index"].numpy())
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(len(win)))


@pytest.mark.parametrize("threads,prefetch", [(1, 1), (2, 4), (4, 2), (8, 16)])
def test_order_is_independent_of_threads_and_prefetch(rng, threads, prefetch):
    cols = {"x": rng.standard_normal((777, 5)).astype(np.float32)}
    ref = fl.Loader(fl.Dataset(cols), batch_size=20, shuffle=True, seed=9, num_threads=1, prefetch=1)
    got = fl.Loader(fl.Dataset(cols), batch_size=20, shuffle=True, seed=9, num_threads=threads, prefetch=prefetch)
    for epoch in range(2):
        ref.set_epoch(epoch)
        got.set_epoch(epoch)
        a, b = collect(ref), collect(got)
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert torch.equal(x["x"], y["x"])


def test_epochs_differ_and_iter_advances_the_epoch(rng):
    loader = fl.Loader(fl.Dataset({"x": np.arange(500)}), batch_size=50, shuffle=True, seed=1)
    e0 = torch.cat([b["x"] for b in loader])
    e1 = torch.cat([b["x"] for b in loader])  # a plain second iter() is epoch 1
    loader.set_epoch(0)
    again = torch.cat([b["x"] for b in loader])
    assert not torch.equal(e0, e1)
    assert torch.equal(e0, again)
    assert torch.equal(torch.sort(e1).values, torch.arange(500))


def test_same_seed_same_order_across_loaders():
    ds = fl.Dataset({"x": np.arange(1000)})
    a = torch.cat([b["x"] for b in fl.Loader(ds, batch_size=64, shuffle=True, seed=5)])
    b = torch.cat([b["x"] for b in fl.Loader(ds, batch_size=64, shuffle=True, seed=5)])
    c = torch.cat([b["x"] for b in fl.Loader(ds, batch_size=64, shuffle=True, seed=6)])
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_held_batches_never_change_and_list_works(rng):
    # More batches than buffers in flight: holding them all must neither block nor alias.
    x = rng.standard_normal((4096, 8)).astype(np.float32)
    loader = fl.Loader(fl.Dataset({"x": x}), batch_size=16, shuffle=True, prefetch=2, with_index=True)
    held = list(loader)
    assert len(held) == 256
    more = list(loader)  # another epoch while the first is still held
    for batch in held + more:
        np.testing.assert_array_equal(batch["x"].numpy(), x[batch["index"].numpy()])


def test_loader_memory_is_bounded_by_prefetch(rng):
    x = rng.standard_normal((20_000, 64)).astype(np.float32)
    prefetch = 3
    loader = fl.Loader(fl.Dataset({"x": x}), batch_size=100, shuffle=True, prefetch=prefetch)
    for _ in range(3):
        for batch in loader:  # a training loop: one batch held at a time
            batch["x"].sum()
    del batch  # the loop variable still holds the last batch
    stats = loader._memory()
    # The window, the batch the loop variable holds while next() hands over the following one,
    # and one spare; recycled, never reallocated.
    assert stats["host_buffers"] <= prefetch + 2, stats
    assert stats["host_allocations"] <= prefetch + 2, stats
    held = list(loader)
    del held
    gc.collect()
    iter(loader)  # an epoch boundary trims what the held epoch made the pool grow to
    assert loader._memory()["host_buffers"] <= prefetch + 2


def test_batch_outlives_its_loader(rng):
    x = rng.standard_normal((100, 3)).astype(np.float32)
    loader = fl.Loader(fl.Dataset({"x": x}), batch_size=10, with_index=True)
    batch = next(iter(loader))
    del loader
    gc.collect()
    np.testing.assert_array_equal(batch["x"].numpy(), x[batch["index"].numpy()])


def test_mask_adds_valid_column_and_partial_batches():
    loader = fl.Loader(fl.Dataset({"x": np.arange(10)}), batch_size=4, rank=2, world_size=3, even="mask",
                       with_index=True)
    batches = list(loader)
    assert [len(b["x"]) for b in batches] == [len(b["valid"]) for b in batches]
    assert batches[-1]["valid"].dtype == torch.bool
    # 10 samples padded to 12 over 3 ranks: rank 2 ends with the two padded positions.
    assert not batches[-1]["valid"][-1]


def test_partial_last_batch_and_drop_last():
    ds = fl.Dataset({"x": np.arange(10)})
    assert [len(b["x"]) for b in fl.Loader(ds, batch_size=4)] == [4, 4, 2]
    assert [len(b["x"]) for b in fl.Loader(ds, batch_size=4, drop_last=True)] == [4, 4]
    assert [len(b["x"]) for b in fl.Loader(ds, batch_size=16)] == [10]


def test_plan_matches_iteration():
    loader = fl.Loader(fl.Dataset({"x": np.arange(1001)}), batch_size=32, shuffle=True, seed=4,
                       rank=1, world_size=3, with_index=True)
    loader.set_epoch(2)
    got = torch.cat([b["index"] for b in loader]).numpy()
    assert np.array_equal(loader.plan(2), got)


def test_zero_width_rows():
    loader = fl.Loader(fl.Dataset({"e": np.zeros((10, 0), np.float32), "x": np.arange(10)}), batch_size=4)
    shapes = [tuple(b["e"].shape) for b in loader]
    assert shapes == [(4, 0), (4, 0), (2, 0)]


@pytest.fixture(params=["ordinary stores", "streaming stores"])
def copy_kind(request):
    """Runs a test with batch copies below and above the streaming threshold (normally half the
    last-level cache: tens of MB); restores the default after."""
    if request.param == "streaming stores":
        _C._set_streaming_min_part_bytes(0)
    try:
        yield request.param
    finally:
        _C._set_streaming_min_part_bytes(-1)


def test_streaming_threshold_defaults_to_half_the_last_level_cache():
    assert _C._last_level_cache_bytes() > 0
    assert _C._streaming_min_part_bytes() == _C._last_level_cache_bytes() // 2


@pytest.mark.parametrize("row_bytes", [16 * 1024, 16 * 1024 + 7, 150 * 1024, 40_001, 1000])
def test_large_rows_match_with_either_copy(rng, row_bytes, copy_kind):
    # Odd sizes leave destinations unaligned, exercising the head and tail of the streaming copy.
    x = rng.integers(0, 255, (64, row_bytes), dtype=np.uint8)
    loader = fl.Loader(fl.Dataset({"x": x, "y": np.arange(64)}), batch_size=5, shuffle=True, with_index=True)
    for batch in loader:
        np.testing.assert_array_equal(batch["x"].numpy(), x[batch["index"].numpy()])
        np.testing.assert_array_equal(batch["y"].numpy(), batch["index"].numpy())


def test_sharded_large_rows_match_with_either_copy(rng, copy_kind):
    # A sharded column copies a batch in blocks of addresses: each block takes the part's choice.
    shards = [rng.integers(0, 255, (n, 20_000), dtype=np.uint8) for n in (3, 300, 1, 97)]
    whole = np.concatenate(shards)
    loader = fl.Loader(fl.Dataset({"x": shards}), batch_size=300, shuffle=True, with_index=True)
    for batch in loader:
        np.testing.assert_array_equal(batch["x"].numpy(), whole[batch["index"].numpy()])


def test_abandoned_epochs_give_their_buffers_back(rng):
    # Iterators kept alive after a new iter() must not pin their prefetched buffers.
    prefetch = 3
    loader = fl.Loader(fl.Dataset({"x": rng.standard_normal((5000, 32)).astype(np.float32)}), batch_size=50,
                       shuffle=True, prefetch=prefetch)
    abandoned = []
    for _ in range(6):
        it = iter(loader)
        next(it)
        abandoned.append(it)
    gc.collect()
    stats = loader._memory()
    # The pool side holds at most prefetch+2; the 6 batches taken (dropped) are back or freed.
    assert stats["host_buffers"] <= prefetch + 2, stats
    assert stats["host_allocations"] <= prefetch + 3, stats



def test_an_iter_nothing_was_taken_from_does_not_use_up_its_epoch():
    loader = fl.Loader(fl.Dataset({"x": np.arange(100)}), 10, shuffle=True, with_index=True, device="cpu")
    iter(loader)  # Lightning's sanity iter(): no batch taken
    iter(loader)
    first = torch.cat([b["index"] for b in loader]).numpy()
    assert np.array_equal(first, loader.plan(0))  # still epoch 0
    peek = next(iter(loader))  # a peek takes a batch: epoch 1 is used up
    assert np.array_equal(peek["index"].numpy(), loader.plan(1)[:10])
    assert np.array_equal(torch.cat([b["index"] for b in loader]).numpy(), loader.plan(2))
    assert loader.state_dict()["epoch"] == 3


def test_an_unconsumed_resumed_epoch_keeps_its_position():
    ds = fl.Dataset({"x": np.arange(100)})
    loader = fl.Loader(ds, 10, shuffle=True, with_index=True, device="cpu")
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    resumed = fl.Loader(ds, 10, shuffle=True, with_index=True, device="cpu")
    resumed.load_state_dict(state)
    iter(resumed)  # nothing taken
    rest = torch.cat([b["index"] for b in resumed]).numpy()
    assert np.array_equal(rest, loader.plan(0)[30:])


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_default_prefetch_follows_a_byte_budget_but_keeps_every_thread_busy(threads):
    def prefetch(rows, row_floats, batch, **kw):
        ds = fl.Dataset({"x": np.zeros((rows, row_floats), np.float32)})
        return fl.Loader(ds, batch, device="cpu", num_threads=threads, **kw).stats().prefetch

    assert prefetch(10_000, 16, 256) == max(32, threads)  # 16 KiB batches: the budget's upper end
    assert prefetch(1000, 4096, 64) == max(16, threads)  # 1 MiB batches: 16 fit in 16 MiB
    assert prefetch(1000, 4096, 64, with_index=True) == max(15, threads)  # the ids count too
    assert prefetch(1000, 40_000, 64) == max(2, threads)  # 10 MB batches: one fits; one per thread
    assert prefetch(10, 40_000, 64) == max(10, threads)  # a batch holds at most the dataset (1.6 MB)
    assert prefetch(10, 1, 2, prefetch=7) == 7  # given: as given


def test_default_prefetch_on_a_gpu_adds_a_place_per_copy_stream():
    from fastload._loader import default_prefetch
    from fastload._config import default_config
    ds = fl.Dataset({"x": np.zeros((1000, 40_000), np.float32)})

    def batch_bytes_of(source, batch_size):  # one full batch, as the Loader sizes it
        return default_config(source, batch_size, "cpu").batch_bytes

    assert default_prefetch(batch_bytes_of(ds, 64), num_threads=2, copy_streams=0) == 2
    assert default_prefetch(batch_bytes_of(ds, 64), num_threads=2, copy_streams=3) == 5
    assert default_prefetch(batch_bytes_of(ds, 1), num_threads=2, copy_streams=3) == 32


def test_numpy_bfloat16_from_ml_dtypes_arrives_as_torch_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.arange(40, dtype=np.float32).reshape(20, 2)
    loader = fl.Loader(fl.Dataset({"x": x.astype(ml_dtypes.bfloat16)}), 8, with_index=True, device="cpu")
    for b in loader:
        assert b["x"].dtype == torch.bfloat16
        np.testing.assert_array_equal(b["x"].float().numpy(), x[b["index"].numpy()])


@pytest.mark.parametrize("env, share", [
    ({"LOCAL_WORLD_SIZE": "4"}, 4),
    ({"SLURM_NTASKS_PER_NODE": "2(x3)"}, 2),
    ({"LOCAL_RANK": "1", "WORLD_SIZE": "8", "NUM_NODES": "2"}, 4),  # Lightning
    ({"LOCAL_RANK": "3", "WORLD_SIZE": "4"}, 4),  # Accelerate on one node without GPUs
    ({}, 1),
])
def test_the_thread_share_follows_what_the_launcher_tells(monkeypatch, env, share):
    from fastload import _environment
    for k in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE", "LOCAL_RANK", "WORLD_SIZE", "NUM_NODES",
              "SLURM_NNODES", "NNODES"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert _environment.local_world_size() == share
    assert _environment.default_num_threads() == max(1, _environment.usable_cpus() // share)


def test_len_after_split_is_what_each_device_iterator_yields():
    loader = fl.Loader(fl.Dataset({"x": np.arange(1000)}), 10, device="cpu")
    assert len(loader) == 100
    its = loader.split(["cpu", "cpu", "cpu"])
    assert len(loader) == len(its[0]) == 34  # 1000 samples over 3 devices of 10: 34 steps, the last partial
    assert [sum(1 for _ in it) for it in its] == [len(loader)] * 3
    list(loader)
    assert len(loader) == 100
