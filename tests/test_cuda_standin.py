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
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload as fl

sys.path.insert(0, str(Path(__file__).parent))
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
    loader = gpu_loader(fl.Dataset({"x": x, "y": y}), 64, shuffle=True, seed=3, with_index=True, streams=2)
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
    gpu = gpu_loader(mix, 10, streams=2, **kw)
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
    gpu = [read(b["index"], np.int64) for b in gpu_loader(fl.Dataset({"x": x}), 50, streams=3, **kw)]
    assert len(cpu) == len(gpu)
    for a, b in zip(cpu, gpu):
        np.testing.assert_array_equal(a, b)


def test_slots_and_device_buffers_are_recycled_and_bounded(driver):
    x = np.random.default_rng(0).standard_normal((4000, 256)).astype(np.float32)
    prefetch, streams = 3, 2
    loader = gpu_loader(fl.Dataset({"x": x}), 100, shuffle=True, prefetch=prefetch, streams=streams)
    for _ in range(3):
        for batch in loader:
            del batch
    mem = loader._memory()
    # Device: the window plus one spare (parts the user drops are reused after their release).
    assert mem["device_buffers"] <= prefetch + 1, mem
    assert mem["device_allocations"] <= prefetch + 1, mem
    # Pinned: window + loop variable + copies in flight (streams + 1) + one spare.
    assert mem["pinned_buffers"] <= prefetch + 1 + streams + 1 + 1, mem
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
        loader = gpu_loader(fl.Dataset({"x": x}), 64, prefetch=6, streams=3)
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
    loader = gpu_loader(fl.Dataset({"x": x}), 32, shuffle=True, with_index=True, streams=2)
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
        loader = gpu_loader(fl.Dataset({"x": x}), 100, prefetch=4, streams=2)
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
])
def test_without_a_usable_driver_cpu_works_and_cuda_says_why(fake, case, expected):
    env = {"FASTLOAD_LIBCUDA": str(fake.path)}
    if case == "no_driver":
        env["FASTLOAD_LIBCUDA"] = "/nonexistent/libcuda.so.1"
    elif case == "stub":
        env["CONFIGURE"] = "stub=1"
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
                           prefetch=8, streams=4)
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
        loader = gpu_loader(fl.Dataset({"x": x, "y": np.arange(6000)}), 100, prefetch=3, streams=2, shuffle=True)
        for _ in range(2):
            for batch in loader:
                batch["x"].touch()
                batch["y"].touch()
        mem = loader._memory()
        assert mem["device_buffers"] <= 2 * (3 + 1), mem
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
    loader = gpu_loader(fl.Dataset.open(tmp_path / "d", pad=-1), 64, shuffle=True, with_index=True, streams=2)
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
        loader = gpu_loader(fl.Dataset({"x": np.zeros((1600, 4), np.float32)}), 4, streams=1, prefetch=8)
        with caplog.at_level(logging.WARNING, logger="fastload"):
            for _batch in loader:
                pass
    finally:
        driver.fake_cuda_configure(b"max_delay_us", 100)
    hints = [r.getMessage() for r in caplog.records if r.name == "fastload"]
    assert len(hints) == 1, hints
    assert "waited for data" in hints[0] and "raise streams (now 1)" in hints[0], hints[0]


def test_stats_count_the_copies_of_each_device(driver):
    loader = gpu_loader(fl.Dataset({"x": np.zeros((1000, 64), np.float32)}), 50, streams=2)
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
