"""GPU benchmark: the host-to-device copy ceiling, fastload's delivered bandwidth against it, and a
synthetic training step fed by fastload, by the pinned torch DataLoader and by the hand-written
prefetch loop users write today.

Owns its data (page-cached .npy memmaps written under a temporary directory, removed at exit)
and its tables. Run `python bench/bench_gpu.py [--quick] [--json PATH]`; it always exits 0, and
without a CUDA GPU prints "no CUDA GPU: nothing measured". Each figure is the median of several
rounds, interleaved (every configuration once per round), with the spread (min-max) beside it.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.utils.data

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
ROW_BYTES = 4096            # one sample: a 4 KiB uint8 row (an image patch, a feature vector)
PAGE = os.sysconf("SC_PAGE_SIZE")
CORES = len(os.sched_getaffinity(0))
DATALOADER_WORKERS = 8
# The stand-in GPU of tests/test_gpu_check.py (tests/gpu_standin): fastload runs on the stand-in
# driver and hands out CPU tensors, so this file's own tensors live on the CPU, nothing is pinned
# (torch has no pinned allocator without CUDA), and the matmuls are small. Nothing it prints
# measures a GPU; it runs every line the GPU run does.
STANDIN = bool(getattr(torch.cuda, "is_fastload_standin", False))
PIN = not STANDIN
MATMUL_SIZES = (256, 128) if STANDIN else (4096, 2048, 1024, 512)  # tried in turn until one matmul
                                                                     # is <= a quarter of the step

# (label, batch MiB, GPU work per step in ms): compute-bound (the loader is faster than the step:
# every feeder should reach the ideal) and loader-bound (a step consumes more bytes per second
# than PCIe carries: the feeders' own throughput decides).
STEP_CONFIGS = (("compute-bound", 1, 5.0), ("loader-bound", 64, 0.5))
FASTLOAD_BATCHES_MIB = (1, 8, 64)
FASTLOAD_STREAMS = (1, 2, 4)

# The bars of issue 6.
BAR_DELIVERED = 0.9          # fastload / pinned ceiling, batches >= 8 MiB
BAR_IDEAL = 0.97             # fastload / data already on the device, compute-bound
BAR_VS_DATALOADER = 3.0      # fastload / pinned DataLoader, loader-bound


# ----------------------------------------------------------------------------- results
@dataclass
class Cell:
    """One configuration over all rounds: each round's value(s); the table shows medians."""
    rounds: list[dict[str, float]] = field(default_factory=list)
    error: str | None = None

    def add(self, fn: Callable[[], dict[str, float]]) -> str:
        try:
            values = fn()
        except Exception as e:  # noqa: BLE001 - a failure becomes an error cell, never the end of the run
            traceback.print_exc()
            self.error = f"{type(e).__name__}: {e}".splitlines()[0][:160]
            return f"error: {self.error}"
        finally:
            gc.collect()
        self.rounds.append(values)
        return ", ".join(f"{k} {v:.4g}" for k, v in values.items())

    def median(self, key: str) -> float | None:
        vals = [r[key] for r in self.rounds if key in r]
        return statistics.median(vals) if vals else None

    def spread(self, key: str) -> tuple[float, float] | None:
        vals = [r[key] for r in self.rounds if key in r]
        return (min(vals), max(vals)) if vals else None

    def fmt(self, key: str, digits: int = 3, unit: str = "") -> str:
        if not self.rounds:
            return f"error: {self.error}" if self.error else "n/a"
        med, (lo, hi) = self.median(key), self.spread(key)
        if len(self.rounds) == 1:
            return f"{med:.{digits}g}{unit}"
        return f"{med:.{digits}g}{unit} ({lo:.{digits}g}–{hi:.{digits}g})"

    def as_json(self) -> dict[str, Any]:
        keys = sorted({k for r in self.rounds for k in r})
        return {"rounds": self.rounds, "median": {k: self.median(k) for k in keys}, "error": self.error}


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def fmt_ratio(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def fmt_share(cell: Cell, key: str) -> str:
    if not cell.rounds:
        return "n/a"
    med, (lo, hi) = cell.median(key), cell.spread(key)
    if len(cell.rounds) == 1:
        return f"{100 * med:.1f}%"
    return f"{100 * med:.1f}% ({100 * lo:.1f}–{100 * hi:.1f}%)"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- environment
def environment(argv: list[str]) -> dict[str, Any]:
    env: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/bench_gpu.py"] + argv),
        "python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "numpy": np.__version__, "cores": CORES, "platform": f"{platform.system()} {platform.release()}",
        "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "standin": STANDIN,
    }
    try:
        env["git"] = subprocess.run(["git", "-C", str(HERE), "describe", "--always", "--dirty"],
                                    capture_output=True, text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        env["git"] = "unknown"
    try:
        env["dev_shm_gib"] = round(shutil.disk_usage("/dev/shm").total / 2**30, 1)
    except OSError:
        env["dev_shm_gib"] = None
    try:
        with open("/proc/cpuinfo") as f:
            env["cpu"] = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                              "unknown")
    except OSError:
        env["cpu"] = "unknown"
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env["gpu"] = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}"
        env["gpu_count"] = torch.cuda.device_count()
    return env


def print_environment(env: dict[str, Any]) -> None:
    print("# fastload GPU benchmark\n")
    if env.get("standin"):
        print("STAND-IN RUN (tests/gpu_standin): no GPU; fastload ran on the stand-in driver and nothing "
              "below measures a GPU\n")
    print(f"- date: {env['date']}")
    print(f"- GPU: {env.get('gpu', 'none')}; torch {env['torch']} (CUDA {env['torch_cuda']}), "
          f"python {env['python']}, numpy {env['numpy']}")
    print(f"- host: {env['cores']} cores usable, CPU `{env.get('cpu', 'unknown')}`, {env['ram_gib']} GiB RAM, "
          f"/dev/shm {env['dev_shm_gib']} GiB, {env['platform']}; fastload tree at git {env['git']}")
    print(f"- command: `{env['command']}`\n", flush=True)


# ----------------------------------------------------------------------------- data
def write_rows(path: Path, rows: int) -> np.ndarray:
    """A (rows, ROW_BYTES) uint8 .npy file of random bytes, opened read-only as a memmap and read
    once (one byte per page) so that every later gather hits the page cache."""
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(rows, ROW_BYTES))
    flat = out.reshape(-1)
    rng = np.random.default_rng(0)
    chunk = 64 * MIB
    for start in range(0, flat.size, chunk):
        stop = min(start + chunk, flat.size)
        flat[start:stop] = np.frombuffer(rng.bytes(stop - start), np.uint8)
    out.flush()
    del flat, out
    mm = np.load(path, mmap_mode="r")
    int(mm.reshape(-1)[::PAGE].sum())  # page in
    return mm


class Endless:
    """next() over epochs: a new iterator when one ends, as a training loop does."""

    def __init__(self, make: Callable[[], Iterator[Any]]):
        self.make = make
        self.it = make()

    def __call__(self) -> Any:
        try:
            return next(self.it)
        except StopIteration:
            self.it = self.make()
            return next(self.it)


def tensor_device(device: torch.device) -> torch.device:
    """Where the benchmark's own tensors go: the GPU (the CPU under the stand-in)."""
    return getattr(torch.cuda, "STANDIN_TENSOR_DEVICE", device)


# ----------------------------------------------------------------------------- (a) copy ceiling
def copy_bandwidth(size: int, pinned: bool, budget_bytes: int, device: torch.device) -> dict[str, float]:
    """GB/s of `src -> device` copies of `size` bytes, back to back on a non-blocking stream.

    Pinned: torch's `dst.copy_(src, non_blocking=True)` (one cudaMemcpyAsync on a copy engine),
    timed with CUDA events around the copies. Pageable: the same call from ordinary memory, which
    the driver stages through its own pinned buffer and which blocks the host; timed on the host
    clock up to a synchronize, since that host time is what a training loop pays."""
    src = torch.empty(size, dtype=torch.uint8, pin_memory=pinned and PIN)
    src.copy_(torch.from_numpy(np.frombuffer(np.random.default_rng(size).bytes(size), np.uint8).copy()))
    dst = torch.empty(size, dtype=torch.uint8, device=tensor_device(device))
    reps = max(3, min(20_000, budget_bytes // size))
    stream = torch.cuda.Stream(device=device)
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up
            dst.copy_(src, non_blocking=True)
        stream.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        for _ in range(reps):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        wall = time.perf_counter() - t0
    seconds = start.elapsed_time(end) / 1e3 if pinned else wall
    return {"gbps": reps * size / seconds / 1e9}


# ----------------------------------------------------------------------------- (b) delivered
def fastload_delivered(mm: np.ndarray, batch_bytes: int, streams: int | None, device: torch.device | str,
                       warmup: float, seconds: float) -> dict[str, float]:
    """GB/s fastload hands out: shuffled rows gathered from the memmap, copied to the GPU (or, with
    device="cpu", only gathered), counted when next() returns and closed by a synchronize, so
    every counted batch's copy has completed. The consumer does nothing else. The warm-up lasts
    `warmup` seconds and at least warmup_batches(loader): the pools are full before timing."""
    import fastload as fl

    rows = batch_bytes // ROW_BYTES
    kw = {} if streams is None else {"copy_streams": streams}
    loader = fl.Loader(fl.Dataset({"x": mm}), batch_size=rows, shuffle=True, seed=0, drop_last=True,
                       device=device, **kw)
    cuda = torch.device(device).type == "cuda"
    try:
        next_batch = Endless(lambda: iter(loader))
        end, left = time.perf_counter() + warmup, warmup_batches(loader)
        while time.perf_counter() < end or left > 0:
            next_batch()
            left -= 1
        if cuda:
            torch.cuda.synchronize()
        done = 0
        t0 = time.perf_counter()
        while True:
            next_batch()
            done += 1
            if time.perf_counter() - t0 >= seconds:
                break
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    finally:
        loader.close()
    return {"gbps": done * rows * ROW_BYTES / wall / 1e9, "batches_per_s": done / wall}


def warmup_batches(loader: Any) -> int:
    """Batches that fill and cycle every pinned and device buffer of a fresh loader once: the
    pools grow on first use (cuMemHostAlloc of a 64 MiB slot takes tens of ms), and with 16
    threads a 64 MiB loader holds over a GB; a time-only warm-up would time that growth."""
    stats = loader.stats()
    return 2 * (stats.prefetch + stats.copy_streams)


# ----------------------------------------------------------------------------- (c) training step
class Compute:
    """About `ms` of GPU work: k back-to-back m x m matmuls (bf16), calibrated with CUDA events."""

    def __init__(self, ms: float, device: torch.device):
        self.device = device = tensor_device(device)
        for m in MATMUL_SIZES:
            self.a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
            self.b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
            self.c = torch.empty(m, m, device=device, dtype=torch.bfloat16)
            self.k = 1
            per = self.time()  # ms of one matmul
            if per <= ms / 4 or m == MATMUL_SIZES[-1]:
                break
        self.m = m
        self.k = max(1, round(ms / per))
        self.ms = self.time()

    def __call__(self) -> None:
        for _ in range(self.k):
            torch.matmul(self.a, self.b, out=self.c)

    def time(self, repeats: int = 5) -> float:
        self()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            self()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / repeats


def run_steps(get_batch: Callable[[], torch.Tensor], compute: Compute, warmup: float,
              seconds: float, warmup_steps: int = 0) -> dict[str, float]:
    """Steps/s of a loop `x = get_batch(); compute(); acc += x.sum()` and where the time goes.

    - gpu_wait: the share of the GPU's span (first step's start to last step's end, CUDA events
      on the consumer stream) spent between one step's end and the next one's start, i.e. not
      computing: waiting for the batch's copy (fastload's stream wait, the DataLoader's .to()
      on the current stream) or for a host that is late to enqueue because it waits for data.
    - host_blocked: the share of wall time the host spent in get_batch() (next(), and .to() for
      the DataLoader feeders), which only costs GPU time once the GPU has run out of queued work.
    Steps/s counts whole steps over the wall time, closed by a synchronize. The warm-up runs
    `warmup` seconds and at least `warmup_steps` steps."""
    acc = torch.zeros((), dtype=torch.int64, device=compute.device)
    end = time.perf_counter() + warmup
    while time.perf_counter() < end or warmup_steps > 0:
        warmup_steps -= 1
        x = get_batch()
        compute()
        acc += x.sum(dtype=torch.int64)
        del x
    torch.cuda.synchronize()
    starts: list[torch.cuda.Event] = []
    ends: list[torch.cuda.Event] = []
    blocked = 0.0
    clock = time.perf_counter
    t0 = clock()
    while True:
        tb = clock()
        x = get_batch()
        blocked += clock() - tb
        s = torch.cuda.Event(enable_timing=True)
        s.record()
        compute()
        acc += x.sum(dtype=torch.int64)  # the step reads its whole batch
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        del x
        starts.append(s)
        ends.append(e)
        if clock() - t0 >= seconds:
            break
    torch.cuda.synchronize()
    wall = clock() - t0
    n = len(starts)
    span = starts[0].elapsed_time(ends[-1]) / 1e3
    gaps = sum(ends[i].elapsed_time(starts[i + 1]) for i in range(n - 1)) / 1e3
    return {"steps_per_s": n / wall, "gpu_wait": gaps / span if span > 0 else 0.0,
            "host_blocked": blocked / wall, "step_ms": 1e3 * (span - gaps) / n}


class MemmapBatches(torch.utils.data.Dataset):
    """A DataLoader dataset that fetches a whole batch per __getitem__ (a BatchSampler's list of
    ids) with one numpy fancy index: the fast way to use the DataLoader on a memmap (no per-sample
    Python, no collate). Pickles as its path, so workers of any start method open it themselves."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.n = int(np.load(self.path, mmap_mode="r").shape[0])
        self.mm: np.ndarray | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, ids: list[int]) -> torch.Tensor:
        if self.mm is None:
            self.mm = np.load(self.path, mmap_mode="r")
        return torch.from_numpy(self.mm[np.asarray(ids)])

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "n": self.n, "mm": None}


def make_dataloader(path: Path, rows: int) -> torch.utils.data.DataLoader:
    ds = MemmapBatches(path)
    sampler = torch.utils.data.BatchSampler(
        torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0)), rows, drop_last=True)
    return torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=DATALOADER_WORKERS,
                                       pin_memory=PIN, persistent_workers=True, timeout=300)


def shutdown_dataloader(next_batch: Endless) -> None:
    stop = getattr(next_batch.it, "_shutdown_workers", None)  # private, but the only prompt way
    if stop is not None:
        stop()


class SideStreamPrefetch:
    """The loop users write today (apex/timm style): the next batch's .to() is issued on a side
    stream one step ahead; the consumer waits for that stream and record_stream()s the tensor so
    the caching allocator does not hand its memory out while the step still reads it."""

    def __init__(self, next_cpu: Callable[[], torch.Tensor], device: torch.device):
        self.next_cpu, self.device = next_cpu, device
        self.stream = torch.cuda.Stream(device=device)
        self.ahead = self._load()

    def _load(self) -> torch.Tensor:
        cpu = self.next_cpu()
        with torch.cuda.stream(self.stream):
            return cpu.to(self.device, non_blocking=True)

    def __call__(self) -> torch.Tensor:
        current = torch.cuda.current_stream(self.device)
        current.wait_stream(self.stream)
        x = self.ahead
        x.record_stream(current)
        self.ahead = self._load()
        return x


def feeder_step(name: str, path: Path, mm: np.ndarray, rows: int, compute: Compute, device: torch.device,
                warmup: float, seconds: float, streams: int | None) -> dict[str, float]:
    if name == "ideal":
        rng = np.random.default_rng(1)
        pool = [torch.from_numpy(mm[np.sort(rng.choice(len(mm), rows, replace=False))]).to(tensor_device(device))
                for _ in range(4)]
        i = 0

        def ideal() -> torch.Tensor:
            nonlocal i
            i += 1
            return pool[i % len(pool)]

        return run_steps(ideal, compute, warmup, seconds)
    if name == "fastload":
        import fastload as fl

        kw = {} if streams is None else {"copy_streams": streams}
        loader = fl.Loader(fl.Dataset({"x": mm}), batch_size=rows, shuffle=True, seed=0, drop_last=True,
                           device=device, **kw)
        try:
            batches = Endless(lambda: iter(loader))
            return run_steps(lambda: batches()["x"], compute, warmup, seconds, warmup_batches(loader))
        finally:
            loader.close()
    dl = make_dataloader(path, rows)
    cpu = Endless(lambda: iter(dl))
    try:
        cpu()  # worker start-up, before the warm-up's steady state
        if name == "dataloader":
            return run_steps(lambda: cpu().to(tensor_device(device), non_blocking=True), compute, warmup, seconds)
        if name == "dataloader+prefetch":
            return run_steps(SideStreamPrefetch(cpu, tensor_device(device)), compute, warmup, seconds)
        raise ValueError(name)
    finally:
        shutdown_dataloader(cpu)
        del cpu, dl


FEEDERS = (("ideal", "data already on the GPU (ideal)"),
           ("fastload", "fastload ({fastload})"),
           ("dataloader", "DataLoader(pin_memory, {workers} workers) + .to(non_blocking)"),
           ("dataloader+prefetch", "same DataLoader + side-stream prefetch one batch ahead"))


# ----------------------------------------------------------------------------- main
def no_gpu(env: dict[str, Any], json_path: Path | None) -> int:
    print_environment(env)
    reason = "torch has no CUDA" if torch.version.cuda is None else "torch.cuda.is_available() is False"
    print(table(["section", "result"], [
        ["(a) host-to-device copy ceiling", f"no CUDA GPU: nothing measured ({reason})"],
        ["(b) fastload delivered GB/s", "no CUDA GPU: nothing measured"],
        ["(c) synthetic training step", "no CUDA GPU: nothing measured"],
    ]))
    if json_path is not None:
        json_path.write_text(json.dumps({"environment": env, "measured": False,
                                         "reason": f"no CUDA GPU: {reason}"}, indent=2) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="one round, short timings, a 256 MiB file (well under a minute): a smoke test; "
                         "the full run takes about 3 minutes")
    ap.add_argument("--json", type=Path, default=None, help="also write every round's figures to this file")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, quick 1)")
    ap.add_argument("--seconds", type=float, default=None,
                    help="timed seconds per fastload/step measurement (default 1.5, quick 0.3)")
    ap.add_argument("--copy-streams", "--streams", dest="copy_streams", type=int, default=None,
                    help="fastload's copy_streams in the training-step runs (default: the Loader's default; "
                         "--streams is its old name)")
    ap.add_argument("--data-dir", type=Path, default=None, help="where to write the .npy file (default: a temp dir)")
    ap.add_argument("--file-mib", type=int, default=None,
                    help="size of the .npy file the loaders read (default 2048, quick 256; at least 64)")
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args(argv)
    env = environment(argv)
    if not torch.cuda.is_available():
        return no_gpu(env, args.json)

    quick = args.quick
    rounds = max(1, args.rounds if args.rounds is not None else (1 if quick else 3))
    seconds = args.seconds if args.seconds is not None else (0.3 if quick else 1.5)
    warmup = min(0.5, max(0.1, seconds / 4))
    device = torch.device(args.device)
    torch.cuda.set_device(device)
    copy_sizes = (1, 8, 64) if quick else (1, 4, 8, 16, 64, 256)
    copy_budget = (1 << 30) if quick else (8 << 30)
    file_mib = args.file_mib if args.file_mib is not None else (256 if quick else 2048)
    if file_mib < max(FASTLOAD_BATCHES_MIB):
        ap.error(f"--file-mib must be at least {max(FASTLOAD_BATCHES_MIB)} (one batch of the largest size), got {file_mib}")
    file_rows = file_mib * MIB // ROW_BYTES
    print_environment(env)
    print(f"- timing: {rounds} interleaved round(s); fastload and step measurements {seconds:g} s after a "
          f"{warmup:g} s warm-up; copies: about {copy_budget >> 30} GiB per size and kind; medians with "
          f"(min–max) over rounds\n", flush=True)

    try:
        import fastload as fl
        env["fastload"] = getattr(fl, "__version__", "?")
    except Exception as e:  # noqa: BLE001 - the copy ceiling is still worth measuring
        env["fastload"] = f"import failed: {type(e).__name__}: {e}"
        print(f"fastload: {env['fastload']}", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="fastload_gpu_bench_", dir=args.data_dir))
    copy_cells = {(kind, s): Cell() for s in copy_sizes for kind in ("pinned", "pageable")}
    fl_cells = {(b, st): Cell() for b in FASTLOAD_BATCHES_MIB for st in FASTLOAD_STREAMS}
    host_cells = {b: Cell() for b in FASTLOAD_BATCHES_MIB}
    step_cells = {(label, f): Cell() for label, _, _ in STEP_CONFIGS for f, _ in FEEDERS}
    computes: dict[str, Compute] = {}
    try:
        path = tmp / f"rows_{file_rows}x{ROW_BYTES}.npy"
        t = time.perf_counter()
        mm = write_rows(path, file_rows)
        print(f"data: {path} ({file_rows * ROW_BYTES / 2**30:.2f} GiB of {ROW_BYTES} B rows, page-cached) in "
              f"{time.perf_counter() - t:.1f} s", flush=True)
        for label, _, ms in STEP_CONFIGS:
            computes[label] = Compute(ms, device)
            c = computes[label]
            print(f"step '{label}': {c.k} x bf16 matmul {c.m}x{c.m} = {c.ms:.2f} ms of GPU work", flush=True)

        for r in range(rounds):
            print(f"\nround {r + 1}/{rounds}", flush=True)
            for s in copy_sizes:
                for kind in ("pinned", "pageable"):
                    budget = copy_budget if kind == "pinned" else copy_budget // 4
                    msg = copy_cells[kind, s].add(lambda: copy_bandwidth(s * MIB, kind == "pinned", budget, device))
                    print(f"  copy {kind} {s} MiB: {msg}", flush=True)
            for b in FASTLOAD_BATCHES_MIB:
                msg = host_cells[b].add(lambda: fastload_delivered(mm, b * MIB, None, "cpu", warmup, seconds))
                print(f"  fastload gather only (device=cpu) {b} MiB: {msg}", flush=True)
                for st in FASTLOAD_STREAMS:
                    msg = fl_cells[b, st].add(lambda: fastload_delivered(mm, b * MIB, st, device, warmup, seconds))
                    print(f"  fastload {b} MiB, copy_streams={st}: {msg}", flush=True)
            for label, mib, _ in STEP_CONFIGS:
                for f, _ in FEEDERS:
                    msg = step_cells[label, f].add(lambda: feeder_step(
                        f, path, mm, mib * MIB // ROW_BYTES, computes[label], device, warmup, seconds, args.copy_streams))
                    print(f"  step {label}, {f}: {msg}", flush=True)
    except Exception:  # noqa: BLE001 - report what was measured; the run still exits 0
        traceback.print_exc()
        print("benchmark stopped early; the tables below hold what was measured", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    report(copy_sizes, copy_cells, fl_cells, host_cells, step_cells, computes, env, args.json, args.copy_streams)
    return 0


def report(copy_sizes, copy_cells, fl_cells, host_cells, step_cells, computes, env, json_path,
           streams: int | None) -> None:
    fastload_opts = "default prefetch and copy_streams" if streams is None else f"copy_streams={streams}"
    pinned = {s: copy_cells["pinned", s].median("gbps") for s in copy_sizes}
    ceiling = max((v for v in pinned.values() if v is not None), default=None)

    print("\n## (a) Host-to-device copy bandwidth (the ceiling)\n")
    print("One `dst.copy_(src, non_blocking=True)` per copy, back to back on a non-blocking stream. Pinned:")
    print("GPU time between CUDA events. Pageable: host wall time to a synchronize (the driver stages")
    print("the copy through its own pinned buffer and blocks the host). GB/s = 1e9 bytes/s.\n")
    rows = []
    for s in copy_sizes:
        p, q = copy_cells["pinned", s], copy_cells["pageable", s]
        rows.append([f"{s} MiB", p.fmt("gbps"), q.fmt("gbps"), fmt_ratio(ratio(p.median("gbps"), q.median("gbps")))])
    print(table(["copy size", "pinned GB/s", "pageable GB/s", "pinned / pageable"], rows))
    print(f"\nCeiling (best pinned median): {'n/a' if ceiling is None else f'{ceiling:.2f} GB/s'}")

    print("\n## (b) fastload delivered bandwidth\n")
    print(f"`shuffle=True`, {ROW_BYTES} B rows gathered from a page-cached `np.memmap` .npy file, default")
    print("threads and prefetch; GB/s of batches handed out by next(), closed by a synchronize (every")
    print("counted copy completed); the consumer does nothing else. 'gather only' is the same Loader")
    print("with device=\"cpu\": the host side's own rate, an upper bound for the delivered one.\n")
    rows = []
    bar_b = []
    for b in FASTLOAD_BATCHES_MIB:
        for st in FASTLOAD_STREAMS:
            c = fl_cells[b, st]
            g = c.median("gbps")
            same = pinned.get(b)
            rows.append([f"{b} MiB", str(st), c.fmt("gbps"), fmt_ratio(ratio(g, ceiling)), fmt_ratio(ratio(g, same)),
                         host_cells[b].fmt("gbps")])
            if b >= 8 and g is not None and ceiling:
                bar_b.append(g / ceiling)
    print(table(["batch", "copy_streams", "fastload GB/s", "/ ceiling", "/ pinned copy of the batch's size",
                 "gather only (device=cpu) GB/s"], rows))

    print("\n## (c) Synthetic training step\n")
    print("Each step: `x = next batch` (on the GPU), a calibrated matmul loop (below), `acc += x.sum()`.")
    print("steps/s: whole steps over wall time, closed by a synchronize. GPU wait: share of the GPU's")
    print("span between one step's end and the next one's start (CUDA events on the consumer stream):")
    print("time the GPU was not computing because the batch's copy was not done (fastload's stream wait,")
    print("the DataLoader's .to()) or the host was late to enqueue the step. host blocked: share of wall")
    print("time the host spent getting the batch (next(), plus .to() for the DataLoader), which costs GPU")
    print("time only once the queued work runs out. The ideal cycles 4 batches already on the GPU.")
    print("DataLoader: a BatchSampler over a dataset that fetches a batch with one numpy fancy index")
    print(f"(its fast form), {DATALOADER_WORKERS} workers, pin_memory=True, persistent workers.\n")
    rows = []
    bars_c: dict[str, float | None] = {}
    for label, mib, _ in STEP_CONFIGS:
        c = computes.get(label)
        ideal = step_cells[label, "ideal"].median("steps_per_s")
        for f, name in FEEDERS:
            cell = step_cells[label, f]
            sps = cell.median("steps_per_s")
            rows.append([f"{label}: {mib} MiB batches, {c.ms:.2f} ms compute" if c else label,
                         name.format(workers=DATALOADER_WORKERS, fastload=fastload_opts),
                         cell.fmt("steps_per_s"), fmt_ratio(ratio(sps, ideal)), fmt_share(cell, "gpu_wait"),
                         fmt_share(cell, "host_blocked"),
                         "n/a" if sps is None else f"{sps * mib * MIB / 1e9:.2f}"])
        fast = step_cells[label, "fastload"].median("steps_per_s")
        dls = [step_cells[label, f].median("steps_per_s") for f in ("dataloader", "dataloader+prefetch")]
        best_dl = max((d for d in dls if d is not None), default=None)
        bars_c[label] = ratio(fast, ideal) if label == "compute-bound" else ratio(fast, best_dl)
    print(table(["configuration", "feeder", "steps/s", "vs ideal", "GPU wait", "host blocked", "GB/s fed"], rows))

    print("\n## Against the bar (issue 6)\n")
    worst_b = min(bar_b) if bar_b else None
    cb, lb = bars_c.get("compute-bound"), bars_c.get("loader-bound")

    def verdict(x: float | None, bar: float) -> str:
        return "n/a" if x is None else ("meets" if x >= bar else "misses")

    print(table(["bar", "measured", "verdict"], [
        [f"delivered >= {BAR_DELIVERED}x the pinned ceiling, batches >= 8 MiB (worst of copy_streams 1, 2, 4)",
         fmt_ratio(worst_b), verdict(worst_b, BAR_DELIVERED)],
        [f"compute-bound step: fastload >= {BAR_IDEAL}x data already on the GPU", fmt_ratio(cb), verdict(cb, BAR_IDEAL)],
        [f"loader-bound step: fastload >= {BAR_VS_DATALOADER}x the better pinned DataLoader loop", fmt_ratio(lb),
         verdict(lb, BAR_VS_DATALOADER)],
    ]))

    if json_path is not None:
        out = {
            "environment": env, "measured": True, "ceiling_gbps": ceiling,
            "copy": [{"kind": k, "mib": s, **v.as_json()} for (k, s), v in copy_cells.items()],
            "fastload": [{"batch_mib": b, "copy_streams": st, **v.as_json()} for (b, st), v in fl_cells.items()],
            "gather_only": [{"batch_mib": b, **v.as_json()} for b, v in host_cells.items()],
            "steps": [{"config": label, "feeder": f, **v.as_json()} for (label, f), v in step_cells.items()],
            "compute": {label: {"matmuls": c.k, "m": c.m, "ms": c.ms} for label, c in computes.items()},
            "bars": {"delivered_worst": worst_b, "compute_bound_vs_ideal": cb, "loader_bound_vs_dataloader": lb},
        }
        json_path.write_text(json.dumps(out, indent=2) + "\n")
        print(f"\nwrote {json_path}")


if __name__ == "__main__":
    sys.exit(main())
