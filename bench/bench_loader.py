"""Throughput benchmark: fastload vs numpy fancy indexing, torch DataLoader and a C++ ceiling.

Owns the benchmark data files (bench/data/, git-ignored) and the results table; the ceiling's
copy loop lives in bench/ceiling.cpp. Run `python bench/bench_loader.py [--quick]`; see
bench/RESULTS.md for the latest full run and how to read it.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.utils.data

import fastload as fl

HERE = Path(__file__).resolve().parent
CORES = len(os.sched_getaffinity(0))
PAGE = os.sysconf("SC_PAGE_SIZE")

# The ceiling's prefetch: rows ahead of the copy, and cache lines started per row (the hardware
# prefetcher follows a row's later lines). Chosen as the fastest settings tried on the reference
# machine (see RESULTS.md); the same for every workload so nothing is tuned per row size.
CEILING_AHEAD = 8
CEILING_LINES = 4


# ----------------------------------------------------------------------------- workloads
@dataclass
class Workload:
    name: str            # table label
    file: str            # .npy file name inside the data dir
    shape: tuple         # of the .npy array
    dtype: type
    batch: int
    window: tuple | None = None  # (length, stride) in tokens for a token-window workload

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
    """Full runs use ~1.5 GiB per row file and a 2 GB token file (bigger than every cache, so
    random rows miss to DRAM); --quick uses ~32 MiB files, enough to exercise every path."""
    scale = 1 / 48 if quick else 1.0
    kib = 1024
    n1k = int(1536 * kib * scale)            # 1 KiB rows: 1.5 GiB
    n64 = int(24 * kib * kib * scale)        # 64 B rows: 1.5 GiB
    n150 = int(10240 * scale)                # 150 KiB rows: 1.5 GiB
    ntok = int(10**9 * scale)                # uint16 tokens: 2 GB
    return [
        Workload("1 KiB rows, batch 256", f"rows1k_{n1k}.npy", (n1k, 1024), np.uint8, 256),
        Workload("64 B rows, batch 4096", f"rows64_{n64}.npy", (n64, 64), np.uint8, 4096),
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
    every page in this process, so no alternative pays first-touch faults the others do not."""
    flat = mm.reshape(-1).view(np.uint8)
    int(flat[::PAGE].sum())


def sparse_file(path: Path, size: int) -> np.memmap:
    """A file of `size` zero bytes that occupies no disk (a hole made by truncate)."""
    if not path.exists() or path.stat().st_size != size:
        with open(path, "wb") as f:
            f.truncate(size)
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(size,))


# ----------------------------------------------------------------------------- measurements
@dataclass
class Result:
    samples_per_s: float | None = None
    error: str | None = None

    def cell(self, row_bytes: int) -> str:
        if self.error:
            return f"error: {self.error}"
        return f"{fmt_rate(self.samples_per_s)} samples/s, {self.samples_per_s * row_bytes / 1e9:.2f} GB/s"


def fmt_rate(x: float) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= div:
            return f"{x / div:.3g} {unit}"
    return f"{x:.3g}"


def timed_batches(next_batch: Callable[[], object], batch: int, warmup: float, seconds: float) -> float:
    """Samples/s of calling next_batch() for `seconds` of wall clock after `warmup` seconds.
    Counts whole batches only; the clock read per batch (~50 ns) is the only added work."""
    clock = time.perf_counter
    end = clock() + warmup
    while clock() < end:
        next_batch()
    done = 0
    start = clock()
    end = start + seconds
    while True:
        next_batch()
        done += 1
        now = clock()
        if now >= end:
            return done * batch / (now - start)


def attempt(fn: Callable[[], float]) -> Result:
    """Runs one alternative; a failure becomes an error cell instead of ending the benchmark."""
    try:
        return Result(samples_per_s=fn())
    except Exception as e:  # noqa: BLE001 - every failure is reported in the table
        traceback.print_exc()
        msg = f"{type(e).__name__}: {e}".splitlines()[0]
        return Result(error=msg[:120])
    finally:
        gc.collect()


def fastload_source(w: Workload, mm: np.ndarray):
    if w.window:
        return fl.Windows(mm, length=w.window[0], stride=w.window[1])
    return fl.Dataset({"x": mm})


def run_fastload(w: Workload, mm: np.ndarray, warmup: float, seconds: float) -> float:
    loader = fl.Loader(fastload_source(w, mm), batch_size=w.batch, shuffle=True, seed=0,
                       drop_last=True, num_threads=CORES, prefetch=4, device="cpu")
    try:
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


def run_numpy(w: Workload, mm: np.ndarray, warmup: float, seconds: float) -> float:
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
    perm = np.random.default_rng(0).permutation(n)
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


def run_dataloader(w: Workload, mm: np.ndarray, warmup: float, seconds: float) -> float:
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

        # The first batch (worker start-up) is not part of the warm-up budget's steady state.
        next_batch()
        return timed_batches(next_batch, w.batch, warmup, seconds)
    finally:
        # Stop the workers now: idle persistent workers must not share the CPU with what follows.
        shutdown = getattr(it, "_shutdown_workers", None)  # private, but the only prompt way
        if shutdown is not None:
            shutdown()
        del it, dl


_ceiling_lib = None


def ceiling_lib() -> ctypes.CDLL:
    """Compiles bench/ceiling.cpp once per run into a temporary directory."""
    global _ceiling_lib
    if _ceiling_lib is None:
        out = Path(tempfile.mkdtemp(prefix="fastload_ceiling_")) / "libceiling.so"
        cmd = ["g++", "-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", str(HERE / "ceiling.cpp"), "-o", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"compiling the ceiling failed: {proc.stderr.strip()[:300]}")
        lib = ctypes.CDLL(str(out))
        lib.ceiling_gather.restype = ctypes.c_int64
        lib.ceiling_gather.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                       ctypes.c_int64, ctypes.c_int32, ctypes.c_double, ctypes.c_int64,
                                       ctypes.c_int64]
        _ceiling_lib = lib
    return _ceiling_lib


def run_ceiling(w: Workload, mm: np.ndarray, warmup: float, seconds: float,
                ahead: int = CEILING_AHEAD, lines: int = CEILING_LINES) -> float:
    lib = ceiling_lib()
    address = mm.__array_interface__["data"][0]
    item = mm.dtype.itemsize
    pitch = w.window[1] * item if w.window else mm.strides[0]
    args = (address, w.num_samples(), pitch, w.row_bytes, w.batch, CORES)
    if lib.ceiling_gather(*args, warmup, ahead, lines) < 0:
        raise RuntimeError("ceiling_gather rejected its arguments")
    start = time.perf_counter()
    rows = lib.ceiling_gather(*args, seconds, ahead, lines)  # ctypes releases the GIL here
    return rows / (time.perf_counter() - start)


def first_batch_latency(data_dir: Path, repeats: int) -> list[float]:
    """Seconds from iter() to the first batch of a shuffled Loader over 10^9 samples (windows of
    one byte over a sparse 1 GB file), one new epoch per repeat."""
    tokens = sparse_file(data_dir / "sparse_1e9.bin", 10**9)
    win = fl.Windows(tokens, length=1, stride=1)
    assert len(win) == 10**9
    loader = fl.Loader(win, batch_size=256, shuffle=True, seed=0, num_threads=CORES, device="cpu")
    times = []
    try:
        for _ in range(repeats):
            start = time.perf_counter()
            batch = next(iter(loader))
            times.append(time.perf_counter() - start)
            assert batch["tokens"].shape == (256, 1)
    finally:
        loader.close()
    return times


# ----------------------------------------------------------------------------- report
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
        rev = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip() or "unknown"
    except OSError:
        rev = "unknown"
    return [
        f"- date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"- machine: {CORES} cores usable ({os.cpu_count()} online), CPU `{model}`, {mem:.1f} GiB RAM, "
        f"{platform.system()} {platform.release()}",
        f"- python {platform.python_version()}, torch {torch.__version__}, numpy {np.__version__}, "
        f"fastload {getattr(fl, '__version__', '?')} (git {rev})",
    ]


def ratio(a: Result, b: Result) -> str:
    if a.error or b.error or not b.samples_per_s:
        return "n/a"
    return f"{a.samples_per_s / b.samples_per_s:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small files, short timings (< 1 minute): a smoke test")
    ap.add_argument("--seconds", type=float, default=None, help="timed seconds per measurement (default 3, quick 0.3)")
    ap.add_argument("--data-dir", type=Path, default=HERE / "data", help="where the .npy files live (default bench/data)")
    args = ap.parse_args()
    seconds = args.seconds if args.seconds is not None else (0.3 if args.quick else 3.0)
    warmup = min(0.5, max(0.1, seconds / 3))
    args.data_dir.mkdir(parents=True, exist_ok=True)

    print("# fastload loader benchmark\n")
    print("\n".join(machine_lines()))
    print(f"- command: `python bench/bench_loader.py {' '.join(sys.argv[1:])}`".replace("  ", " "))
    print(f"- timing: {seconds:g} s per measurement after {warmup:g} s warm-up, whole batches; "
          f"{CORES} threads/workers for fastload, DataLoader and the ceiling\n", flush=True)

    rows = []
    for w in workloads(args.quick):
        print(f"{w.name}: {w.num_samples()} samples of {w.row_bytes} B", flush=True)
        try:
            mm = ensure_file(args.data_dir / w.file, w.shape, w.dtype)
            page_in(mm)
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            err = Result(error=f"data: {type(e).__name__}: {e}"[:120])
            rows.append((w, err, err, err, err))
            continue
        results = {}
        for label, fn in (("ceiling", run_ceiling), ("fastload", run_fastload), ("numpy", run_numpy),
                          ("dataloader", run_dataloader)):
            results[label] = attempt(lambda: fn(w, mm, warmup, seconds))
            print(f"  {label:10s} {results[label].cell(w.row_bytes)}", flush=True)
        rows.append((w, results["fastload"], results["numpy"], results["dataloader"], results["ceiling"]))
        del mm

    print("\n| workload | fastload | numpy 1 thread | torch DataLoader | C++ ceiling | fastload/ceiling | fastload/DataLoader |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for w, f, n, d, c in rows:
        print(f"| {w.name} | {f.cell(w.row_bytes)} | {n.cell(w.row_bytes)} | {d.cell(w.row_bytes)} | "
              f"{c.cell(w.row_bytes)} | {ratio(f, c)} | {ratio(f, d)} |")

    # The bar fastload is held to (see bench/RESULTS.md): >= 0.7x the ceiling everywhere, and
    # >= 20x the DataLoader (>= 10x on 150 KiB rows, where the DataLoader's per-sample cost is
    # small next to the copy).
    print("\nbar (>= 0.7x ceiling; >= 20x DataLoader, 10x for 150 KiB rows):")
    for w, f, _, d, c in rows:
        need = 10 if w.row_bytes > 100_000 else 20
        verdicts = []
        for what, other, bar in (("ceiling", c, 0.7), ("DataLoader", d, need)):
            if f.error or other.error or not other.samples_per_s:
                verdicts.append(f"vs {what}: n/a")
            else:
                r = f.samples_per_s / other.samples_per_s
                verdicts.append(f"vs {what} {r:.2f}x {'meets' if r >= bar else 'MISSES'} {bar:g}x")
        print(f"- {w.name}: " + "; ".join(verdicts))

    try:
        lat = first_batch_latency(args.data_dir, repeats=7)
        print(f"\nfirst batch of a shuffled Loader over 10^9 samples (iter() -> first batch, batch 256, "
              f"{len(lat)} epochs): median {statistics.median(lat) * 1e3:.2f} ms, "
              f"min {min(lat) * 1e3:.2f} ms, max {max(lat) * 1e3:.2f} ms")
    except Exception as e:  # noqa: BLE001
        traceback.print_exc()
        print(f"\nfirst batch over 10^9 samples: error: {type(e).__name__}: {e}")


if __name__ == "__main__":
    try:
        main()
    except BaseException:  # noqa: BLE001 - a benchmark reports, it never fails the caller
        traceback.print_exc()
    sys.exit(0)
