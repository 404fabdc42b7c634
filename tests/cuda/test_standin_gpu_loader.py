"""The CUDA transfer engine against the stand-in driver (tests/fake_cuda): "device" memory is host
memory, every stream is a thread with random delays, and the stand-in reports each misuse it can
see (unpinned copy sources, slots rewritten before their copy ran, device memory read before the
consumer waited or rewritten before its release, handles used after destroy, busy streams at
destroy). Batches come back as raw device parts read through the driver on the consumer's stream.

The driver is loaded once per process, so this module points FASTLOAD_LIBCUDA at the stand-in
before anything loads it; cases that need another driver (none, the stub, no device) run in a
subprocess."""
from __future__ import annotations

import ctypes
import gc
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload as fl
from fastload import _gpu_memory

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: fake_cuda
from fake_cuda import build as fake_build  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU is present: tests/cuda covers it")


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    path = fake_build.build(tmp_path_factory.mktemp("fake_cuda"))
    os.environ["FASTLOAD_LIBCUDA"] = str(path)
    lib = ctypes.CDLL(str(path))
    lib.fake_cuda_configure.argtypes = [ctypes.c_char_p, ctypes.c_longlong]
    lib.fake_cuda_stat.argtypes = [ctypes.c_char_p]
    lib.fake_cuda_stat.restype = ctypes.c_longlong
    lib.path = path
    lib.fake_cuda_configure(b"max_delay_us", 100)
    return lib


def misuses(lib) -> list[str]:
    out = []
    for i in range(lib.fake_cuda_misuse_count()):
        buf = ctypes.create_string_buffer(1024)
        lib.fake_cuda_misuse_message(i, buf, len(buf))
        out.append(buf.value.decode(errors="replace"))
    return out


@pytest.fixture
def driver(fake):
    """The stand-in, with a check that the test made no misuse the stand-in could see."""
    fake.fake_cuda_reset_misuses()
    fake.fake_cuda_configure(b"fail_alloc_after", -1)
    fake.fake_cuda_configure(b"fail_copy_after", -1)
    yield fake
    gc.collect()
    fl._C._flush_deferred_frees()  # the next test's counts start from here
    assert misuses(fake) == []


def gpu_loader(source, batch_size, device="cuda:0", **kwargs) -> fl.Loader:
    loader = fl.Loader(source, batch_size, device=device, **kwargs)
    loader._raw_device_batches = True
    return loader


def read(part, dtype) -> np.ndarray:
    return np.frombuffer(part.read(), dtype=dtype).reshape(part.shape)


DTYPES = [np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64,
          np.float16, np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("row_shape", [(), (3, 5)])
def test_device_values_equal_numpy(driver, dtype, row_shape):
    rng = np.random.default_rng(7)
    x = (rng.integers(0, 100, (501,) + row_shape) % (2 if dtype is np.bool_ else 100)).astype(dtype)
    y = np.arange(501, dtype=np.int64)
    loader = gpu_loader(fl.Dataset({"x": x, "y": y}), 64, shuffle=True, seed=3, with_index=True, copy_streams=2)
    seen = []
    for batch in loader:
        ids = read(batch["index"], np.int64)
        np.testing.assert_array_equal(read(batch["x"], dtype), x[ids])
        np.testing.assert_array_equal(read(batch["y"], np.int64), ids)
        assert batch["x"].device == 0
        seen.append(ids)
    assert np.array_equal(np.concatenate(seen), loader.plan(0))


def test_windows_and_mask_on_the_device(driver):
    tokens = np.arange(10_000, dtype=np.uint16)
    loader = gpu_loader(fl.Windows(tokens, length=65, stride=64), 16, shuffle=True, with_index=True,
                        rank=1, world_size=3, even="mask")
    n = 0
    for batch in loader:
        ids = read(batch["index"], np.int64)
        want = np.stack([tokens[i * 64:i * 64 + 65] for i in ids])
        np.testing.assert_array_equal(read(batch["tokens"], np.uint16), want)
        assert read(batch["valid"], np.bool_).dtype == np.bool_
        n += 1
    assert n == len(loader)


def test_a_mix_on_the_device_is_the_cpu_mix(driver):
    # A Mix with its "source" part, in steps, on two devices after split(): every part copied
    # matches the CPU loader's batch and numpy indexing of the sources.
    parts = {f"s{j}": np.arange(j * 1000, j * 1000 + n, dtype=np.int32) for j, n in enumerate([300, 40, 90])}
    mix = fl.Mix({k: fl.Dataset({"x": v}) for k, v in parts.items()}, {"s0": 5, "s1": 2, "s2": 3}, with_source=True)
    everything = np.concatenate(list(parts.values()))
    kw = dict(shuffle=True, seed=4, with_index=True, steps=25, prefetch=3)
    cpu = fl.Loader(mix, 10, device="cpu", **kw)
    cpu_its = cpu.split(["cpu", "cpu"])
    gpu = gpu_loader(mix, 10, copy_streams=2, **kw)
    gpu_its = gpu.split(["cuda:0", "cuda:0"])
    for d in range(2):
        n = 0
        for a, b in zip(cpu_its[d], gpu_its[d]):
            ids = read(b["index"], np.int64)
            np.testing.assert_array_equal(ids, a["index"].numpy())
            np.testing.assert_array_equal(read(b["source"], np.int64), a["source"].numpy())
            np.testing.assert_array_equal(read(b["x"], np.int32), everything[ids])
            np.testing.assert_array_equal(np.bincount(read(b["source"], np.int64), minlength=3), [5, 2, 3])
            n += 1
        assert n == 25
    assert [s.samples for s in gpu.stats().sources.values()] == [250, 100, 150]


def test_the_order_is_the_cpu_order(driver):
    x = np.arange(1000)
    kw = dict(shuffle=True, seed=11, with_index=True, prefetch=3)
    cpu = [b["index"].numpy() for b in fl.Loader(fl.Dataset({"x": x}), 50, device="cpu", **kw)]
    gpu = [read(b["index"], np.int64) for b in gpu_loader(fl.Dataset({"x": x}), 50, copy_streams=3, **kw)]
    assert len(cpu) == len(gpu)
    for a, b in zip(cpu, gpu):
        np.testing.assert_array_equal(a, b)


def test_slots_and_device_buffers_are_recycled_and_bounded(driver):
    x = np.random.default_rng(0).standard_normal((4000, 256)).astype(np.float32)
    prefetch, streams = 3, 2
    loader = gpu_loader(fl.Dataset({"x": x}), 100, shuffle=True, prefetch=prefetch, copy_streams=streams)
    for _ in range(3):
        for batch in loader:
            del batch
    mem = loader._memory()
    # Device: what the pool keeps, allocated when the first epoch starts (the window, the batch
    # handed out and the loop variable); parts the user drops are reused after their release.
    assert mem["device_buffers"] == prefetch + 2, mem
    assert mem["device_allocations"] == prefetch + 2, mem
    # Pinned: the window and the copies in flight (streams + 1), allocated when the first epoch
    # starts, none more.
    assert mem["pinned_buffers"] == prefetch + streams + 1, mem
    assert mem["host_allocations"] == mem["pinned_buffers"], mem  # allocated once, reused
    assert mem["pinned_bytes"] > 0 and mem["host_bytes"] == 0, mem


def test_holding_one_column_keeps_only_that_columns_memory(driver):
    x = np.zeros((2000, 1024), np.float32)
    y = np.arange(2000)
    loader = gpu_loader(fl.Dataset({"x": x, "y": y}), 10, prefetch=2)
    labels = [batch["y"] for batch in loader]  # an evaluation loop keeping the labels
    mem = loader._memory()
    x_part = 10 * 1024 * 4
    # 200 label parts are held; the features of those batches are not.
    assert mem["device_bytes"] < 200 * 10 * 8 + 8 * x_part, mem
    np.testing.assert_array_equal(np.concatenate([read(p, np.int64) for p in labels]), y)


def test_held_batches_stay_intact_over_later_epochs(driver):
    x = np.arange(3000, dtype=np.int64).reshape(1000, 3)
    loader = gpu_loader(fl.Dataset({"x": x}), 40, shuffle=True, with_index=True, prefetch=2)
    held = [next(iter(loader)) for _ in range(2)]
    for _ in range(3):
        for _batch in loader:
            pass
    for batch in held:
        np.testing.assert_array_equal(read(batch["x"], np.int64), x[read(batch["index"], np.int64)])


def test_a_batch_outlives_its_loader(driver):
    x = np.arange(500, dtype=np.float64)
    loader = gpu_loader(fl.Dataset({"x": x}), 50, with_index=True)
    batch = next(iter(loader))
    del loader
    gc.collect()
    np.testing.assert_array_equal(read(batch["x"], np.float64), x[read(batch["index"], np.int64)])


@pytest.mark.parametrize("how", ["break", "del", "close", "new_epoch"])
def test_shutdown_while_copies_are_in_flight(driver, how):
    driver.fake_cuda_configure(b"max_delay_us", 2000)  # copies still queued when we stop
    try:
        x = np.ones((5000, 512), np.float32)
        loader = gpu_loader(fl.Dataset({"x": x}), 64, prefetch=6, copy_streams=3)
        it = iter(loader)
        first = next(it)
        if how == "del":
            del it, loader
        elif how == "close":
            loader.close()
        elif how == "new_epoch":
            next(iter(loader))
        gc.collect()
        assert read(first["x"], np.float32).sum() == 64 * 512
    finally:
        driver.fake_cuda_configure(b"max_delay_us", 100)


def test_a_driver_error_surfaces_from_next(driver):
    loader = gpu_loader(fl.Dataset({"x": np.arange(10_000)}), 100, prefetch=2)
    driver.fake_cuda_configure(b"fail_copy_after", 5)
    it = iter(loader)
    with pytest.raises(RuntimeError, match="cuMemcpyHtoDAsync"):
        for _ in it:
            pass
    driver.fake_cuda_configure(b"fail_copy_after", -1)
    assert sum(1 for _ in loader) == 100  # the next epoch works


def test_a_collation_error_surfaces_from_next_on_a_gpu_output(driver):
    loader = gpu_loader(fl.Dataset({"x": np.arange(1000)}), 10)
    loader._fail_at_batch = 7
    with pytest.raises(RuntimeError, match="batch 7 of epoch 0"):
        list(loader)


def test_split_onto_two_devices_from_two_threads(driver):
    x = np.arange(20_000, dtype=np.int64)
    loader = gpu_loader(fl.Dataset({"x": x}), 32, shuffle=True, with_index=True, copy_streams=2)
    its = loader.split(["cuda:0", "cuda:1"])
    got: dict[int, list] = {0: [], 1: []}

    def consume(d):
        for batch in its[d]:
            assert batch["x"].device == d
            ids = read(batch["index"], np.int64)
            np.testing.assert_array_equal(read(batch["x"], np.int64), x[ids])
            got[d].append(ids)

    threads = [threading.Thread(target=consume, args=(d,)) for d in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    a, b = np.concatenate(got[0]), np.concatenate(got[1])
    assert len(np.intersect1d(a, b)) == 0
    assert np.array_equal(np.sort(np.concatenate([a, b])), x)


def test_split_with_two_engines_on_one_device(driver):
    x = np.arange(3000, dtype=np.int64)
    loader = gpu_loader(fl.Dataset({"x": x}), 30, with_index=True)
    a, b = loader.split(["cuda:0", "cuda:0"])
    ids = []
    for ba, bb in zip(a, b):
        for batch in (ba, bb):
            i = read(batch["index"], np.int64)
            np.testing.assert_array_equal(read(batch["x"], np.int64), x[i])
            ids.append(i)
    assert np.array_equal(np.sort(np.concatenate(ids)), x)


def test_a_device_that_does_not_exist(driver):
    loader = gpu_loader(fl.Dataset({"x": np.arange(10)}), 2, device="cuda:7")
    with pytest.raises(ValueError, match="cuda:7 does not exist"):
        iter(loader)


@pytest.mark.parametrize("misuse, message", [
    ("skip_consumer_wait", "read before"),
    ("skip_release_wait", "overwritten before"),
    ("early_host_release", "rewritten before"),
])
def test_each_misuse_detector_catches_a_deliberately_wrong_engine(fake, misuse, message):
    fake.fake_cuda_reset_misuses()
    fake.fake_cuda_configure(b"max_delay_us", 3000)
    try:
        x = np.arange(40_000, dtype=np.int64).reshape(4000, 10)
        loader = gpu_loader(fl.Dataset({"x": x}), 100, prefetch=4, copy_streams=2)
        loader._engine._set_misuse(misuse)
        for _ in range(2):
            for batch in loader:
                batch["x"].touch()  # a read queued on the consumer stream, as a kernel would
        loader.close()
        gc.collect()
        found = misuses(fake)
        assert any(message in m for m in found), found
    finally:
        fake.fake_cuda_reset_misuses()
        fake.fake_cuda_configure(b"max_delay_us", 100)


def _run_child(code: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True,
                          text=True, timeout=120)


UNAVAILABLE = """
    import ctypes, os, numpy as np, fastload as fl
    if os.environ.get("CONFIGURE"):
        lib = ctypes.CDLL(os.environ["FASTLOAD_LIBCUDA"])
        lib.fake_cuda_configure.argtypes = [ctypes.c_char_p, ctypes.c_longlong]
        key, value = os.environ["CONFIGURE"].split("=")
        lib.fake_cuda_configure(key.encode(), int(value))
    loader = fl.Loader(fl.Dataset({"x": np.arange(10)}), 2, device="cuda")  # touches no driver
    print(list(fl.Loader(fl.Dataset({"x": np.arange(4)}), 2, device="cpu"))[0]["x"].tolist())
    try:
        iter(loader)
    except RuntimeError as e:
        print("RuntimeError:", e)
"""


@pytest.mark.parametrize("case, expected", [
    ("no_driver", "no CUDA driver"),
    ("stub", "stub"),
    ("no_device", "no CUDA device"),
    # A driver that predates an entry point fastload needs (cuGetProcAddress gives NULL for a
    # symbol newer than the driver; cuDevicePrimaryCtxRelease_v2 is CUDA 11.0's): said by name.
    ("old_driver", "lacks cuDevicePrimaryCtxRelease"),
])
def test_without_a_usable_driver_cpu_works_and_cuda_says_why(fake, case, expected):
    env = {"FASTLOAD_LIBCUDA": str(fake.path)}
    if case == "no_driver":
        env["FASTLOAD_LIBCUDA"] = "/nonexistent/libcuda.so.1"
    elif case == "stub":
        env["CONFIGURE"] = "stub=1"
    elif case == "old_driver":
        env["CONFIGURE"] = "driver_version=10000"
    else:
        env["CONFIGURE"] = "device_count=0"
    r = _run_child(UNAVAILABLE, env)
    assert r.returncode == 0, r.stderr
    assert "[0, 1]" in r.stdout
    assert "RuntimeError:" in r.stdout and expected in r.stdout, r.stdout


def test_building_a_gpu_loader_touches_no_driver(fake):
    r = _run_child("""
        import ctypes, os, numpy as np, fastload as fl
        lib = ctypes.CDLL(os.environ["FASTLOAD_LIBCUDA"])
        lib.fake_cuda_stat.argtypes = [ctypes.c_char_p]
        loader = fl.Loader(fl.Dataset({"x": np.arange(10)}), 2, device="cuda:1")
        print("before", lib.fake_cuda_stat(b"contexts_retained"))
        loader._raw_device_batches = True
        it = iter(loader)
        print("after", lib.fake_cuda_stat(b"contexts_retained"))
    """, {"FASTLOAD_LIBCUDA": str(fake.path)})
    assert r.returncode == 0, r.stderr
    assert "before 0" in r.stdout and "after 1" in r.stdout, r.stdout


def test_interpreter_exit_with_copies_in_flight(fake):
    r = _run_child("""
        import numpy as np, fastload as fl, threading
        loader = fl.Loader(fl.Dataset({"x": np.ones((20000, 256), np.float32)}), 256, device="cuda:0",
                           prefetch=8, copy_streams=4)
        loader._raw_device_batches = True
        it = iter(loader)
        kept = [next(it) for _ in range(3)]
        print("ok", flush=True)
    """, {"FASTLOAD_LIBCUDA": str(fake.path), "FAKE_CUDA_MAX_DELAY_US": "5000"})
    assert r.returncode == 0, r.stderr
    assert "ok" in r.stdout
    assert "MISUSE" not in r.stderr, r.stderr


def test_a_busy_consumer_stream_is_respected(driver):
    # Each batch is read by queued work on the consumer stream (as a training step's kernels
    # would) and dropped at once: the engine must order its next copy into that memory after the
    # read (release event), and never hand a batch out before its copy. The stand-in's vector
    # clocks flag any such race whatever the timing.
    driver.fake_cuda_configure(b"max_delay_us", 1000)
    try:
        x = np.arange(60_000, dtype=np.int64).reshape(6000, 10)
        loader = gpu_loader(fl.Dataset({"x": x, "y": np.arange(6000)}), 100, prefetch=3, copy_streams=2, shuffle=True)
        for _ in range(2):
            for batch in loader:
                batch["x"].touch()
                batch["y"].touch()
        mem = loader._memory()
        assert mem["device_buffers"] == 2 * (3 + 2), mem  # what the pools keep: reserved, none more
    finally:
        driver.fake_cuda_configure(b"max_delay_us", 100)


def test_the_loader_counts_what_the_driver_counts(driver):
    before = driver.fake_cuda_stat(b"pinned_bytes"), driver.fake_cuda_stat(b"device_bytes")
    loader = gpu_loader(fl.Dataset({"x": np.zeros((1000, 100), np.float32)}), 50, prefetch=2)
    for _batch in loader:
        pass
    del _batch
    mem = loader._memory()
    assert driver.fake_cuda_stat(b"device_bytes") - before[1] == mem["device_bytes"]
    assert driver.fake_cuda_stat(b"pinned_bytes") - before[0] >= mem["pinned_bytes"] > 0
    loader.close()
    gc.collect()
    assert driver.fake_cuda_stat(b"device_bytes") == before[1]  # close frees what no batch holds


def test_dataset_directory_with_a_ragged_column_on_the_device(driver, tmp_path):
    # A ragged column is two parts (padded slots, then lengths): both are copied like any part.
    rng = np.random.default_rng(2)
    rows = [rng.integers(0, 1000, int(rng.integers(0, 12))).astype(np.int32) for _ in range(700)]
    x = rng.standard_normal((700, 3)).astype(np.float32)
    fl.write_dataset(tmp_path / "d", {"x": x, "r": rows}, rows_per_shard=128)
    loader = gpu_loader(fl.Dataset.open(tmp_path / "d", pad=-1), 64, shuffle=True, with_index=True, copy_streams=2)
    width = max(len(r) for r in rows)
    n = 0
    for batch in loader:
        ids = read(batch["index"], np.int64)
        np.testing.assert_array_equal(read(batch["x"], np.float32), x[ids])
        lengths = read(batch["r_lengths"], np.int64)
        slots = read(batch["r"], np.int32)
        assert slots.shape == (len(ids), width)
        for row, length, k in zip(slots, lengths, ids):
            assert length == len(rows[k])
            np.testing.assert_array_equal(row[:length], rows[k])
            assert (row[length:] == -1).all()
        n += len(ids)
    assert n == 700


def test_the_stall_hint_names_streams_when_the_copies_are_the_bottleneck(driver, caplog):
    # Tiny batches (collation costs next to nothing) and copies the stand-in delays by up to 4 ms
    # each on one stream: the loop waits on the copies, and the hint must say so.
    driver.fake_cuda_configure(b"max_delay_us", 4000)
    try:
        loader = gpu_loader(fl.Dataset({"x": np.zeros((1600, 4), np.float32)}), 4, copy_streams=1, prefetch=8)
        with caplog.at_level(logging.WARNING, logger="fastload"):
            for _batch in loader:
                pass
    finally:
        driver.fake_cuda_configure(b"max_delay_us", 100)
    hints = [r.getMessage() for r in caplog.records if r.name == "fastload"]
    assert len(hints) == 1, hints
    assert "waited for data" in hints[0] and "raise copy_streams (now 1)" in hints[0], hints[0]


def test_stats_count_the_copies_of_each_device(driver):
    loader = gpu_loader(fl.Dataset({"x": np.zeros((1000, 64), np.float32)}), 50, copy_streams=2)
    its = loader.split(["cuda:0", "cuda:1"])
    for it in its:  # each to its end: a transfer thread records its last copies before End
        for _batch in it:
            pass
    s = loader.stats()
    assert s.batches == 20 and s.samples == 1000
    assert sorted(s.copy) == ["cuda:0#0", "cuda:1#1"]
    assert all(c.count == 10 and c.busy_s > 0 for c in s.copy.values())
    assert s.pinned_bytes > 0 and s.device_bytes > 0 and s.host_bytes == 0
    assert "copy cuda:0#0" in str(s)


# ---- What the user's side of the process does with the driver (torch's part on a real GPU)

_R = ctypes.c_int
_VP = ctypes.c_void_p


class User:
    """The user's own driver calls, on the calling thread: device 0's primary context made
    current, streams of its own (as torch.cuda.Stream() makes), captures, synchronisation, and
    kernels that keep a stream busy (like torch.cuda._sleep) or fault."""

    def __init__(self, lib):
        self.lib = lib
        lib.cuGetProcAddress_v2.argtypes = [ctypes.c_char_p, ctypes.POINTER(_VP), ctypes.c_int, ctypes.c_ulonglong,
                                            ctypes.POINTER(ctypes.c_int)]
        lib.fake_cuda_stream_sleep.argtypes = [_VP, ctypes.c_longlong]
        lib.fake_cuda_fault.argtypes = [_VP, ctypes.c_int]
        assert self.fn("cuInit", ctypes.c_uint)(0) == 0
        ctx = _VP()
        assert self.fn("cuDevicePrimaryCtxRetain", ctypes.POINTER(_VP), ctypes.c_int)(ctypes.byref(ctx), 0) == 0
        self.ctx = ctx
        self.current()

    def fn(self, name: str, *argtypes):
        """An entry point of the stand-in, fetched as fastload fetches it."""
        pfn = _VP()
        rc = self.lib.cuGetProcAddress_v2(name.encode(), ctypes.byref(pfn), 12000, 0, ctypes.byref(ctypes.c_int()))
        assert rc == 0 and pfn.value, name
        return ctypes.CFUNCTYPE(_R, *argtypes)(pfn.value)

    def current(self) -> None:
        """Makes device 0 current on the calling thread (torch does this on each of its threads)."""
        assert self.fn("cuCtxSetCurrent", _VP)(self.ctx) == 0

    def stream(self, non_blocking: bool = True) -> int:
        s = _VP()
        assert self.fn("cuStreamCreate", ctypes.POINTER(_VP), ctypes.c_uint)(ctypes.byref(s), int(non_blocking)) == 0
        return s.value

    def synchronize(self, stream: int) -> None:
        assert self.fn("cuStreamSynchronize", _VP)(stream) == 0

    def sleep(self, stream: int, us: int) -> None:
        assert self.lib.fake_cuda_stream_sleep(stream, us) == 0


class Capture:
    """A user's stream capture on a stream of its own, begun and ended on the calling thread (the
    test's thread, which iterates the loader), in global mode unless told otherwise."""

    def __init__(self, lib, mode: int = 0):
        self.user = User(lib)
        self.begin = self.user.fn("cuStreamBeginCapture", _VP, ctypes.c_int)
        self.end = self.user.fn("cuStreamEndCapture", _VP, ctypes.POINTER(_VP))
        self.mode = mode
        self.stream = self.user.stream()

    def __enter__(self):
        assert self.begin(self.stream, self.mode) == 0
        return self

    def __exit__(self, *exc):
        graph = ctypes.c_void_p()
        self.result = self.end(self.stream, ctypes.byref(graph))  # 901: the loader broke the capture


def test_a_users_graph_capture_is_never_broken_by_the_loader(driver):
    # The loader starts, grows its pools (batches held beyond prefetch) and copies while this thread
    # captures a graph in global mode; then a second epoch starts (trimming the grown pools) inside
    # another capture. No call of fastload's, on any thread, may fail or invalidate the capture.
    x = np.arange(30_000, dtype=np.int64).reshape(3000, 10)
    loader = gpu_loader(fl.Dataset({"x": x}), 50, shuffle=True, with_index=True, prefetch=3, copy_streams=2)
    capture = Capture(driver)
    for epoch in range(2):
        with capture:
            it = iter(loader)
            held = [next(it) for _ in range(12)]
        assert capture.result == 0, (epoch, misuses(driver))
        for batch in held:
            np.testing.assert_array_equal(read(batch["x"], np.int64), x[read(batch["index"], np.int64)])
        del held
        for batch in it:
            np.testing.assert_array_equal(read(batch["x"], np.int64), x[read(batch["index"], np.int64)])


def calls(lib, name: str) -> int:
    lib.fake_cuda_calls.argtypes = [ctypes.c_char_p]
    lib.fake_cuda_calls.restype = ctypes.c_longlong
    return lib.fake_cuda_calls(name.encode())


def test_the_steady_state_makes_no_allocation_or_synchronising_call(driver):
    # After a first epoch, a loop that reads each batch on its stream and drops it makes no
    # allocation, free, page-locking or context/stream synchronisation, on any thread: nothing
    # that could stall the device or break a graph capture, and no per-batch cost but the copies.
    x = np.arange(40_000, dtype=np.float32).reshape(4000, 10)
    loader = gpu_loader(fl.Dataset({"x": x, "y": np.arange(4000)}), 100, shuffle=True, prefetch=3, copy_streams=2)

    def epoch() -> int:
        # Two batches alive while the window refills, as in `for batch in loader` at the moment
        # next() hands over the next batch (here made the rule rather than a rare timing).
        n, previous = 0, None
        for batch in loader:
            batch["x"].touch()
            batch["y"].touch()
            time.sleep(0.001)  # the loader runs ahead and refills its window meanwhile
            previous = batch  # noqa: F841 - dropped one step later
            n += 1
        return n

    # Warm-up: the pools grow lazily to this loop's peak (bounded by what they keep between
    # epochs; how soon it is reached depends on timing), and touch() allocates its scratch.
    for _ in range(8):
        grown = calls(driver, "implicit_syncs")
        epoch()
        if calls(driver, "implicit_syncs") == grown:
            break
    else:
        pytest.fail("the pools still grew after 8 epochs")
    gc.collect()  # earlier tests' loaders free their memory now, not while this one is counted
    fl._C._flush_deferred_frees()
    before = {k: calls(driver, k) for k in ("implicit_syncs", "cuMemAlloc", "cuMemHostAlloc", "cuMemFree",
                                            "cuMemFreeHost", "cuMemcpyHtoDAsync")}
    n = epoch() + epoch()
    after = {k: calls(driver, k) for k in before}
    assert after["implicit_syncs"] == before["implicit_syncs"], (before, after)
    assert after["cuMemcpyHtoDAsync"] - before["cuMemcpyHtoDAsync"] == 2 * n  # one copy per column


@pytest.mark.parametrize("num_threads", [1, 3])
def test_an_epoch_allocates_nothing_after_its_first_batch(driver, num_threads):
    # The pinned slots are reserved before the first batch is built and the device buffers before
    # the first copy, as many as the loader can hold at once. A loop that holds the previous batch
    # while next() hands over the following one, and is slower than the loader (so its window is
    # full each time), needs every device buffer. Without the reservation the pools would grow to
    # that during the epoch, at times that depend on the threads (inside a user's graph capture,
    # say). The second epoch allocates nothing at all.
    gc.collect()  # earlier tests' loaders free their memory now, not while this one is counted
    fl._C._flush_deferred_frees()
    x = np.arange(40_000, dtype=np.float32).reshape(4000, 10)
    prefetch, streams = 3, 2
    loader = gpu_loader(fl.Dataset({"x": x}), 100, shuffle=True, with_index=True, prefetch=prefetch,
                        copy_streams=streams, num_threads=num_threads)
    names = ("cuMemHostAlloc", "cuMemAlloc", "cuMemFreeHost", "cuMemFree", "cuMemHostRegister", "implicit_syncs")

    def counts() -> dict:
        return {k: calls(driver, k) for k in names}

    for epoch in range(2):
        before = counts()
        at_first, n = None, 0
        for batch in loader:
            if at_first is None:
                at_first = counts()
            # The loader fills its window meanwhile. (No read(): it would count as an implicit
            # synchronisation; the values are tested above.)
            time.sleep(0.002)
            n += 1
        del batch
        after = counts()
        assert n == 40
        assert after == at_first, (epoch, at_first, after)
        made = {k: after[k] - before[k] for k in names}
        parts = 2  # x and the index
        if epoch == 0:
            assert made["cuMemHostAlloc"] == (prefetch + streams + 1) * parts, made
            assert made["cuMemAlloc"] == (prefetch + 2) * parts, made
        else:
            assert made == dict.fromkeys(names, 0), made
    mem = loader._memory()
    assert mem["device_allocations"] == mem["device_buffers"] == (prefetch + 2) * parts, mem
    assert mem["host_allocations"] == mem["pinned_buffers"] == (prefetch + streams + 1) * parts, mem


# ---- A failed release record

def test_a_failed_release_record_never_lets_the_next_copy_skip_its_wait(driver):
    # The consumer stream (one of the user's) reads each batch late; for some batches the record
    # of the release event fails when the batch dies. The next copy into that memory must still
    # come after the read: the stand-in reports any copy that is not.
    user = User(driver)
    consumer = user.stream()
    driver.fake_cuda_configure(b"max_delay_us", 2000)
    x = np.arange(40_000, dtype=np.int64).reshape(4000, 10)
    loader = gpu_loader(fl.Dataset({"x": x}), 100, with_index=True, prefetch=2, copy_streams=1)
    loader._test_stream = consumer
    try:
        i = 0
        for batch in loader:  # (not enumerate: its result tuple would keep the batch alive)
            batch["x"].touch()  # a read queued on the consumer stream
            if i % 3 == 1:
                driver.fake_cuda_configure(b"fail_event_record_on", consumer)
            del batch
            driver.fake_cuda_configure(b"fail_event_record_on", 0)
            i += 1
        user.synchronize(consumer)
        for batch in loader:  # the memory is still correct and still reused
            np.testing.assert_array_equal(read(batch["x"], np.int64), x[read(batch["index"], np.int64)])
        mem = loader._memory()
        assert mem["device_buffers"] <= 2 * (2 + 2) and mem["device_retired"] == 0, mem  # synchronised instead
    finally:
        driver.fake_cuda_configure(b"fail_event_record_on", 0)
        driver.fake_cuda_configure(b"max_delay_us", 100)


# ---- A batch used on a second stream

def side_stream_epoch(driver, loader, user, side: int, record: bool) -> None:
    """Each batch is read late on a slow side stream that waited for the consumer stream (the
    usual `side.wait_stream(current); with torch.cuda.stream(side): ...`), then dropped."""
    event_create = user.fn("cuEventCreate", ctypes.POINTER(_VP), ctypes.c_uint)
    event_record = user.fn("cuEventRecord", _VP, _VP)
    wait_event = user.fn("cuStreamWaitEvent", _VP, _VP, ctypes.c_uint)
    ready = _VP()
    assert event_create(ctypes.byref(ready), 2) == 0
    for batch in loader:
        assert event_record(ready, loader._test_stream) == 0
        assert wait_event(side, ready, 0) == 0  # side.wait_stream(consumer)
        user.sleep(side, 500)
        batch["x"].touch(side)
        batch["index"].touch(side)
        if record:
            fl.record_stream(batch, side)
        del batch


def test_a_batch_used_on_a_side_stream_is_protected_by_record_stream(driver):
    user = User(driver)
    consumer, side = user.stream(), user.stream()
    x = np.arange(30_000, dtype=np.int64).reshape(3000, 10)
    loader = gpu_loader(fl.Dataset({"x": x}), 100, with_index=True, prefetch=2, copy_streams=2)
    loader._test_stream = consumer
    side_stream_epoch(driver, loader, user, side, record=True)
    user.synchronize(side)
    assert misuses(driver) == []
    for batch in loader:  # the memory is intact and reused as before
        np.testing.assert_array_equal(read(batch["x"], np.int64), x[read(batch["index"], np.int64)])
    assert loader._memory()["device_allocations"] <= 2 * (2 + 2)


def test_without_record_stream_the_side_stream_read_is_overwritten(fake):
    # What record_stream prevents: the stand-in sees the next copy overwrite memory the side
    # stream still reads (the reason it exists; torch's tensor.record_stream would do nothing).
    fake.fake_cuda_reset_misuses()
    try:
        user = User(fake)
        consumer, side = user.stream(), user.stream()
        loader = gpu_loader(fl.Dataset({"x": np.arange(20_000).reshape(2000, 10)}), 100, with_index=True,
                            prefetch=2)
        loader._test_stream = consumer
        side_stream_epoch(fake, loader, user, side, record=False)
        user.synchronize(side)
        assert any("overwritten before the release event" in m for m in misuses(fake)), misuses(fake)
    finally:
        fake.fake_cuda_reset_misuses()


def test_record_stream_arguments(driver):
    user = User(driver)
    side = user.stream()
    loader = gpu_loader(fl.Dataset({"x": np.arange(1000)}), 10, prefetch=2)
    batch = next(iter(loader))
    fl.record_stream(batch, side)
    fl.record_stream({"nested": [batch["x"], (batch["x"], "text", 3)]}, side)  # twice: recorded once
    fl.record_stream(torch.zeros(3), side)  # CPU tensors are not device memory: nothing to do

    class Stream:  # what torch.cuda.Stream offers
        cuda_stream = side
        device = torch.device("cuda", 0)

    fl.record_stream(batch, Stream())
    Stream.device = torch.device("cuda", 1)
    with pytest.raises(ValueError, match="on cuda:0 but the stream is on cuda:1"):
        fl.record_stream(batch, Stream())
    for bad in (True, -1, "0", None):
        with pytest.raises((TypeError, ValueError), match="stream"):
            fl.record_stream(batch, bad)
    ptr = batch["x"].ptr
    assert fl._C._record_stream(0, ptr + 8, side)  # inside the part: a view's address
    del batch
    gc.collect()
    assert not fl._C._record_stream(0, ptr, side)  # released: no longer the user's
    assert not fl._C._record_stream(0, 0x1000, side)  # not batch memory at all


def test_record_stream_names_a_tensor_that_is_not_batch_memory(driver, monkeypatch):
    user = User(driver)
    loader = gpu_loader(fl.Dataset({"x": np.arange(100)}), 10)
    batch = next(iter(loader))
    monkeypatch.setattr(fl._record_stream._C, "_record_stream", lambda device, ptr, stream: False)
    with pytest.raises(ValueError, match=r"batch\['x'\] \(cuda:0, .*tensor.record_stream"):
        fl.record_stream(batch, user.stream())


# ---- A GPU-bound loop: the host runs ahead of a slow training step

def test_a_gpu_bound_loop_stays_bounded_and_the_hint_names_the_step(driver, caplog):
    # Each step queues 2 ms of GPU work on the consumer stream (like torch.cuda._sleep) and
    # returns at once: the host runs ahead, and every copy into reused memory waits for the step
    # that last read it. The loader must stay bounded (it throttles the host in next()), time
    # only the copies, and say the step, not the loader, is the bottleneck.
    user = User(driver)
    consumer = 0  # the legacy default stream: torch's current stream unless you choose another
    prefetch = 3
    loader = gpu_loader(fl.Dataset({"x": np.zeros((4000, 64), np.float32)}), 8, prefetch=prefetch, copy_streams=2)
    pending = 0
    with caplog.at_level(logging.WARNING, logger="fastload"):
        for batch in loader:
            user.sleep(consumer, 2000)
            batch["x"].touch()
            pending = max(pending, driver.fake_cuda_stat(b"pending_ops"))
            del batch
    user.synchronize(consumer)
    stats = loader.stats()
    hints = [r.getMessage() for r in caplog.records if r.name == "fastload"]
    assert len(hints) == 1, hints
    assert "for your GPU rather than for data" in hints[0] and "the training step is the bottleneck" in hints[0], hints
    assert "raise copy_streams" not in hints[0]
    (copy,) = stats.copy.values()
    (waited,) = stats.release_wait.values()
    assert copy.busy_s < 0.2 * stats.wall_s, stats  # the copies themselves are short
    assert waited > 0.6 * stats.wall_s, stats  # they waited for the step
    mem = loader._memory()
    assert mem["device_buffers"] <= prefetch + 2, mem
    # The queued work stays bounded too (a few ops per batch of the window on the consumer and
    # copy streams), where an unbounded host would have queued ~3 ops for each of 500 batches.
    assert pending <= 8 * (prefetch + 4), pending


# ---- Out of device memory: another allocator's cache, batches the user holds

@pytest.fixture
def memory_cap(driver):
    """Caps the stand-in's device memory; `cap(n)` leaves n bytes free for the test."""
    old = driver.fake_cuda_stat(b"total_memory")

    def cap(free: int, other: int = 0) -> None:
        driver.fake_cuda_configure(b"total_memory", driver.fake_cuda_stat(b"device_bytes") + free + other)
        driver.fake_cuda_configure(b"other_allocator_bytes", other)

    yield cap
    driver.fake_cuda_configure(b"other_allocator_bytes", 0)
    driver.fake_cuda_configure(b"total_memory", old)


@pytest.fixture
def release_cache():
    """Swaps the function next() calls to empty torch's cache, which fastload/__init__.py hands to
    the native module (_C._register_hooks), for the test's; registers the real one again after."""
    def use(function):
        fl._C._register_hooks(sample_error=fl.SampleError, release_cache=function, stall_warning=fl._advice.stall_warning)

    yield use
    fl._C._register_hooks(sample_error=fl.SampleError, release_cache=_gpu_memory.release_cached,
                          stall_warning=fl._advice.stall_warning)


def test_memory_cached_by_another_allocator_is_released_and_the_loader_goes_on(driver, memory_cap, release_cache):
    # Another allocator (torch's cache) holds nearly all the memory: the first allocation fails,
    # the loop waits for a batch, and next() asks the other allocator to empty its cache (what
    # torch.cuda.empty_cache() does), after which the loader allocates and goes on.
    released = []

    def release_cached(device):
        released.append(device)
        driver.fake_cuda_configure(b"other_allocator_bytes", 0)

    release_cache(release_cached)
    x = np.arange(20_000, dtype=np.int64).reshape(2000, 10)
    memory_cap(0, other=64 << 20)
    loader = gpu_loader(fl.Dataset({"x": x}), 100, with_index=True, prefetch=2)
    n = 0
    for batch in loader:
        np.testing.assert_array_equal(read(batch["x"], np.int64), x[read(batch["index"], np.int64)])
        n += 1
    assert n == 20 and released == [0]


def test_out_of_memory_waits_for_a_release_instead_of_growing(driver, memory_cap):
    # The loop keeps its last four batches (say, for a moving average) and the device has room
    # for one more: the pool cannot grow to fill its window, so the loader waits for the oldest
    # to be dropped instead of failing, and every batch is still right.
    x = np.arange(40_000, dtype=np.int64).reshape(4000, 10)
    batch_bytes = 100 * 10 * 8 + 100 * 8
    memory_cap(5 * batch_bytes)
    loader = gpu_loader(fl.Dataset({"x": x}), 100, with_index=True, prefetch=2)
    kept: list = []
    n = 0
    for batch in loader:
        kept.append(batch)
        if len(kept) > 4:
            old = kept.pop(0)
            np.testing.assert_array_equal(read(old["x"], np.int64), x[read(old["index"], np.int64)])
            del old
        time.sleep(0.002)
        n += 1
    assert n == 40
    assert loader._memory()["device_buffers"] == 2 * 5


def test_out_of_memory_with_the_memory_held_by_the_loop_is_torchs_error(driver, memory_cap, release_cache):
    # The loop keeps every batch and the device fills up: nothing can come back, so next()
    # raises torch's OutOfMemoryError (after emptying torch's cache), saying what is held where.
    calls = []
    release_cache(lambda device: calls.append(device))
    x = np.zeros((4000, 100), np.float32)
    memory_cap(10 * 100 * 400)
    loader = gpu_loader(fl.Dataset({"x": x}), 100, prefetch=2)
    kept = []
    with pytest.raises(torch.cuda.OutOfMemoryError) as info:
        for batch in loader:
            kept.append(batch)
    message = str(info.value)
    assert len(kept) == 10 and calls == [0], (len(kept), calls)
    assert "out of device memory on cuda:0" in message and "CUDA_ERROR_OUT_OF_MEMORY" in message, message
    assert "0.0 MB free" in message and "column 'x'" in message, message
    assert "10 device buffers (0.4 MB)" in message and "10 of them in batches you still hold" in message, message
    assert "torch.cuda.empty_cache() was called" in message, message
    del kept
    assert sum(1 for _ in loader) == 40  # the memory came back: the next epoch runs


# ---- Frees never on the user's thread

def thread_calls(lib, *names: str) -> dict[str, int]:
    lib.fake_cuda_thread_calls.argtypes = [ctypes.c_char_p]
    lib.fake_cuda_thread_calls.restype = ctypes.c_longlong
    return {n: lib.fake_cuda_thread_calls(n.encode()) for n in names}


WAITS_AND_FREES = ("cuMemFree", "cuMemFreeHost", "cuEventSynchronize", "cuStreamSynchronize", "cuCtxSynchronize")


def test_epoch_start_and_the_last_batch_free_nothing_on_the_users_thread(driver):
    # Frees may synchronise the device and wait for the consumer's work. An epoch start that
    # trims pools grown by held batches, and the last batch of a closed loader dying (in torch,
    # a DLPack deleter that runs with the GIL held), must do neither on the user's thread.
    x = np.arange(20_000, dtype=np.int64).reshape(2000, 10)
    device_before = driver.fake_cuda_stat(b"device_bytes")
    loader = gpu_loader(fl.Dataset({"x": x}), 100, with_index=True, prefetch=2)
    it = iter(loader)
    held = [next(it) for _ in range(10)]  # both pools grow well past what they keep
    del held
    for b in it:
        del b
    before = thread_calls(driver, *WAITS_AND_FREES)
    it = iter(loader)  # trims the grown pools
    batch = next(it)
    assert thread_calls(driver, *WAITS_AND_FREES) == before
    loader.close()
    del loader, it
    gc.collect()
    before = thread_calls(driver, *WAITS_AND_FREES)
    np.testing.assert_array_equal(read(batch["x"], np.int64), x[read(batch["index"], np.int64)])
    before["cuStreamSynchronize"] += 2  # read() waits for its copies back (the test's own)
    del batch  # the last reference: the pool goes with it
    gc.collect()
    assert thread_calls(driver, *WAITS_AND_FREES) == before
    fl._C._flush_deferred_frees()
    assert driver.fake_cuda_stat(b"device_bytes") == device_before  # freed all the same


# ---- split() onto a GPU and the CPU

def page_locked(lib, address: int) -> bool:
    lib.fake_cuda_page_locked.argtypes = [ctypes.c_void_p]
    return lib.fake_cuda_page_locked(address) == 1


def test_cpu_outputs_of_a_gpu_loader_are_ordinary_memory(driver):
    # A CPU batch in a page-locked slot would make the user's batch.to("cuda", non_blocking=True)
    # a DMA that torch does not protect and the loader cannot see finish: the slot could be
    # recycled (rewritten) mid-copy. CPU outputs get ordinary memory, so that copy is a staged
    # one, done when it returns; the GPU output still gets page-locked slots.
    x = np.arange(30_000, dtype=np.int64).reshape(3000, 10)
    loader = gpu_loader(fl.Dataset({"x": x}), 50, with_index=True, shuffle=True, prefetch=3)
    for _ in range(2):
        gpu, cpu = loader.split(["cuda:0", "cpu"])
        seen = []
        for bg, bc in zip(gpu, cpu):
            assert isinstance(bc["x"], torch.Tensor) and bc["x"].device.type == "cpu"
            assert not page_locked(driver, bc["x"].data_ptr()) and not page_locked(driver, bc["index"].data_ptr())
            np.testing.assert_array_equal(bc["x"].numpy(), x[bc["index"].numpy()])
            np.testing.assert_array_equal(read(bg["x"], np.int64), x[read(bg["index"], np.int64)])
            seen += [bc["index"].numpy(), read(bg["index"], np.int64)]
        np.testing.assert_array_equal(np.sort(np.concatenate(seen)), np.arange(3000))
    mem = loader._memory()
    assert mem["host_bytes"] > 0 and mem["pinned_bytes"] > 0, mem
    # The GPU output's window and copies in flight (streams + 1), two parts: what the pinned
    # pools reserve, none more.
    assert mem["pinned_buffers"] == 2 * (3 + 2), mem


# ---- The per-thread default stream

def test_batches_read_on_a_per_thread_stream_and_dropped_on_another_thread(driver):
    # With torch built for per-thread default streams, the current stream is CU_STREAM_PER_THREAD
    # (0x2): a handle that names the calling thread's own stream. A batch read on thread A's and
    # dropped on thread B (a queue to a logging thread, say) must not have its release recorded
    # on B's per-thread stream, which knows nothing of A's reads.
    user = User(driver)
    x = np.arange(20_000, dtype=np.int64).reshape(2000, 10)
    loader = gpu_loader(fl.Dataset({"x": x}), 50, with_index=True, prefetch=2)
    loader._test_stream = 0x2
    handed: list = []
    done = threading.Event()

    def consume():
        user.current()
        for batch in loader:
            user.sleep(0x2, 300)  # this thread's step, on its per-thread stream
            batch["x"].touch()
            handed.append(batch)  # dropped by the main thread below
        done.set()

    t = threading.Thread(target=consume)
    t.start()
    while not done.is_set() or handed:
        if handed:
            handed.pop(0)  # the last reference dies on this thread
        else:
            time.sleep(0.0005)
    t.join()
    found = misuses(driver)
    assert not found, found[:3]


# ---- A kernel of the user's faults

def test_a_faulting_kernel_is_one_clear_error_not_a_burst(fake):
    # A kernel of the training step faults (illegal address): from then on every CUDA call in the
    # context fails with that sticky error. The loop gets one error that says so, and fastload's
    # cleanup (every batch's release, every free, every stream) does not print a line per call.
    r = _run_child("""
        import ctypes, os, sys, numpy as np, fastload as fl
        sys.path.insert(0, os.environ["TESTS"])
        from test_standin_gpu_loader import User
        lib = ctypes.CDLL(os.environ["FASTLOAD_LIBCUDA"])
        user = User(lib)
        loader = fl.Loader(fl.Dataset({"x": np.zeros((20000, 64), np.float32)}), 64, device="cuda:0",
                           prefetch=4, copy_streams=2)
        loader._raw_device_batches = True
        kept = []
        try:
            for i, batch in enumerate(loader):
                batch["x"].touch()
                kept.append(batch)
                if i == 20:
                    assert lib.fake_cuda_fault(None, 700) == 0  # the step's kernel, on the legacy stream
                if len(kept) > 5:
                    kept.pop(0)
            print("no error")
        except RuntimeError as e:
            print("raised:", e)
        del kept, batch
        loader.close()
        print("closed", flush=True)
    """, {"FASTLOAD_LIBCUDA": str(fake.path), "TESTS": str(Path(__file__).resolve().parent)})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "closed" in r.stdout, r.stdout
    raised = [line for line in r.stdout.splitlines() if line.startswith("raised:")]
    assert len(raised) == 1, r.stdout
    assert "CUDA_ERROR_ILLEGAL_ADDRESS" in raised[0] and "sticky" in raised[0], raised[0]
    assert "CUDA_LAUNCH_BLOCKING=1" in raised[0], raised[0]
    lines = [line for line in r.stderr.splitlines() if line.startswith("fastload")]
    assert len(lines) <= 1, lines[:10]


# ---- Through torch's own DLPack import and deleter

def test_device_parts_through_torchs_dlpack_import_and_deleter(driver):
    # A CPU build of torch cannot import CUDA tensors, so here the stand-in's "device" memory (host
    # memory) is exported as CPU DLPack tensors: the same export, owner and deleter as CUDA
    # batches, only the device type differs. torch.from_dlpack makes the tensors, and torch's
    # deleter (when the last tensor or view dies) is what records the release.
    user = User(driver)
    x = np.arange(20_000, dtype=np.int64).reshape(2000, 10)
    loader = fl.Loader(fl.Dataset({"x": x}), 100, device="cuda:0", with_index=True, prefetch=2)
    loader._standin_tensors = True
    records = lambda: thread_calls(driver, "cuEventRecord")["cuEventRecord"]  # noqa: E731
    views = []
    i = -1
    for batch in loader:  # (not enumerate: its result tuple would keep the batch alive)
        i += 1
        assert isinstance(batch["x"], torch.Tensor) and batch["x"].dtype == torch.int64
        assert batch["x"].shape == (100, 10)
        user.synchronize(0)  # the consumer stream waited for the copy: now the bytes are there
        np.testing.assert_array_equal(batch["x"].numpy(), x[batch["index"].numpy()])
        if i % 5 == 0:
            views.append((batch["x"][3:7], batch["index"][3:7].clone()))  # a view keeps its column
        before = records()
        del batch
        if i % 5 != 0:
            assert records() - before == 2  # torch's deleter ran: a release per column
    before = records()
    loader.close()
    for v, ids in views:  # held views outlive the loader, and their memory was never reused
        np.testing.assert_array_equal(v.numpy(), x[ids.numpy()])
    gc.collect()
    del v, ids
    views.clear()
    assert records() - before == len(range(0, 20, 5))  # one release per held column, at its death


# ---- Which call reads the consumer stream

@pytest.mark.parametrize("raw_available", [True, False])
def test_next_reads_the_current_stream_with_one_call(driver, monkeypatch, raw_available):
    # On a CUDA build of torch, next() reads the current stream's raw handle through
    # torch._C._cuda_getCurrentRawStream (one C call) rather than building a torch.cuda.Stream
    # per batch; torch.cuda.current_stream is the fallback where the raw call is missing. Here
    # torch is a CPU build: both are stand-ins that return a stream of the stand-in driver, and
    # the capsules next() makes are kept as they are (a CPU torch cannot import CUDA ones).
    user = User(driver)
    consumer = user.stream()
    raw_calls, stream_calls = [], []

    class Stream:
        cuda_stream = consumer

    def current_stream(device=None):
        stream_calls.append(device)
        return Stream()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", current_stream)
    if raw_available:
        monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: raw_calls.append(d) or consumer,
                            raising=False)
    else:
        monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    monkeypatch.setattr(torch._C, "_from_dlpack", lambda capsule: capsule)
    loader = fl.Loader(fl.Dataset({"x": np.arange(1000)}), 100, device="cuda:0", prefetch=2)
    n = sum(1 for _ in loader)
    gc.collect()
    assert n == 10
    reads = n + 1  # every next() reads it, the one that ends the epoch too
    if raw_available:
        assert raw_calls == [0] * reads and stream_calls == [0]  # once at iter(), to initialise torch
    else:
        assert raw_calls == [] and stream_calls == [0] * (reads + 1)


def test_a_cuda_11_4_driver_has_every_entry_point_fastload_needs(fake):
    # fastload asks for its entry points at CUDA 12.0; a driver of CUDA 11.4 (the oldest with
    # cuGetProcAddress is 11.3) gives the newest it has of each, which are all fastload uses.
    r = _run_child("""
        import ctypes, os, numpy as np, fastload as fl
        lib = ctypes.CDLL(os.environ["FASTLOAD_LIBCUDA"])
        lib.fake_cuda_configure.argtypes = [ctypes.c_char_p, ctypes.c_longlong]
        assert lib.fake_cuda_configure(b"driver_version", 11040) == 0
        loader = fl.Loader(fl.Dataset({"x": np.arange(100)}), 10, device="cuda:0")
        loader._raw_device_batches = True
        print(sum(1 for _ in loader), "batches")
    """, {"FASTLOAD_LIBCUDA": str(fake.path)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert "10 batches" in r.stdout


@pytest.mark.parametrize("kind", ["arrow", "parquet"])
def test_arrow_and_parquet_batches_on_the_device_are_the_cpu_batches(driver, tmp_path, kind):
    # Arrow buffers gathered natively into page-locked slots, then copied like any part: each
    # device part (numbers, a fixed-size list, a padded list with its lengths) equals the CPU
    # loader's batch, and a string column stays a Python list on the host.
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(5)
    n = 900
    lens = rng.integers(0, 7, n)
    table = pa.table({
        "id": pa.array(np.arange(n), pa.int64()),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(3 * n).astype(np.float32)), 3),
        "tokens": pa.array([list(range(k)) for k in lens], pa.list_(pa.int32())),
        "text": pa.array([f"row {i}" for i in range(n)]),
    })
    if kind == "arrow":
        make = lambda: fl.Arrow(table, max_length={"tokens": 6})  # noqa: E731
    else:
        pq.write_table(table, tmp_path / "t.parquet", row_group_size=100)
        make = lambda: fl.Parquet(tmp_path / "t.parquet", max_length={"tokens": 6})  # noqa: E731
    kw = dict(shuffle=True, seed=8, with_index=True)
    cpu = list(fl.Loader(make(), 64, device="cpu", **kw))
    gpu = gpu_loader(make(), 64, copy_streams=2, **kw)
    seen = 0
    for a, b in zip(cpu, gpu):
        np.testing.assert_array_equal(read(b["index"], np.int64), a["index"].numpy())
        np.testing.assert_array_equal(read(b["id"], np.int64), a["id"].numpy())
        np.testing.assert_array_equal(read(b["vec"], np.float32), a["vec"].numpy())
        np.testing.assert_array_equal(read(b["tokens"], np.int32), a["tokens"].numpy())
        np.testing.assert_array_equal(read(b["tokens_lengths"], np.int64), a["tokens_lengths"].numpy())
        assert b["text"] == a["text"] == [f"row {i}" for i in a["index"].tolist()]
        assert b["id"].device == 0
        seen += len(a["index"])
    assert seen == n


def test_a_dataset_in_object_storage_on_the_device_is_the_local_one(driver, s3_server, tmp_path):
    # Shards fetched into the cache and mapped on demand feed the same page-locked slots: the
    # device parts equal the CPU batches of the same directory read locally.
    import uuid

    import boto3
    from remote_helpers import batches, opts, small_dataset, upload_dir

    local = tmp_path / "ds"
    small_dataset(local, width=8, seed=3)
    bucket = f"g-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=s3_server[0], region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    upload_dir(s3, bucket, "ds", local)
    remote = fl.Dataset.open(f"s3://{bucket}/ds", storage_options=opts(s3_server[0]), cache_dir=tmp_path / "cache",
                             cache_limit=1 << 20)
    kw = dict(shuffle=True, seed=2, order="block", with_index=True)
    cpu = batches(fl.Loader(fl.Dataset.open(local), 50, device="cpu", **kw))
    gpu = gpu_loader(remote, 50, copy_streams=2, **kw)
    seen = 0
    for a, b in zip(cpu, gpu):
        np.testing.assert_array_equal(read(b["index"], np.int64), a["index"].numpy())
        np.testing.assert_array_equal(read(b["x"], np.float32), a["x"].numpy())
        np.testing.assert_array_equal(read(b["y"], np.int64), a["y"].numpy())
        seen += len(a["index"])
    gpu.close()
    assert seen == 1000 and remote.storage_stats().bytes_fetched > 0
