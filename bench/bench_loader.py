"""Throughput benchmark: fastload vs numpy fancy indexing, torch DataLoader and a C++ ceiling.

Owns the benchmark data files (bench/data/, git-ignored) and the results tables; the ceiling's
copy loop lives in bench/ceiling.cpp. Run `python bench/bench_loader.py [--quick]`; see
bench/RESULTS.md for the latest full run and how to read it. Figures are medians over interleaved
rounds of per-round figures (a ratio is taken within a round), shown with their min-max.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import functools
import gc
import hashlib
import inspect
import json
import logging
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np
import torch
import torch.utils.data

import fastload as fl

HERE = Path(__file__).resolve().parent
CORES = len(os.sched_getaffinity(0))
PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")

# The ceiling's prefetch: rows ahead of the copy, and at most this many cache lines started per
# row (the hardware prefetcher follows a row's later lines). The same for every workload, so
# nothing is tuned per row size; see RESULTS.md for the settings tried.
CEILING_AHEAD = 16
CEILING_LINES = 4
# Batch buffers per ceiling thread, written in rotation. One stays in the core's L2 (a loader
# that hands batches out cannot do that); bench/bench_hotpath.py also measures the ceiling of
# issue 22 (16 lines of a row 8 rows ahead, 4 buffers) beside this one.
CEILING_BUFFERS = 1

# The bar fastload is held to: >= 0.7x the ceiling everywhere, and >= 20x the DataLoader
# (>= 10x on 150 KiB rows, where the DataLoader's per-sample Python cost is small next to the copy).
BAR_CEILING = 0.7
# A measurement during which other processes used more than this many cores is marked "*".
CONTENDED = 0.3
# The per-batch stats counters may cost under this share of throughput on 64 B rows (issue 9).
BAR_STATS_COST = 0.02


def bar_dataloader(row_bytes: int) -> float:
    return 10.0 if row_bytes > 100_000 else 20.0


# ----------------------------------------------------------------------------- workloads
@dataclass
class Workload:
    name: str            # table label
    file: str            # .npy file name inside the data dir
    shape: tuple         # of the .npy array
    dtype: type
    batch: int
    window: tuple | None = None  # (length, stride) in tokens for a token-window workload
    stats_cost: bool = False     # also measure the stats counters' cost here (on vs off)

    @property
    def row_bytes(self) -> int:
        """Bytes one sample carries (what GB/s counts)."""
        item = np.dtype(self.dtype).itemsize
        if self.window:
            return self.window[0] * item
        return int(np.prod(self.shape[1:])) * item

    def num_samples(self) -> int:
        if self.window:
            length, stride = self.window
            return (self.shape[0] - length) // stride + 1
        return self.shape[0]


def workloads(quick: bool) -> list[Workload]:
    """Full runs use ~1.6 GB per row file and a 2 GB token file (far bigger than every cache, so
    random rows come from DRAM); --quick uses ~32 MiB files, enough to exercise every path."""
    scale = 1 / 48 if quick else 1.0
    kib = 1024
    n1k = int(1536 * kib * scale)            # 1 KiB rows: 1.5 GiB
    n64 = int(24 * kib * kib * scale)        # 64 B rows: 1.5 GiB
    n150 = int(10240 * scale)                # 150 KiB rows: 1.5 GiB
    ntok = int(10**9 * scale)                # uint16 tokens: 2 GB
    return [
        Workload("1 KiB rows, batch 256", f"rows1k_{n1k}.npy", (n1k, 1024), np.uint8, 256),
        Workload("64 B rows, batch 4096", f"rows64_{n64}.npy", (n64, 64), np.uint8, 4096,
                 stats_cost=True),
        Workload("150 KiB rows, batch 64", f"rows150k_{n150}.npy", (n150, 150 * kib), np.uint8, 64),
        Workload("uint16 windows 1025/1024, batch 64", f"tokens_{ntok}.npy", (ntok,), np.uint16, 64,
                 window=(1025, 1024)),
    ]


# ----------------------------------------------------------------------------- data files
def ensure_file(path: Path, shape: tuple, dtype: type) -> np.memmap:
    """Opens path read-only, first writing it (random bytes) if missing or of another shape."""
    try:
        mm = np.load(path, mmap_mode="r")
        if mm.shape == shape and mm.dtype == np.dtype(dtype):
            return mm
        del mm
    except (OSError, ValueError):
        pass
    print(f"  writing {path} ({np.prod(shape) * np.dtype(dtype).itemsize / 1e9:.2f} GB) ...", flush=True)
    tmp = path.with_suffix(".tmp")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape)
    flat = out.reshape(-1).view(np.uint8)
    rng = np.random.default_rng(0)
    chunk = 64 << 20
    for start in range(0, flat.size, chunk):
        stop = min(start + chunk, flat.size)
        flat[start:stop] = np.frombuffer(rng.bytes(stop - start), np.uint8)
    out.flush()
    del flat, out
    os.replace(tmp, path)  # a run interrupted while writing never leaves a half file in place
    return np.load(path, mmap_mode="r")


def page_in(mm: np.ndarray) -> None:
    """Reads one byte per page through this mapping: pulls the file into the page cache and maps
    every page in this process, so no alternative pays first-touch faults the others do not
    (forked DataLoader workers still fault pages into their own page tables; that is theirs)."""
    flat = mm.reshape(-1).view(np.uint8)
    int(flat[::PAGE].sum())


def sparse_file(path: Path, size: int) -> np.memmap:
    """A file of `size` zero bytes that occupies no disk (a hole made by truncate)."""
    if not path.exists() or path.stat().st_size != size:
        with open(path, "wb") as f:
            f.truncate(size)
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))


# ----------------------------------------------------------------------------- CPU accounting
def _machine_ticks() -> tuple[int, int]:
    """(busy, steal) clock ticks of all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return user + nice + system + irq + softirq, steal


def _pid_seconds(pid: int) -> float:
    """CPU seconds (user + system) a process has used; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


class CpuMeter:
    """CPU used over a measurement: by this benchmark (all threads of this process plus any
    helper processes such as DataLoader workers) and by everything else on the machine. The
    benchmark may share its machine; `others` says how much it did, so figures can be trusted."""

    def __init__(self, pids: Iterable[int] = ()):
        self.pids = list(pids)
        self.wall = time.perf_counter()
        self.own = time.process_time() + sum(map(_pid_seconds, self.pids))
        self.busy, self.steal = _machine_ticks()
        self.faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    def stop(self) -> dict:
        wall = time.perf_counter() - self.wall
        own = time.process_time() + sum(map(_pid_seconds, self.pids)) - self.own
        busy, steal = _machine_ticks()
        machine = (busy - self.busy) / TICK
        return {"wall": wall, "own_cores": own / wall,
                # /proc/stat ticks are 10 ms: clamp the small negative noise when nobody else ran.
                "other_cores": max(0.0, machine - own) / wall,
                "steal_cores": (steal - self.steal) / TICK / wall,
                "own_cpu_s": own,
                "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.faults}


def wait_for_quiet(max_wait: float, threshold: float = 0.2, window: float = 0.5) -> tuple[float, bool]:
    """Waits until the rest of the machine used under `threshold` cores over `window` seconds,
    for at most `max_wait` seconds. On a shared machine this keeps most measurements clear of
    other people's builds and tests. Returns (seconds waited, whether it was quiet)."""
    start = time.perf_counter()
    while True:
        meter = CpuMeter()
        time.sleep(window)
        if meter.stop()["other_cores"] < threshold:
            return time.perf_counter() - start, True
        if time.perf_counter() - start >= max_wait:
            return time.perf_counter() - start, False


# ----------------------------------------------------------------------------- measurements
@dataclass
class Measurement:
    samples_per_s: float
    cpu_ns_per_sample: float  # this benchmark's CPU time per sample, all its threads/processes
    own_cores: float
    other_cores: float        # CPU that other processes on the machine used meanwhile
    steal_cores: float        # CPU the hypervisor gave to other guests meanwhile
    faults_per_batch: float   # minor page faults in this process per batch


def timed_batches(next_batch: Callable[[], object], batch: int, warmup: float, seconds: float,
                  pids: Callable[[], Iterable[int]] = tuple) -> Measurement:
    """Calls next_batch() for `warmup` seconds, then for `seconds` of wall clock; counts whole
    batches only. The clock read per batch (~50 ns) is the only work added to each batch."""
    clock = time.perf_counter
    end = clock() + warmup
    while clock() < end:
        next_batch()
    done = 0
    meter = CpuMeter(pids())
    end = clock() + seconds
    while True:
        next_batch()
        done += 1
        if clock() >= end:
            break
    return measurement(meter.stop(), done * batch, done)


def measurement(m: dict, samples: int, batches: int) -> Measurement:
    return Measurement(samples / m["wall"], m["own_cpu_s"] / samples * 1e9, m["own_cores"], m["other_cores"],
                       m["steal_cores"], m["faults"] / max(batches, 1))


def fastload_source(w: Workload, mm: np.ndarray):
    if w.window:
        return fl.Windows(mm, length=w.window[0], stride=w.window[1])
    return fl.Dataset({"x": mm})


# Arguments every fastload column shares; a column adds only its knobs (prefetch, or tune's choice).
def loader_args(w: Workload, **knobs) -> dict:
    return {"batch_size": w.batch, "shuffle": True, "seed": 0, "drop_last": True, "num_threads": CORES,
            "device": "cpu", **knobs}


# The arguments that define a workload: a tuning recommendation never changes them.
WORKLOAD_ARGS = ("batch_size", "shuffle", "seed", "drop_last", "device")


def run_fastload(w: Workload, mm: np.ndarray, warmup: float, seconds: float, counting: bool = True,
                 **knobs) -> Measurement:
    """fastload with `knobs` on top of loader_args (no knobs: default arguments). counting=False
    switches off the iterator's per-batch stats counters through a private hook that exists only
    to measure what they cost."""
    loader = fl.Loader(fastload_source(w, mm), **loader_args(w, **knobs))
    try:
        if not counting:
            loader._engine._set_counting(False)
        it = iter(loader)

        def next_batch():
            # Training loops run across epochs; iter() starts the next one. Nothing else per
            # batch: the batch is dropped unread, as the other alternatives' batches are.
            nonlocal it
            try:
                return next(it)
            except StopIteration:
                it = iter(loader)
                return next(it)

        return timed_batches(next_batch, w.batch, warmup, seconds)
    finally:
        loader.close()


def default_prefetch(w: Workload, mm: np.ndarray) -> str:
    """The prefetch a Loader with default arguments chose for this workload (prefetch=None: a
    byte budget), read from the loader; "?" where this build does not expose it."""
    try:
        loader = fl.Loader(fastload_source(w, mm), **loader_args(w))
    except Exception as e:  # noqa: BLE001 - the measurement itself will report the failure
        return f"? ({type(e).__name__})"
    try:
        return str(getattr(loader, "_prefetch", "?"))
    finally:
        loader.close()


def run_numpy(w: Workload, mm: np.ndarray, warmup: float, seconds: float) -> Measurement:
    """One thread of numpy fancy indexing: arr[ids] with ids a slice of a random permutation."""
    base = mm.view(np.ndarray)  # the plain ndarray: no np.memmap subclass bookkeeping per batch
    if w.window:
        # Windows as a strided (num_windows, length) view: row i starts i*stride tokens in, so
        # view[ids] copies whole windows like any 2-D fancy index (no per-token index array).
        length, stride = w.window
        item = base.itemsize
        base = np.lib.stride_tricks.as_strided(base, shape=(w.num_samples(), length),
                                               strides=(stride * item, item), writeable=False)
    n = w.num_samples()
    perm = np.random.default_rng(0).permutation(n)  # drawn before timing, as a sampler would
    pos = 0

    def next_batch():
        nonlocal pos
        if pos + w.batch > n:
            pos = 0
        ids = perm[pos:pos + w.batch]
        pos += w.batch
        return base[ids]

    return timed_batches(next_batch, w.batch, warmup, seconds)


class RowDataset(torch.utils.data.Dataset):
    """What a typical PyTorch user writes: one sample = one row of the memmap as a tensor."""

    def __init__(self, mm: np.ndarray):
        self.mm = mm

    def __len__(self) -> int:
        return len(self.mm)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(np.array(self.mm[i]))  # np.array: a writable copy of the row


class WindowDataset(torch.utils.data.Dataset):
    """Token windows the usual way: slice the 1-D memmap per sample."""

    def __init__(self, mm: np.ndarray, length: int, stride: int):
        self.mm, self.length, self.stride = mm, length, stride
        self.n = (len(mm) - length) // stride + 1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        start = i * self.stride
        return torch.from_numpy(np.array(self.mm[start:start + self.length]))


def run_dataloader(w: Workload, mm: np.ndarray, warmup: float, seconds: float) -> Measurement:
    ds = WindowDataset(mm, *w.window) if w.window else RowDataset(mm)
    # Workers fork from this process (Linux default), so they share the memmap without pickling.
    dl = torch.utils.data.DataLoader(ds, batch_size=w.batch, shuffle=True, num_workers=CORES,
                                     drop_last=True, persistent_workers=True,
                                     generator=torch.Generator().manual_seed(0))
    it = iter(dl)
    try:
        def next_batch():
            nonlocal it
            try:
                return next(it)
            except StopIteration:
                it = iter(dl)
                return next(it)

        def worker_pids():
            return [p.pid for p in getattr(it, "_workers", [])]  # their CPU is the loader's too

        next_batch()  # worker start-up, before the warm-up's steady state
        return timed_batches(next_batch, w.batch, warmup, seconds, worker_pids)
    finally:
        # Stop the workers now: idle persistent workers must not share the CPU with what follows.
        shutdown = getattr(it, "_shutdown_workers", None)  # private, but the only prompt way
        if shutdown is not None:
            shutdown()
        del it, dl


_ceiling_lib = None


def compile_ceiling(out_dir: Path) -> Path:
    """Compiles bench/ceiling.cpp into out_dir (-O3, no -march: the ceiling a portable build
    reaches); returns the library's path."""
    out = out_dir / "libceiling.so"
    cmd = ["g++", "-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", str(HERE / "ceiling.cpp"), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"compiling the ceiling failed: {proc.stderr.strip()[:300]}")
    return out


def ceiling_lib(prebuilt: Path | None = None) -> ctypes.CDLL:
    """The ceiling's library: compiled once per run into a temporary directory, or `prebuilt`
    (a library compile_ceiling made) on the first call."""
    global _ceiling_lib
    if _ceiling_lib is None:
        out = prebuilt or compile_ceiling(Path(tempfile.mkdtemp(prefix="fastload_ceiling_")))
        lib = ctypes.CDLL(str(out))
        lib.ceiling_gather.restype = ctypes.c_int64
        lib.ceiling_gather.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_int64, ctypes.c_int32, ctypes.c_double, ctypes.c_int64,
                                       ctypes.c_int64, ctypes.c_int64]
        _ceiling_lib = lib
    return _ceiling_lib


def run_ceiling(w: Workload, mm: np.ndarray, warmup: float, seconds: float,
                ahead: int = CEILING_AHEAD, lines: int = CEILING_LINES, threads: int | None = None,
                buffers: int = CEILING_BUFFERS) -> Measurement:
    lib = ceiling_lib()
    address = mm.__array_interface__["data"][0]
    pitch = w.window[1] * mm.dtype.itemsize if w.window else mm.strides[0]
    args = (address, w.num_samples(), pitch, w.row_bytes, w.batch, threads or CORES)
    if lib.ceiling_gather(*args, warmup, ahead, lines, buffers) < 0:
        raise RuntimeError("ceiling_gather rejected its arguments")
    meter = CpuMeter()
    rows = lib.ceiling_gather(*args, seconds, ahead, lines, buffers)  # ctypes releases the GIL for the call
    return measurement(meter.stop(), rows, rows // w.batch)


# Without fl.tune, "tuned" is a fixed rule for prefetch: a deeper window for batches under ~1 MB
# (each wake-up of the consumer then takes prefetch/2 batches; a wake-up costs ~5-10 us here, a
# small batch ~20 us to build); larger batches keep the default (few in flight: more outgrow the
# caches).
TUNED_PREFETCH = 16
TUNED_BELOW_BYTES = 1 << 20


@dataclass
class Tuning:
    """What the "tuned" column runs on one workload, and where it came from."""
    knobs: dict
    how: str                       # "fl.tune", or why the rule was used instead
    seconds: float | None = None   # how long fl.tune took


def rule_knobs(w: Workload) -> dict:
    return {"prefetch": TUNED_PREFETCH} if w.row_bytes * w.batch < TUNED_BELOW_BYTES else {}


def call_with_accepted(fn: Callable, *args, **kwargs):
    """fn(*args, **kwargs), leaving out the keyword arguments fn does not take: fl.tune is being
    written by someone else, so the workload is described to it only as far as it asks."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    return fn(*args, **kwargs)


def tune_workload(w: Workload, mm: np.ndarray, allowed: bool, max_wait: float, quick: bool = False) -> Tuning:
    """fl.tune's recommendation for this workload, computed once before the rounds; the prefetch
    rule where this build has no fl.tune, where it is not allowed (--quick: it measures a grid)
    or where it fails."""
    tune = getattr(fl, "tune", None)
    if tune is None:
        return Tuning(rule_knobs(w), "rule: no fl.tune in this build")
    if not allowed:
        return Tuning(rule_knobs(w), "rule: fl.tune not run (--quick or --no-tune)")
    if max_wait > 0:
        wait_for_quiet(max_wait)
    start = time.perf_counter()
    try:
        short = {"seconds": 0.05, "repeats": 1} if quick else {}  # --quick --tune: exercise the path only
        rec = call_with_accepted(tune, fastload_source(w, mm), batch_size=w.batch, shuffle=True,
                                 drop_last=True, device="cpu", progress=False, **short)
        took = time.perf_counter() - start
        args = dict(rec.args if hasattr(rec, "args") else rec["args"])
    except Exception as e:  # noqa: BLE001 - the column falls back to the rule and says why
        traceback.print_exc()
        return Tuning(rule_knobs(w), f"rule: fl.tune failed ({type(e).__name__}: {e})".splitlines()[0][:160],
                      time.perf_counter() - start)
    finally:
        gc.collect()
    base = loader_args(w)
    overridden = {k: v for k, v in args.items() if k in WORKLOAD_ARGS and v != base[k]}
    how = "fl.tune" + (f" (ignored, as they define the workload: {overridden})" if overridden else "")
    return Tuning({k: v for k, v in args.items() if k not in WORKLOAD_ARGS}, how, took)


def fmt_knobs(knobs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in knobs.items()) or "(defaults)"


# Column keys, in the order of the first round (later rounds rotate it, so no alternative always
# runs right after the same other one).
COLUMNS = ("ceiling", "default", "prefetch4", "tuned", "numpy", "dataloader")
FASTLOAD_COLUMNS = (("default", "default"), ("prefetch4", "prefetch 4"), ("tuned", "tuned"))


def alternatives(tuning: Tuning) -> dict[str, Callable]:
    return {
        "ceiling": run_ceiling,
        "default": run_fastload,                                       # prefetch=None: the byte budget
        "prefetch4": functools.partial(run_fastload, prefetch=4),      # the previous default
        "tuned": functools.partial(run_fastload, **tuning.knobs),
        "numpy": run_numpy,
        "dataloader": run_dataloader,
    }


@dataclass
class Result:
    """One alternative on one workload: one entry per round, None where that round failed, so
    that ratios pair measurements taken in the same round."""
    rounds: list[Measurement | None] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> list[Measurement]:
        return [m for m in self.rounds if m is not None]

    def cell(self, row_bytes: int) -> str:
        if not self.ok:
            return f"error: {self.error}"
        r = statistics.median(m.samples_per_s for m in self.ok)
        return f"{fmt_rate(r)}/s, {r * row_bytes / 1e9:.2f} GB/s"

    def cpu(self) -> float | None:
        return statistics.median(m.cpu_ns_per_sample for m in self.ok) if self.ok else None

    def cpu_cell(self) -> str:
        cpu = self.cpu()
        return "n/a" if cpu is None else fmt_ns(cpu)


def measure(fn, w: Workload, mm: np.ndarray, warmup: float, seconds: float, result: Result,
            max_wait: float) -> str:
    """Runs one round of one alternative into `result`, first waiting (up to max_wait seconds)
    for the machine to be quiet; a failure becomes None for that round and an error cell instead
    of ending the benchmark. Returns the progress line."""
    waited, _ = wait_for_quiet(max_wait) if max_wait > 0 else (0.0, True)
    try:
        m = fn(w, mm, warmup, seconds)
    except Exception as e:  # noqa: BLE001 - every failure is reported in the table
        traceback.print_exc()
        result.error = f"{type(e).__name__}: {e}".splitlines()[0][:120]
        result.rounds.append(None)
        return f"error: {result.error}"
    finally:
        gc.collect()
    result.rounds.append(m)
    busy = " *" if m.other_cores + m.steal_cores > CONTENDED else ""
    return (f"{fmt_rate(m.samples_per_s)}/s {m.samples_per_s * w.row_bytes / 1e9:6.2f} GB/s | "
            f"CPU {m.own_cores:.2f} cores, {fmt_ns(m.cpu_ns_per_sample)}/sample, "
            f"{m.faults_per_batch:.1f} faults/batch | others {m.other_cores:.2f} cores, steal {m.steal_cores:.2f}"
            f"{busy} (waited {waited:.1f} s for quiet)")


def stats_cost(w: Workload, mm: np.ndarray, rounds: int, warmup: float, seconds: float,
               max_wait: float) -> tuple[Result, Result]:
    """fastload with default arguments, its per-batch stats counters on and off, in interleaved
    rounds; which of the two goes first alternates, so a drift within a round cancels out."""
    on, off = Result(), Result()
    for rnd in range(rounds):
        pair = [("counters on", on, True), ("counters off", off, False)]
        if rnd % 2:
            pair.reverse()
        for label, res, counting in pair:
            line = measure(functools.partial(run_fastload, counting=counting), w, mm, warmup, seconds, res, max_wait)
            print(f"  stats round {rnd + 1} {label:12s} {line}", flush=True)
    return on, off


def first_batch_latency(source, repeats: int) -> tuple[list[float], list[float]]:
    """Seconds from iter() to the first batch of a shuffled Loader over `source`, one new epoch
    per repeat; also how much of that iter() itself took (it ends the previous epoch first)."""
    loader = fl.Loader(source, batch_size=256, shuffle=True, seed=0, num_threads=CORES, device="cpu")
    totals, starts = [], []
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            it = iter(loader)
            started = time.perf_counter()
            batch = next(it)
            totals.append(time.perf_counter() - start)
            starts.append(started - start)
            assert next(iter(batch.values())).shape[0] == 256
    finally:
        loader.close()
    return totals, starts


def billion_sample_sources(data_dir: Path) -> list[tuple[str, object]]:
    """Two sources of 10^9 samples that cost no memory or disk: one-byte windows over a sparse
    1 GB file (the realistic case: a batch's 256 random pages are first touches, i.e. page
    faults in the file), and a zero-stride 10^9-row column (one byte in RAM: the loader's own
    start-up cost, with no faults)."""
    tokens = sparse_file(data_dir / "sparse_1e9.bin", 10**9)
    return [
        ("fl.Windows(length=1, stride=1) over a sparse 10^9-byte memmap", fl.Windows(tokens, length=1, stride=1)),
        ("fl.Dataset over a zero-stride (10^9, 1) uint8 view",
         fl.Dataset({"x": np.broadcast_to(np.zeros((1, 1), np.uint8), (10**9, 1))})),
    ]


# ----------------------------------------------------------------------------- report
def fmt_rate(x: float) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:.3g}"


def fmt_ns(ns: float) -> str:
    return f"{ns / 1e3:.3g} µs" if ns >= 1e4 else f"{ns:.3g} ns"


def machine_lines() -> list[str]:
    model = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        rev = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"], capture_output=True,
                             text=True).stdout.strip() or "unknown"
    except OSError:
        rev = "unknown"
    try:  # which build of fastload was measured (others may reinstall it between runs)
        so = Path(fl._C.__file__)
        build = (f"{so.name} built {datetime.datetime.fromtimestamp(so.stat().st_mtime).isoformat(timespec='seconds')}"
                 f", sha256 {hashlib.sha256(so.read_bytes()).hexdigest()[:12]}")
    except (AttributeError, OSError):
        build = "unknown build"
    return [
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {CORES} cores usable ({os.cpu_count()} online), CPU `{model}`, {mem:.1f} GiB RAM, "
        f"{platform.system()} {platform.release()}",
        f"- python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
        f"fastload {getattr(fl, '__version__', '?')} (tree at git {rev}; {build})",
        f"- load average before the run: {open('/proc/loadavg').read().split()[:3]}",
    ]


@dataclass
class Spread:
    """A per-round figure over the rounds: the median, and the smallest and largest round."""
    median: float
    lo: float
    hi: float
    n: int

    def fmt(self, digits: int = 2, unit: str = "x") -> str:
        return f"{self.median:.{digits}f}{unit} ({self.lo:.{digits}f}–{self.hi:.{digits}f})"


def spread(xs: list[float]) -> Spread | None:
    return Spread(statistics.median(xs), min(xs), max(xs), len(xs)) if xs else None


def round_ratios(a: Result, b: Result, key: Callable[[Measurement], float] = lambda m: m.samples_per_s) -> list[float]:
    """a/b within each round where both were measured (never one round's a over another's b)."""
    return [key(x) / key(y) for x, y in zip(a.rounds, b.rounds) if x is not None and y is not None and key(y)]


def ratio(a: Result, b: Result) -> Spread | None:
    return spread(round_ratios(a, b))


def fmt_spread(s: Spread | None, digits: int = 2) -> str:
    return "n/a" if s is None else s.fmt(digits)


def contended_rounds(results: dict[str, Result]) -> int:
    """Rounds in which some measurement had other processes using more than CONTENDED cores."""
    n = max((len(r.rounds) for r in results.values()), default=0)
    return sum(any(i < len(r.rounds) and r.rounds[i] is not None and
                   r.rounds[i].other_cores + r.rounds[i].steal_cores > CONTENDED for r in results.values())
               for i in range(n))


def verdict(s: Spread | None, bar: float, below: bool = False) -> str:
    if s is None:
        return "n/a"
    ok = s.median < bar if below else s.median >= bar
    return "meets" if ok else "MISSES"


def as_json(m: Measurement | None) -> dict | None:
    return None if m is None else dict(m.__dict__)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small files, short timings (< 1 minute): a smoke test")
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per measurement (default 3, quick 0.3)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds of every alternative, interleaved; tables show medians of per-round figures "
                         "(default 5, quick 1)")
    ap.add_argument("--stats-rounds", type=int, default=None,
                    help="rounds of the stats-cost measurement (counters on and off; default 2x rounds, at least 10; quick 1)")
    ap.add_argument("--max-wait", type=float, default=None,
                    help="seconds to wait before each measurement for other processes to go quiet "
                         "(default 30, quick 0)")
    ap.add_argument("--tune", action=argparse.BooleanOptionalAction, default=None,
                    help="let the tuned column use fl.tune where it exists (default: yes, no with --quick)")
    ap.add_argument("--workload", action="append", default=None, metavar="TEXT",
                    help="only the workloads whose name contains TEXT (repeatable; default: all four)")
    ap.add_argument("--json", type=Path, default=None, help="also write every round's figures to this file")
    ap.add_argument("--data-dir", type=Path, default=HERE / "data", help="where the .npy files live (default bench/data)")
    args = ap.parse_args()
    seconds = args.seconds if args.seconds is not None else (0.3 if args.quick else 3.0)
    rounds = max(1, args.rounds if args.rounds is not None else (1 if args.quick else 5))
    stats_rounds = max(1, args.stats_rounds if args.stats_rounds is not None else
                       (1 if args.quick else max(10, 2 * rounds)))
    max_wait = args.max_wait if args.max_wait is not None else (0.0 if args.quick else 30.0)
    use_tune = args.tune if args.tune is not None else not args.quick
    warmup = min(0.5, max(0.1, seconds / 3))
    args.data_dir.mkdir(parents=True, exist_ok=True)
    # The loader's one-time stall hint is for training loops; here it would only interleave with
    # the table (this benchmark measures the waiting itself).
    logging.getLogger("fastload").setLevel(logging.ERROR)

    print("# fastload loader benchmark\n")
    print("\n".join(machine_lines()))
    print(f"- command: `{' '.join(['python', 'bench/bench_loader.py'] + sys.argv[1:])}`")
    print(f"- timing: {seconds:g} s per measurement after {warmup:g} s warm-up, whole batches; {rounds} round(s) "
          f"interleaved (order rotated each round); tables show the median over rounds of each round's figure "
          f"(ratios are taken within a round) with the min–max; {CORES} threads/workers for fastload, the "
          f"DataLoader and the ceiling; up to {max_wait:g} s wait for a quiet machine before each measurement\n",
          flush=True)

    table = []
    stats = None
    chosen = [w for w in workloads(args.quick) if not args.workload or any(t in w.name for t in args.workload)]
    if not chosen:
        ap.error(f"no workload name contains any of {args.workload}")
    for w in chosen:
        print(f"{w.name}: {w.num_samples()} samples of {w.row_bytes} B", flush=True)
        results = {key: Result() for key in COLUMNS}
        try:
            mm = ensure_file(args.data_dir / w.file, w.shape, w.dtype)
            page_in(mm)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            for r in results.values():
                r.error = f"data: {type(e).__name__}: {e}".splitlines()[0][:120]
            table.append((w, results, Tuning({}, "n/a"), "?"))
            continue
        prefetch = default_prefetch(w, mm)
        tuning = tune_workload(w, mm, use_tune, max_wait, args.quick)
        took = f" in {tuning.seconds:.1f} s" if tuning.seconds is not None else ""
        print(f"  default prefetch: {prefetch}; tuned: {fmt_knobs(tuning.knobs)} ({tuning.how}{took})", flush=True)
        fns = alternatives(tuning)
        # Rounds interleave the alternatives, so a burst of load from elsewhere on the machine
        # hits one round of each rather than every round of one; ratios pair the same round.
        for rnd in range(rounds):
            shift = rnd % len(COLUMNS)
            for key in COLUMNS[shift:] + COLUMNS[:shift]:
                line = measure(fns[key], w, mm, warmup, seconds, results[key], max_wait)
                print(f"  round {rnd + 1} {key:10s} {line}", flush=True)
        if w.stats_cost:
            stats = (w, *stats_cost(w, mm, stats_rounds, warmup, seconds, max_wait))
        table.append((w, results, tuning, prefetch))
        del mm

    print(f"\n## Throughput (median of {rounds} round(s))\n")
    print("| workload | fastload, default arguments | fastload, prefetch 4 | fastload, tuned | numpy 1 thread | "
          "torch DataLoader | C++ ceiling |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for w, r, _, _ in table:
        print(f"| {w.name} | " + " | ".join(r[k].cell(w.row_bytes) for k in COLUMNS[1:] + COLUMNS[:1]) + " |")

    print("\n## fastload / C++ ceiling (median of the per-round ratios, min–max)\n")
    print("| workload | default arguments | prefetch 4 | tuned | contended rounds |")
    print("| --- | --- | --- | --- | --- |")
    for w, r, _, _ in table:
        cells = [fmt_spread(ratio(r[k], r["ceiling"])) for k, _ in FASTLOAD_COLUMNS]
        print(f"| {w.name} | " + " | ".join(cells) + f" | {contended_rounds(r)} of {rounds} |")
    print(f"\nA round is contended when, during one of its measurements, other processes used more than "
          f"{CONTENDED:g} cores.")

    print("\n## fastload / torch DataLoader (median of the per-round ratios, min–max)\n")
    print("| workload | default arguments | prefetch 4 | tuned |")
    print("| --- | --- | --- | --- |")
    for w, r, _, _ in table:
        print(f"| {w.name} | " + " | ".join(fmt_spread(ratio(r[k], r["dataloader"]), 1) for k, _ in FASTLOAD_COLUMNS) + " |")

    print("\n## What the columns ran\n")
    print("| workload | default: prefetch chosen (16 MiB budget) | tuned: arguments | tuned: from | tune time |")
    print("| --- | --- | --- | --- | --- |")
    for w, _, t, p in table:
        print(f"| {w.name} | {p} | {fmt_knobs(t.knobs)} | {t.how} | "
              f"{'n/a' if t.seconds is None else f'{t.seconds:.1f} s'} |")

    # CPU time per sample depends far less than throughput on how much of the machine others
    # took, so it shows each loader's own cost even when the machine is shared.
    print("\n## CPU time per sample (median round; all threads and worker processes)\n")
    print("| workload | fastload default | fastload prefetch 4 | fastload tuned | numpy 1 thread | torch DataLoader | "
          "C++ ceiling | ceiling/fastload CPU (default) | other processes' load (cores, mean, max) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for w, r, _, _ in table:
        others = [m.other_cores + m.steal_cores for res in r.values() for m in res.ok]
        load = f"{statistics.mean(others):.2f} (max {max(others):.2f})" if others else "n/a"
        eff = spread(round_ratios(r["ceiling"], r["default"], key=lambda m: 1 / m.cpu_ns_per_sample))
        print(f"| {w.name} | " + " | ".join(r[k].cpu_cell() for k in COLUMNS[1:] + COLUMNS[:1]) +
              f" | {fmt_spread(eff)} | {load} |")

    cost = None
    if stats is not None:
        w, on, off = stats
        # Cost = 1 - on/off per round: the throughput the counters take away.
        cost = spread([1 - x for x in round_ratios(on, off)])
        cpu = spread(round_ratios(on, off, key=lambda m: m.cpu_ns_per_sample))
        print(f"\n## Cost of the stats counters ({w.name}, default arguments, {len(on.rounds)} round(s))\n")
        print(f"- counters on: {on.cell(w.row_bytes)}; off: {off.cell(w.row_bytes)} (medians)")
        if cost is not None:
            print(f"- throughput cost (1 - on/off within a round): median {cost.median * 100:.1f}% "
                  f"(rounds {cost.lo * 100:.1f}% to {cost.hi * 100:.1f}%); "
                  f"{verdict(cost, BAR_STATS_COST, below=True)} the bar of < {BAR_STATS_COST * 100:g}%")
        print(f"- CPU per sample, on/off within a round: {fmt_spread(cpu, 3)}; "
              f"contended rounds: {contended_rounds({'on': on, 'off': off})} of {len(on.rounds)}")

    print(f"\n## Bar (median of rounds: default arguments >= {BAR_CEILING:g}x ceiling; >= 20x DataLoader, "
          f"10x on 150 KiB rows; stats < {BAR_STATS_COST * 100:g}%)\n")
    for w, r, _, _ in table:
        verdicts = []
        for key, name in FASTLOAD_COLUMNS:
            for what, other, bar in (("ceiling", "ceiling", BAR_CEILING),
                                     ("DataLoader", "dataloader", bar_dataloader(w.row_bytes))):
                s = ratio(r[key], r[other])
                verdicts.append(f"{name} vs {what}: n/a" if s is None else
                                f"{name} vs {what} {s.median:.2f}x {verdict(s, bar)} {bar:g}x")
        print(f"- {w.name}: " + "; ".join(verdicts))
    if stats is not None:
        print(f"- stats counters: " + ("n/a" if cost is None else
                                        f"{cost.median * 100:.1f}% {verdict(cost, BAR_STATS_COST, below=True)} "
                                        f"< {BAR_STATS_COST * 100:g}%"))

    print("\n## First batch over 10^9 samples\n")
    print("shuffled Loader, batch 256, 9 epochs each; time from iter() to the first batch (median, and how "
          "much of it iter() took)\n")
    try:
        for label, source in billion_sample_sources(args.data_dir):
            assert len(source) == 10**9
            lat, starts = first_batch_latency(source, repeats=9)
            print(f"- {label}: median {statistics.median(lat) * 1e3:.2f} ms, iter() {statistics.median(starts) * 1e3:.2f} ms "
                  f"(all: {', '.join(f'{t * 1e3:.2f}' for t in lat)} ms)")
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"- error: {type(e).__name__}: {e}")
    print(f"\nload average after the run: {open('/proc/loadavg').read().split()[:3]}")

    if args.json is not None:
        out = {"workloads": {w.name: {"default_prefetch": p, "tuned": {"knobs": t.knobs, "how": t.how, "seconds": t.seconds},
                                      "rounds": {k: [as_json(m) for m in res.rounds] for k, res in r.items()}}
                             for w, r, t, p in table}}
        if stats is not None:
            out["stats_cost"] = {"workload": stats[0].name, "on": [as_json(m) for m in stats[1].rounds],
                                 "off": [as_json(m) for m in stats[2].rounds]}
        args.json.write_text(json.dumps(out, indent=1, default=str))
        print(f"figures of every round written to {args.json}")


if __name__ == "__main__":
    try:
        main()
    except SystemExit as e:  # --help, or a bad argument: argparse has said why
        sys.exit(e.code if isinstance(e.code, int) else 0)
    except BaseException:  # noqa: BLE001 - a benchmark reports, it never fails the caller
        traceback.print_exc()
    sys.exit(0)
