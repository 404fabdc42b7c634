"""Huge and mistyped values: a ValueError/TypeError/MemoryError at construction naming the
argument and its value, never a pybind cast error, std::bad_alloc, a hang or a crash; plan() of an
enormous source fails at once or runs interruptibly with the GIL released."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest
import torch

import fastload as fl

DS = fl.Dataset({"x": np.arange(10)})


@pytest.mark.parametrize("kwargs,exc,match", [
    (dict(batch_size=2**41), ValueError, "batch_size must be at most 2\\*\\*40, got 2199023255552"),
    (dict(batch_size=2**63), ValueError, "batch_size must be at most 2\\*\\*40, got 9223372036854775808"),
    (dict(batch_size=2**100), ValueError, "batch_size must be at most"),
    (dict(prefetch=2**31), ValueError, "prefetch must be at most 65536, got 2147483648"),
    (dict(prefetch=2**64), ValueError, "prefetch must be at most 65536, got 18446744073709551616"),
    (dict(num_threads=2**31), ValueError, "num_threads must be at most 4096 .*got 2147483648"),
    (dict(num_threads=10**7), ValueError, "num_threads must be at most 4096 .*got 10000000"),
    (dict(copy_streams=2**31), ValueError, "copy_streams must be at most 1024, got 2147483648"),
    (dict(rank=0, world_size=2**62), ValueError, "world_size must be at most 2\\*\\*40, got 4611686018427387904"),
    (dict(rank=5, world_size=2**41), ValueError, "world_size must be at most 2\\*\\*40, got 2199023255552"),
    (dict(batch_size=2**30, rank=0, world_size=2**11), ValueError,
     "batch_size \\* world_size must be at most 2\\*\\*40, got batch_size=1073741824 and world_size=2048"),
    (dict(rank=2**63, world_size=2**64), ValueError, "world_size must be at most"),
])
def test_huge_loader_arguments_are_refused_at_construction(kwargs, exc, match):
    kwargs.setdefault("batch_size", 4)
    with pytest.raises(exc, match=match):
        fl.Loader(DS, device="cpu", **kwargs)


def test_the_largest_accepted_values_still_work():
    loader = fl.Loader(DS, batch_size=2**40, num_threads=2, prefetch=65536, device="cpu")
    assert [len(b["x"]) for b in loader] == [10]
    assert fl.Loader(DS, batch_size=2**20, rank=3, world_size=2**20, device="cpu").plan(0).tolist() == [3]


def test_world_size_from_the_environment_is_bounded(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(2**62))
    with pytest.raises(ValueError, match="world_size must be at most 2\\*\\*40, got 4611686018427387904"):
        fl.Loader(DS, batch_size=2, device="cpu")


@pytest.mark.parametrize("set_var,unset_var", [("RANK", "WORLD_SIZE"), ("WORLD_SIZE", "RANK")])
def test_half_of_the_rank_environment_is_an_error(monkeypatch, set_var, unset_var):
    monkeypatch.delenv(unset_var, raising=False)
    monkeypatch.setenv(set_var, "1")
    with pytest.raises(ValueError, match=f"the environment sets {set_var}='1' but not {unset_var}"):
        fl.Loader(DS, batch_size=2, device="cpu")
    # explicit values still win over a half-set environment
    assert fl.Loader(DS, batch_size=2, rank=0, world_size=1, device="cpu").world_size == 1


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int64])
def test_a_windows_stride_whose_byte_pitch_overflows_is_refused(dtype):
    tokens = np.arange(10, dtype=dtype)
    itemsize = np.dtype(dtype).itemsize
    stride = 2**63 // itemsize  # stride * itemsize == 2**63
    with pytest.raises(ValueError, match=f"stride must be at most .*got {stride}"):
        fl.Windows(tokens, 5, stride=stride)
    if itemsize > 1:
        with pytest.raises(ValueError, match="stride must be at most .*got 4611686018427387904"):
            fl.Windows(torch.from_numpy(tokens), 5, stride=2**62)
    w = fl.Windows(tokens, 5, stride=stride - 1)  # the largest pitch that fits: one window
    assert len(w) == 1 and next(iter(fl.Loader(w, 4, device="cpu")))["tokens"].tolist() == [[0, 1, 2, 3, 4]]


def test_a_batch_larger_than_memory_is_a_memory_error_naming_batch_size():
    rows = np.broadcast_to(np.zeros((1, 2**20), np.uint8), (10**7, 2**20))  # 10 TB of rows, 1 MB held
    with pytest.raises(MemoryError, match="a batch of batch_size=1000000 takes 1048576000000 bytes"):
        fl.Loader(fl.Dataset({"x": rows}), batch_size=10**6, device="cpu")


def test_prefetch_whose_buffers_exceed_memory_is_a_memory_error_naming_prefetch():
    from fastload._arguments import memory_limit

    row = 2**20
    batch = memory_limit() // row // 4 + 1  # a batch over a quarter of memory: 4 of them do not fit
    rows = np.broadcast_to(np.zeros((1, row), np.uint8), (batch, row))
    with pytest.raises(MemoryError, match="prefetch=4 keeps up to 5 batches"):
        fl.Loader(fl.Dataset({"x": rows}), batch_size=batch, prefetch=4, device="cpu")


def test_the_default_prefetch_stays_within_a_quarter_of_memory_however_many_threads():
    from fastload._arguments import memory_limit

    row = 2**20
    batch = memory_limit() // row // 20  # 5% of memory per batch: 5 fit in a quarter
    rows = np.broadcast_to(np.zeros((1, row), np.uint8), (batch, row))
    assert fl.Loader(fl.Dataset({"x": rows}), batch_size=batch, num_threads=64, device="cpu").stats().prefetch == 5
    assert fl.Loader(fl.Dataset({"x": rows}), batch_size=batch, num_threads=3, device="cpu").stats().prefetch == 3
    huge = np.broadcast_to(np.zeros((1, row), np.uint8), (memory_limit() // row // 4 + 1, row))
    assert fl.Loader(fl.Dataset({"x": huge}), batch_size=len(huge), num_threads=8, device="cpu").stats().prefetch == 2


def test_batch_bytes_overflowing_size_t_are_refused_before_reaching_the_core():
    # 1,024 columns of 2**53-byte rows: 2**64 bytes per 2-row batch wrap size_t to 0 in the core
    # (a segfault). The views point far outside their buffer: nothing may touch them, so this runs
    # in a subprocess.
    code = textwrap.dedent("""
        import numpy as np, fastload as fl
        base = np.zeros(1, np.uint8)
        view = np.lib.stride_tricks.as_strided(base, shape=(2, 2**53), strides=(0, 1))
        ds = fl.Dataset({f"c{i}": view for i in range(1024)})
        try:
            fl.Loader(ds, batch_size=2, device="cpu")
        except MemoryError as e:
            print("MemoryError:", e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "MemoryError: a batch of batch_size=2 takes 18446744073709551616 bytes" in proc.stdout, proc.stdout
    assert "over 1024 part(s)" in proc.stdout


def test_a_column_whose_total_bytes_overflow_int64_is_refused():
    t = torch.zeros(1, dtype=torch.int64).expand(2**62)  # 2**62 rows x 8 bytes
    with pytest.raises(ValueError, match="column 't' is too large to address: 4611686018427387904 rows x 8 bytes"):
        fl.Dataset({"t": t})
    ok = np.broadcast_to(np.zeros(1, np.uint8), (2**62,))  # 2**62 bytes: fits, as numpy requires
    assert len(fl.Dataset({"x": ok})) == 2**62


def test_a_source_of_more_than_2_62_samples_is_refused():
    over = fl.Dataset({"x": np.broadcast_to(np.zeros(1, np.uint8), (2**62 + 1,))})
    with pytest.raises(ValueError, match="source has 4611686018427387905 samples; fastload takes at most 2\\*\\*62"):
        fl.Loader(over, batch_size=1, device="cpu")


def test_a_one_row_tensor_whose_byte_stride_overflows_is_refused():
    t = torch.zeros(1, 3).as_strided((1, 3), (2**62, 1))  # one row: torch allows any leading stride
    with pytest.raises(ValueError, match="column 't' is too large to address"):
        fl.Dataset({"t": t})


# ---------------------------------------------------------------------------- refused kinds
def test_masked_arrays_are_refused():
    with pytest.raises(TypeError, match="column 'm' is a numpy masked array.*ignore the mask"):
        fl.Dataset({"m": np.ma.masked_array(np.arange(5), mask=[0, 1, 0, 0, 0])})
    with pytest.raises(TypeError, match="tokens 'tokens' is a numpy masked array"):
        fl.Windows(np.ma.masked_array(np.arange(50, dtype=np.uint16)), 5)


def test_nested_tensors_are_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the strided nested layout warns that it is a prototype
        strided = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)])
        jagged = torch.nested.nested_tensor([torch.zeros(2, 4), torch.zeros(3, 4)], layout=torch.jagged)
    for t in (strided, jagged):
        with pytest.raises(TypeError, match="column 'n' is a nested tensor"):
            fl.Dataset({"n": t})


def test_masked_tensors_are_refused():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = torch.masked.masked_tensor(torch.arange(4.0), torch.tensor([True, False, True, True]))
        with pytest.raises(TypeError, match="column 'm' is a MaskedTensor"):
            fl.Dataset({"m": m})


@pytest.mark.parametrize("array", [
    np.array([object(), object()]),
    np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")]),
    np.zeros(3, dtype=np.dtype((np.void, 4))),
    np.zeros(3, dtype=np.dtype([("a", "<i4")])),
    np.array(["ab", "c"]),
], ids=["object", "structured", "void", "one-field", "str"])
def test_object_and_structured_dtypes_are_refused(array):
    with pytest.raises(TypeError, match="column 'x' has unsupported dtype"):
        fl.Dataset({"x": array})
    with pytest.raises(TypeError, match="unsupported dtype"):
        fl.Windows(array, 1)


# ---------------------------------------------------------------------------- resume state
def _state(**changes):
    loader = fl.Loader(fl.Dataset({"x": np.arange(100)}), batch_size=8, shuffle=True, device="cpu")
    it = iter(loader)
    next(it)
    return {**loader.state_dict(), **changes}


@pytest.mark.parametrize("changes,match", [
    (dict(epoch=2**62 + 1), r"state\['epoch'\] must be a non-negative integer at most 2\*\*62, got 4611686018427387905"),
    (dict(epoch=2**64), r"state\['epoch'\] must be .*got 18446744073709551616"),
    (dict(epoch=-1), r"state\['epoch'\] must be a non-negative integer"),
    (dict(epoch=1.0), r"state\['epoch'\] must be a non-negative integer"),
    (dict(position=101), r"state\['position'\] must be a non-negative integer at most the dataset length 100, got 101"),
    (dict(position=2**63), r"state\['position'\] must be .*got 9223372036854775808"),
    (dict(shuffle="False"), r"state\['shuffle'\] must be a bool, got 'False'"),
    (dict(shuffle=1), r"state\['shuffle'\] must be a bool, got 1"),
    (dict(drop_last="no"), r"state\['drop_last'\] must be a bool, got 'no'"),
    (dict(even="wrap"), r"state\['even'\] must be one of .*got 'wrap'"),
    (dict(order=["random"]), r"state\['order'\] must be one of .*got \['random'\]"),
    (dict(batch_size=0), r"state\['batch_size'\] must be an integer of at least 1"),
    (dict(world_size=2**62), r"state\['world_size'\] must be an integer of at least 1 at most 2\*\*40"),
    (dict(num_samples=True), r"saved for a dataset of True samples"),
    (dict(version=True), r"state version True is not supported"),
])
def test_load_state_dict_refuses_values_out_of_range_or_of_the_wrong_type(changes, match):
    loader = fl.Loader(fl.Dataset({"x": np.arange(100)}), batch_size=8, shuffle=True, device="cpu")
    with pytest.raises(ValueError, match=match):
        loader.load_state_dict(_state(**changes))


def test_the_shuffle_flag_of_a_state_is_not_coerced():
    # bool("False") is True: a state of an unshuffled run must not resume a shuffled loader
    unshuffled = fl.Loader(fl.Dataset({"x": np.arange(100)}), batch_size=8, device="cpu")
    state = {**unshuffled.state_dict(), "shuffle": "False"}
    with pytest.raises(ValueError, match="must be a bool"):
        fl.Loader(fl.Dataset({"x": np.arange(100)}), batch_size=8, shuffle=True, device="cpu").load_state_dict(state)


def test_edge_states_are_accepted():
    loader = fl.Loader(fl.Dataset({"x": np.arange(100)}), batch_size=8, shuffle=True, device="cpu")
    loader.load_state_dict(_state(epoch=2**62, position=100))
    assert list(loader) == []  # nothing left of that epoch
    loader.load_state_dict(_state(shuffle=np.bool_(True), epoch=np.int64(3), position=np.int64(96)))
    assert [len(b["x"]) for b in loader] == [4]


# ---------------------------------------------------------------------------- plan()
HUGE = fl.Dataset({"x": np.broadcast_to(np.zeros(1, np.uint8), (2**62,))})


@pytest.mark.parametrize("kwargs", [dict(), dict(shuffle=True), dict(rank=5, world_size=2**10, shuffle=True),
                                    dict(batch_size=2**30, rank=1, world_size=2**10)])
def test_plan_of_an_enormous_source_fails_at_once(kwargs):
    kwargs.setdefault("batch_size", 1)
    loader = fl.Loader(HUGE, device="cpu", **kwargs)
    assert len(loader) > 0
    t0 = time.perf_counter()
    with pytest.raises(MemoryError, match=r"plan of epoch 3 holds \d+ sample ids .*more than this machine's memory"):
        loader.plan(3)
    assert time.perf_counter() - t0 < 1.0


def _plan_loader():
    # 2**25 ids (256 MiB), shuffled in blocks: about a second of work
    ds = fl.Dataset({"x": np.broadcast_to(np.zeros(1, np.uint8), (2**25,))})
    return fl.Loader(ds, batch_size=1000, shuffle=True, order="block", device="cpu")


def test_plan_is_exact_across_slices():
    # Slices of 2**20 ids cut batches in the middle: the result equals the batches themselves.
    ds = fl.Dataset({"x": np.broadcast_to(np.zeros(1, np.uint8), (3 * 2**20 + 17,))})
    loader = fl.Loader(ds, batch_size=100_003, shuffle=True, rank=1, world_size=3, even="pad", device="cpu")
    sampler = loader._schedule.samplers(1)[0]
    ref = np.concatenate([sampler.batch_ids(0, 0, s)[0] for s in range(len(loader))])
    assert np.array_equal(loader.plan(0), ref)


@pytest.mark.slow
def test_plan_releases_the_gil_and_stops_on_ctrl_c():
    loader = _plan_loader()
    ticks, done = [0], threading.Event()

    def count():
        while not done.is_set():
            ticks[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    t0 = time.perf_counter()
    ids = loader.plan(0)
    full = time.perf_counter() - t0
    done.set()
    counter.join()
    assert len(ids) == 2**25
    assert ticks[0] > 1000, ticks  # the other thread ran while the plan was computed
    del ids

    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
    t0 = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        loader.plan(0)
        time.sleep(10)  # only reached if the plan ignored the signal
    interrupted = time.perf_counter() - t0
    timer.join()
    assert interrupted < max(0.5 * full, 0.3), (interrupted, full)
