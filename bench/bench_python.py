"""Python datasets, side by side: fastload (threads, processes) against torch DataLoader, SPDL,
Grain and a plain ThreadPoolExecutor + np.stack, 2 workers each, on three __getitem__ workloads.

- jpeg: 320x240 JPEG files decoded with PIL, random 224 crop + flip in numpy, batch 64
- gil: a pure-Python loop per sample (a toy tokeniser), batch 256
- overhead: one 64-float row and an int per sample, batch 256

Every alternative is built fresh in every round (start-up excluded by a warm-up), rounds visit
the alternatives in a new order each time, and a ratio is taken within its round: the table shows
the median ratio to torch DataLoader over the rounds with its min-max. Beside each: CPU seconds
per sample (this process and its children) and the peak RSS of the whole process tree, and
the CPU other processes used meanwhile (the machine may be shared). Run
`python bench/bench_python.py [--rounds 5] [--seconds 3] [--quick]`; see bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import datetime
import gc
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_loader import CpuMeter, wait_for_quiet  # noqa: E402 - the CPU accounting both benchmarks share

DATA = HERE / "data"
WORKERS = 2
PAGE = os.sysconf("SC_PAGE_SIZE")
# Other processes using more than this many cores during a measurement make it "contended".
CONTENDED = 0.3
# The bars (issue 15): fastload's column / DataLoader's, median over the rounds.
BARS = {"jpeg": ("fastload threads", 1.15), "gil": ("fastload processes", 1.0), "overhead": ("fastload threads", 3.0)}


# ----------------------------------------------------------------------------- datasets
# Module level, so that spawned workers (fastload processes, DataLoader, SPDL, Grain) unpickle them.
class JpegCrops:
    """PIL decode of a 320x240 JPEG file, then a random 224x224 crop and a random horizontal flip
    in numpy: {"image": (224, 224, 3) uint8, "label": int}."""

    def __init__(self, paths: list[str]):
        self.paths = paths

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> dict:
        from PIL import Image
        with Image.open(self.paths[i]) as im:
            a = np.asarray(im.convert("RGB"))
        y, x = random.randrange(a.shape[0] - 223), random.randrange(a.shape[1] - 223)
        crop = a[y:y + 224, x:x + 224]
        if random.random() < 0.5:
            crop = crop[:, ::-1]
        return {"image": np.ascontiguousarray(crop), "label": i % 1000}


class ToyTokens:
    """A pure-Python tokeniser (holds the GIL throughout): splits a ~250-character text into
    words and hashes each character by character: {"tokens": (64,) int64, "count": int}."""

    LENGTH = 64

    def __init__(self, n: int = 200_000, texts: int = 4096):
        rng = random.Random(0)
        words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
                 for _ in range(5000)]
        self.texts = [" ".join(rng.choice(words) for _ in range(45)) for _ in range(texts)]
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        ids = []
        for word in self.texts[i % len(self.texts)].split():
            h = 7
            for ch in word:
                h = (h * 31 + ord(ch)) & 0xFFFF
            ids.append(h)
        count = min(len(ids), self.LENGTH)
        ids = ids[:self.LENGTH] + [0] * (self.LENGTH - count)
        return {"tokens": np.array(ids, dtype=np.int64), "count": count}


class SmallRows:
    """One 64-float row and an int per sample: per-sample overhead is all there is."""

    def __init__(self, n: int = 200_000):
        self.x = np.random.default_rng(0).standard_normal((n, 64)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple:
        return self.x[i], i % 10


def ensure_jpegs(count: int) -> list[str]:
    """`count` 320x240 JPEG files (quality 90, smooth gradients and noise: ~20 KB each, like
    photos, not like flat colour) in bench/data, written once."""
    from PIL import Image
    folder = DATA / f"jpeg_320x240_{count}"
    paths = [str(folder / f"{k:06d}.jpg") for k in range(count)]
    if all(os.path.exists(p) for p in paths):
        return paths
    print(f"  writing {count} JPEG files to {folder} ...", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:240, 0:320].astype(np.float32)
    for k, p in enumerate(paths):
        if os.path.exists(p):
            continue
        fx, fy, phase = rng.uniform(0.005, 0.05, 3)
        base = np.stack([np.sin(xx * fx + phase * c) * np.cos(yy * fy + c) for c in range(3)], axis=-1)
        img = np.clip(127 + 100 * base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        tmp = p + ".tmp"
        Image.fromarray(img).save(tmp, format="JPEG", quality=90)
        os.replace(tmp, p)  # never a half-written file under the final name
    return paths


@dataclass
class Workload:
    name: str
    label: str
    batch: int
    make: Callable[[], Any]
    kind: str  # what the peers run it on: "threads" or "processes"


def workloads(quick: bool) -> list[Workload]:
    jpegs = 512 if quick else 2048
    return [
        Workload("jpeg", "JPEG 320x240, PIL decode + random 224 crop + flip", 64,
                 lambda: JpegCrops(ensure_jpegs(jpegs)), "threads"),
        Workload("gil", "pure-Python tokeniser loop (GIL-bound)", 256, lambda: ToyTokens(), "processes"),
        Workload("overhead", "64-float row + an int", 256, lambda: SmallRows(), "threads"),
    ]


# ----------------------------------------------------------------------------- alternatives
def np_collate(samples: list) -> Any:
    """What a hand-written loader does: np.stack per field (dicts, tuples, ints)."""
    first = samples[0]
    if isinstance(first, dict):
        return {k: np_collate([s[k] for s in samples]) for k in first}
    if isinstance(first, tuple):
        return tuple(np_collate([s[j] for s in samples]) for j in range(len(first)))
    if isinstance(first, np.ndarray):
        return np.stack(samples)
    return np.asarray(samples)


def index_batches(n: int, batch: int, seed: int) -> Iterator[list[int]]:
    """Shuffled full batches of sample ids, epoch after epoch, with no gap between epochs."""
    epoch = 0
    while True:
        perm = np.random.default_rng((seed, epoch)).permutation(n)
        for k in range(0, n - batch + 1, batch):
            yield perm[k:k + batch].tolist()
        epoch += 1


class Running:
    """One alternative, built: an endless iterator of batches and how to close it."""

    def __init__(self, batches: Iterator[Any], close: Callable[[], None] = lambda: None):
        self.batches, self.close = batches, close


def epochs(loader: Any) -> Iterator[Any]:
    while True:
        yield from loader


def run_dataloader(ds: Any, batch: int) -> Running:
    import torch.utils.data
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, drop_last=True, num_workers=WORKERS,
                                         persistent_workers=True, prefetch_factor=4)
    it = epochs(loader)

    def close() -> None:
        nonlocal loader
        it.close()
        del loader  # persistent workers end when the loader's iterator is collected
        gc.collect()

    return Running(it, close)


def run_fastload(ds: Any, batch: int, workers: str) -> Running:
    import fastload as fl
    loader = fl.Loader(ds, batch, shuffle=True, drop_last=True, num_workers=WORKERS, workers=workers, device="cpu")
    return Running(epochs(loader), loader.close)


def run_pool(ds: Any, batch: int) -> Running:
    """A ThreadPoolExecutor with one task per batch ([ds[i] for i in ids], then np.stack), 4
    batches in flight."""
    pool = concurrent.futures.ThreadPoolExecutor(WORKERS)

    def load(ids: list[int]) -> Any:
        return np_collate([ds[i] for i in ids])

    def gen() -> Iterator[Any]:
        pending: collections.deque = collections.deque()
        for ids in index_batches(len(ds), batch, 0):
            pending.append(pool.submit(load, ids))
            if len(pending) >= 4:
                yield pending.popleft().result()

    it = gen()

    def close() -> None:
        it.close()
        pool.shutdown(wait=True, cancel_futures=True)

    return Running(it, close)


_POOL_DATASET: Any = None


def _pool_init(ds: Any) -> None:
    global _POOL_DATASET
    _POOL_DATASET = ds


def _pool_load(ids: list[int]) -> Any:
    return np_collate([_POOL_DATASET[i] for i in ids])


def run_spdl(ds: Any, batch: int, kind: str) -> Running:
    """SPDL's pipeline as its documentation recommends for throughput: the source yields batches
    of indices (batched at the source, not per sample), and one stage loads and collates a whole
    batch with concurrency 2: on 2 threads, or for GIL-bound code in a persistent
    ProcessPoolExecutor of 2 processes holding the dataset (spdl.dataloader.get_pytorch_dataloader
    does the same but starts a new pool every epoch)."""
    from spdl.pipeline import PipelineBuilder
    pool = None
    if kind == "processes":
        pool = concurrent.futures.ProcessPoolExecutor(WORKERS, initializer=_pool_init, initargs=(ds,))
        stage = dict(executor=pool)
        load: Callable[[list[int]], Any] = _pool_load
    else:
        stage = {}
        load = lambda ids: np_collate([ds[i] for i in ids])  # noqa: E731
    pipeline = (PipelineBuilder()
                .add_source(index_batches(len(ds), batch, 0))
                .pipe(load, concurrency=WORKERS, output_order="completion", **stage)
                .add_sink(4)
                .build(num_threads=WORKERS))
    pipeline.start()
    it = pipeline.get_iterator(timeout=120)

    def close() -> None:
        pipeline.stop()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    return Running(it, close)


def run_grain(ds: Any, batch: int, kind: str) -> Running:
    """Grain's dataset API: MapDataset.source(ds).shuffle().repeat().batch() (a whole batch per
    element, collated by Grain's own batch function), then to_iter_dataset with 2 read threads and
    a prefetch buffer of 4 batches (its default 500-element buffer is slower: bench/RESULTS.md);
    processes: the same with 1 read thread in each of 2 workers (mp_prefetch)."""
    import grain
    dataset = grain.MapDataset.source(ds).shuffle(seed=0).repeat().batch(batch, drop_remainder=True)
    if kind == "processes":
        it_ds = dataset.to_iter_dataset(grain.ReadOptions(num_threads=1, prefetch_buffer_size=2))
        it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=WORKERS, per_worker_buffer_size=2))
    else:
        it_ds = dataset.to_iter_dataset(grain.ReadOptions(num_threads=WORKERS, prefetch_buffer_size=4))
    it = iter(it_ds)

    def close() -> None:
        nonlocal it
        for name in ("close", "stop"):
            fn = getattr(it, name, None)
            if fn:
                fn()
                break
        del it
        gc.collect()

    return Running(it, close)


@dataclass
class Alternative:
    name: str
    start: Callable[[Any, int], Running]
    needs: str = ""  # the module that must be importable

    def missing(self) -> str | None:
        if not self.needs:
            return None
        try:
            __import__(self.needs)
        except Exception as e:  # noqa: BLE001 - any import failure means the peer cannot run here
            return f"{type(e).__name__}: {e}"
        return None


def alternatives(w: Workload) -> list[Alternative]:
    kind = w.kind
    return [
        Alternative("DataLoader", run_dataloader),
        Alternative("fastload threads", lambda ds, b: run_fastload(ds, b, "threads")),
        Alternative("fastload processes", lambda ds, b: run_fastload(ds, b, "processes")),
        Alternative("thread pool + np.stack", run_pool),
        Alternative(f"SPDL {kind}", lambda ds, b: run_spdl(ds, b, kind), "spdl.pipeline"),
        Alternative(f"Grain {kind}", lambda ds, b: run_grain(ds, b, kind), "grain"),
    ]


# ----------------------------------------------------------------------------- measuring
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids[ppid].append(int(entry))
    return kids


def process_tree() -> list[int]:
    """This process and all its descendants (worker processes, their helpers)."""
    kids, out, todo = _children(), [], [os.getpid()]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


def _gone(pid: int) -> bool:
    """Exited (or a zombie), or multiprocessing's resource tracker: started by the first spawn,
    it stays until exit by design and belongs to no alternative."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"resource_tracker" in f.read()
    except (OSError, IndexError):
        return True


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


class TreeMeter:
    """Over a measurement: the peak of the sum of the RSS of this process and its descendants,
    sampled every 50 ms by a thread that sleeps in between."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, sum(_rss(p) for p in self.pids))
            if self._stop.wait(0.05):
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


@dataclass
class Result:
    samples_per_s: float
    cpu_us_per_sample: float
    peak_rss: int
    other_cores: float
    error: str = ""


def measure(alt: Alternative, ds: Any, batch: int, warmup: float, seconds: float, max_wait: float = 0.0) -> Result:
    before = set(process_tree())
    # Before the alternative starts: while it runs, its prefetch queue would refill during the
    # wait, and its worker processes' CPU would count as other processes'.
    if max_wait > 0:  # bench_loader's wait samples the machine at least once, even with nothing to wait for
        wait_for_quiet(max_wait)
    running = alt.start(ds, batch)
    try:
        it = running.batches
        next(it)  # start-up (spawning workers) is not measured
        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            next(it)
        pids = process_tree()  # after the warm-up: every worker process exists now
        cpu, rss = CpuMeter(p for p in pids if p != os.getpid()), TreeMeter(pids)
        done = 0
        end = time.perf_counter() + seconds
        while True:
            next(it)
            done += 1
            if time.perf_counter() >= end:
                break
        m, peak = cpu.stop(), rss.stop()
    finally:
        running.close()
        left: set[int] = set()
        for _ in range(50):  # worker processes need a moment to exit
            left = {p for p in process_tree() if p not in before and not _gone(p)}
            if not left:
                break
            time.sleep(0.1)
        if left:
            print(f"  note: {alt.name} left {len(left)} process(es) running after close: {sorted(left)}", flush=True)
    samples = done * batch
    return Result(samples / m["wall"], m["own_cpu_s"] / samples * 1e6, peak, m["other_cores"])


@dataclass
class Table:
    workload: Workload
    names: list[str]
    results: dict[str, list[Result]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def _si(v: float) -> str:
    for scale, unit in ((1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:.3g} {unit}"
    return f"{v:.3g}"


def report(tables: list[Table], rounds: int) -> str:
    lines = []
    for t in tables:
        w = t.workload
        base = t.results.get("DataLoader", [])
        lines.append(f"### {w.label}, batch {w.batch} (peers on {w.kind})")
        lines.append("")
        lines.append("| alternative | samples/s (median) | / DataLoader: median (min–max) | CPU µs/sample | "
                     "peak RSS, all processes | contended rounds |")
        lines.append("| --- | --- | --- | --- | --- | --- |")
        for name in t.names:
            if name in t.skipped:
                lines.append(f"| {name} | not run: {t.skipped[name]} | | | | |")
                continue
            rs = t.results.get(name, [])
            ok = [(k, r) for k, r in enumerate(rs) if not r.error]
            if not ok:
                err = next((r.error for r in rs if r.error), "no rounds")
                lines.append(f"| {name} | failed: {err} | | | | |")
                continue
            rate = statistics.median(r.samples_per_s for _, r in ok)
            ratios = [r.samples_per_s / base[k].samples_per_s for k, r in ok
                      if k < len(base) and not base[k].error and base[k].samples_per_s > 0]
            ratio = (f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}–{max(ratios):.2f})" if ratios else "-")
            cpu = statistics.median(r.cpu_us_per_sample for _, r in ok)
            rss = statistics.median(r.peak_rss for _, r in ok) / 2**20
            busy = sum(r.other_cores > CONTENDED for _, r in ok)
            lines.append(f"| {name} | {_si(rate)} | {ratio} | {cpu:.3g} | {rss:,.0f} MiB | {busy} of {len(ok)} |")
        others = [r.other_cores for rs in t.results.values() for r in rs if not r.error]
        if others:
            lines.append("")
            lines.append(f"Other processes' CPU during these measurements: median {statistics.median(others):.2f} "
                         f"cores, max {max(others):.2f} (of {len(os.sched_getaffinity(0))}).")
        if w.name in BARS:
            name, bar = BARS[w.name]
            rs, ok = t.results.get(name, []), []
            for k, r in enumerate(rs):
                if not r.error and k < len(base) and not base[k].error:
                    ok.append(r.samples_per_s / base[k].samples_per_s)
            if ok:
                got = statistics.median(ok)
                lines.append(f"Bar: {name} >= {bar}x the DataLoader: {got:.2f}x, "
                             f"{'met' if got >= bar else 'NOT met'}.")
        lines.append("")
    return "\n".join(lines)


def environment() -> str:
    import torch
    import fastload
    versions = [f"python {platform.python_version()}", f"torch {torch.__version__}", f"numpy {np.__version__}",
                f"fastload {fastload.__version__}"]
    for mod in ("PIL", "spdl", "grain"):
        try:
            m = __import__(mod)
            from importlib.metadata import version
            versions.append(f"{mod} {getattr(m, '__version__', None) or version({'PIL': 'pillow'}.get(mod, mod))}")
        except Exception:  # noqa: BLE001
            versions.append(f"{mod}: not installed")
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE,
                             timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        rev = "?"
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    versions.append(f"fastload imported from {os.path.dirname(fastload.__file__)}")
    return (f"- {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, bench at git {rev}; "
            f"{len(os.sched_getaffinity(0))} usable cores ({cpu}); {', '.join(versions)}\n"
            f"- command: `python {' '.join([os.path.relpath(__file__)] + sys.argv[1:])}`")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per alternative and round")
    parser.add_argument("--warmup", type=float, default=1.0, help="after the first batch")
    parser.add_argument("--max-wait", type=float, default=0.0,
                        help="before each measurement, wait up to this many seconds for the machine to be quiet")
    parser.add_argument("--workloads", default="jpeg,gil,overhead")
    parser.add_argument("--only", default=None, help="comma-separated alternatives (DataLoader always runs)")
    parser.add_argument("--quick", action="store_true", help="1 round of 1 s, fewer JPEG files: a smoke test")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds, args.warmup = 1, 1.0, 0.3
    chosen = [w for w in workloads(args.quick) if w.name in args.workloads.split(",")]
    if not chosen:
        parser.error(f"--workloads: none of {args.workloads!r} is one of jpeg, gil, overhead")
    # No alternative may be quieter because fastload's stall hint logs.
    import logging
    logging.getLogger("fastload").setLevel(logging.ERROR)
    print(environment(), flush=True)
    tables = []
    order_rng = random.Random(0)
    for w in chosen:
        ds = w.make()
        alts = alternatives(w)
        if args.only:
            keep = set(args.only.split(",")) | {"DataLoader"}
            alts = [a for a in alts if a.name in keep]
        t = Table(w, [a.name for a in alts])
        runnable = []
        for a in alts:
            why = a.missing()
            if why:
                t.skipped[a.name] = f"cannot be imported here ({why})"
            else:
                runnable.append(a)
        for r in range(args.rounds):
            order = list(runnable)
            order_rng.shuffle(order)
            for a in order:
                try:
                    res = measure(a, ds, w.batch, args.warmup, args.seconds, args.max_wait)
                except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
                    traceback.print_exc()
                    res = Result(0, 0, 0, 0, error=f"{type(e).__name__}: {e}"[:200])
                t.results.setdefault(a.name, []).append(res)
                print(f"  {w.name} round {r + 1}/{args.rounds} {a.name:24s} "
                      + (res.error or f"{_si(res.samples_per_s)} samples/s, {res.cpu_us_per_sample:.3g} µs CPU, "
                                      f"{res.peak_rss / 2**20:,.0f} MiB, others {res.other_cores:.2f}"), flush=True)
        tables.append(t)
        del ds
        gc.collect()
    print()
    print(report(tables, args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
