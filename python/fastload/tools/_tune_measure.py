"""How ``fl.tune`` measures: tune() itself, the grid of knobs (num_threads x prefetch x
copy_streams x workers), one loader per configuration pulled as fast as it hands out batches,
the CPU other processes used meanwhile, and the progress line. What is measured is opened by
_tune_source.py; the result types are _tune_report.py's."""
from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import statistics
import sys
import time
import warnings
from typing import Any, Iterator, Mapping, Sequence, TextIO, Union

import numpy as np
import torch

from .. import _C
from .._config import default_config
from .._loader import Loader
from .._machine import usable_cpus
from .._sources.protocol import Source
from .._sources.python import PythonSource
from ._cli import ProgressLine
from ._tune_report import WORKER_KINDS, TunePoint, TuneResult, defaults_of, loader_args, recommend
from ._tune_source import SourceLike, as_tune_source

DEFAULT_PREFETCH = (2, 4, 8, 16, 32)
# A Python dataset adds the workers axis and a worker process start per configuration and round:
# fewer prefetch values keep a run near a minute (prefetch matters less where __getitem__ costs more).
DEFAULT_PREFETCH_PYTHON = (2, 8, 32)
DEFAULT_COPY_STREAMS = (1, 2, 4)
DEFAULT_REPEATS = 3
# seconds=None spreads about this much measuring time over the grid's points and rounds...
BUDGET_S = 40.0
# ... giving each point a time within these bounds (and a warm-up before it).
SECONDS_RANGE = (0.25, 1.0)
# The default prefetch grid leaves out values whose loader memory, (prefetch + 2) batches
# (fastload._C.batches_held), exceeds this (keeping at least the smallest).
MEMORY_CAP = 1 << 30
_REDRAW_S = 0.1

def default_threads() -> list[int]:
    """1, 2, 4, ... up to the CPUs this process may use, and that count itself."""
    cpus = usable_cpus()
    grid = [t for t in (2 ** i for i in range(int(math.log2(cpus)) + 1))]
    return sorted(set(grid) | {cpus})



def _grid_values(name: str, values: Sequence[int] | int | None, default: Sequence[int]) -> list[int]:
    if values is None:
        return list(default)
    if isinstance(values, (int, np.integer)):
        values = [int(values)]
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
            raise ValueError(f"{name} must hold positive integers, got {v!r}")
        out.append(int(v))
    if not out:
        raise ValueError(f"{name} must not be empty")
    return sorted(set(out))


# ---------------------------------------------------------------------------- measuring
def _machine_busy_s() -> float | None:
    """CPU seconds all processes have used since boot (Linux /proc/stat), or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:8]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq = (v + [0] * 7)[:7]
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


Knobs = tuple[int, int, int, Union[str, None]]  # num_threads, prefetch, copy_streams, workers (None: arrays)


def _loader(source: Source, batch_size: int, device: Any, knobs: Knobs, **kw: Any) -> Loader:
    threads, prefetch, copy_streams, workers = knobs
    if workers is None:
        return Loader(source, batch_size, device=device, num_threads=threads, prefetch=prefetch,
                      copy_streams=copy_streams, **kw)
    return Loader(source, batch_size, device=device, num_workers=threads, workers=workers, prefetch=prefetch,
                  copy_streams=copy_streams, **kw)


def _own_cpu_s(loader: Loader) -> float:
    """CPU seconds of this process and of the loader's worker processes (not "others")."""
    total = time.process_time()
    workers = getattr(loader, "_workers", None)
    for pid in workers.pids() if workers is not None else ():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            pass  # not Linux, or the worker is gone
    return total


def measure_one(source: Source, batch_size: int, device: torch.device, knobs: Knobs,
             warmup: float, seconds: float, seed: int, shuffle: bool = True) -> tuple[float, float, float | None]:
    """(samples/s, share of wall time blocked in next(), CPU cores other processes used) of one
    loader, pulled as fast as it hands out batches for `seconds` after `warmup`, across epochs as
    a training loop would. The warm-up starts after the first batch: worker processes start (spawn,
    import, unpickle the dataset) at the first iter(), and that is not what is measured."""
    # One loader over the whole source (rank 0 of 1, also under torchrun), dropping the epoch's
    # short last batch unless it is the only one: every batch holds `rows` samples.
    loader = _loader(source, batch_size, device, knobs, shuffle=shuffle, seed=seed,
                     drop_last=len(source) >= batch_size, rank=0, world_size=1)
    rows = loader.config.max_rows
    on_cuda = device.type == "cuda"
    clock = time.perf_counter
    try:
        it = iter(loader)
        next(it)
        end = clock() + warmup
        while clock() < end:
            try:
                next(it)
            except StopIteration:
                it = iter(loader)
        if on_cuda:
            torch.cuda.synchronize(device)
        # The loader's own count of the time next() was blocked, per epoch (stats() restarts at
        # every iter()), summed over the epochs the measurement spans.
        wait = -loader.stats().wait_s
        samples = 0
        busy0, own0 = _machine_busy_s(), _own_cpu_s(loader)
        start = clock()
        end = start + seconds
        while True:
            try:
                batch = next(it)  # held until the next one arrives, as a training loop holds it
            except StopIteration:
                wait += loader.stats().wait_s
                it = iter(loader)
                continue
            samples += rows
            if clock() >= end:
                break
        del batch
        if on_cuda:
            torch.cuda.synchronize(device)  # copies still queued belong to the measured time
        wall = clock() - start
        busy1, own1 = _machine_busy_s(), _own_cpu_s(loader)
        wait += loader.stats().wait_s
    finally:
        loader.close()
    others = None
    if busy0 is not None and busy1 is not None:
        # /proc/stat counts in 10 ms ticks: clamp the small negative noise of a quiet machine.
        others = max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
    return samples / wall, min(1.0, max(0.0, wait / wall)), others


class _NoStallHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "waited for data" not in record.getMessage()


@contextlib.contextmanager
def _quiet_stall_hints() -> Iterator[None]:
    """Drops the loader's stall hint while tune runs: with nothing to do between batches, a loop
    that waits is what tune measures, not a problem to report."""
    logger, hint_filter = logging.getLogger("fastload"), _NoStallHint()
    logger.addFilter(hint_filter)
    try:
        yield
    finally:
        logger.removeFilter(hint_filter)


class _Progress:
    """A bar redrawn in place on a terminal; one line per round otherwise."""

    def __init__(self, total: int, rounds: int, stream: TextIO | None):
        self.total, self.rounds, self.stream = total, rounds, stream
        tty = stream is not None and bool(getattr(stream, "isatty", lambda: False)())
        self.line = ProgressLine(stream, _REDRAW_S) if tty else None
        self.done = 0
        self.began = time.perf_counter()

    def update(self, round_index: int, knobs: Knobs, gpu: bool) -> None:
        self.done += 1
        if self.stream is None:
            return
        elapsed = time.perf_counter() - self.began
        left = elapsed / self.done * (self.total - self.done)
        per_round = self.total // self.rounds
        if self.line is not None:
            point = TunePoint(knobs[0], knobs[1], knobs[2], 0.0, 0.0, workers=knobs[3])
            self.line.draw(self.done, self.total,
                           f"{self.done}/{self.total}  round {round_index + 1}/{self.rounds}  {point.describe(gpu)}  "
                           f"~{left:.0f} s left", force=self.done == self.total)
            if self.done == self.total:
                self.line.close()
        elif self.done % per_round == 0:
            print(f"tune: round {self.done // per_round}/{self.rounds} done ({per_round} configurations, "
                  f"{elapsed:.1f} s elapsed, ~{left:.0f} s left)", file=self.stream, flush=True)


def worker_values(workers: Sequence[str] | str | None, python: bool) -> list[str | None]:
    """The workers axis: None for arrays (gathered natively, no workers); for a Python dataset
    the kinds asked for, default threads and processes (on the CPU and on a GPU alike)."""
    if not python:
        if workers is not None:
            raise ValueError(f"workers applies to Python datasets (__getitem__); this source is gathered natively by "
                             f"threads, got workers={workers!r}")
        return [None]
    if workers is None:
        return list(WORKER_KINDS)
    values = [workers] if isinstance(workers, str) else list(workers)
    bad = [w for w in values if w not in WORKER_KINDS]
    if bad or not values:
        raise ValueError(f"workers must hold 'threads' and/or 'processes', got {workers!r}")
    return sorted(set(values), key=WORKER_KINDS.index)



def make_grid(*, python: bool, device: torch.device, batch_bytes: int, threads: Sequence[int] | int | None,
              prefetch: Sequence[int] | int | None, copy_streams: Sequence[int] | int | None,
              workers: Sequence[str] | str | None) -> list[Knobs]:
    """The configurations to measure: the values asked for on each axis, else the defaults
    (prefetch values whose loader memory exceeds MEMORY_CAP left out; copy streams only on a GPU)."""
    gpu = device.type == "cuda"
    thread_grid = _grid_values("num_workers" if python else "threads", threads, default_threads())
    if prefetch is None:
        default = DEFAULT_PREFETCH_PYTHON if python else DEFAULT_PREFETCH
        fitting = [p for p in default if _C.batches_held(p) * batch_bytes <= MEMORY_CAP]
        prefetch_grid = fitting or [default[0]]
    else:
        prefetch_grid = _grid_values("prefetch", prefetch, DEFAULT_PREFETCH)
    stream_grid = _grid_values("copy_streams", copy_streams, DEFAULT_COPY_STREAMS if gpu else (1,))
    if not gpu and stream_grid != [1]:
        raise ValueError(f"copy_streams are copy streams per GPU; on {device} only copy_streams=1 applies, got "
                         f"{stream_grid}")
    worker_grid = worker_values(workers, python)
    return [(t, p, s, w) for w in worker_grid for t in thread_grid for p in prefetch_grid for s in stream_grid]


def check_grid(source: Source, batch_size: int, device: torch.device, grid: list[Knobs]) -> None:
    """Every configuration must construct before any time is spent measuring. Worker processes
    differ from threads only by pickling the dataset, the same for every configuration: one
    processes loader checks that (a loader starts no process before its first iter())."""
    checked_processes = False
    for knobs in grid:
        if knobs[3] == "processes":
            if checked_processes:
                continue
            checked_processes = True
        _loader(source, batch_size, device, knobs).close()


def measure_grid(source: Source, batch_size: int, device: torch.device, grid: list[Knobs], *,
                 seconds: float | None, repeats: int, seed: int, shuffle: bool,
                 progress: bool | TextIO | None) -> tuple[list[TunePoint], float]:
    """(one TunePoint per configuration, in grid order; the seconds each was measured per round).
    Each round measures the whole grid in a new random order; a point's figures are the medians
    of its rounds."""
    if seconds is None:
        lo, hi = SECONDS_RANGE
        seconds = max(lo, min(hi, BUDGET_S / (len(grid) * repeats) / 1.2))
    warmup = seconds / 5
    stream: TextIO | None
    if progress is True:
        stream = sys.stderr
    elif progress is False or progress is None:
        stream = None
    else:
        stream = progress
    bar = _Progress(len(grid) * repeats, repeats, stream)
    shuffler = random.Random(seed)
    measured: dict[Knobs, list[tuple[float, float, float | None]]] = {k: [] for k in grid}
    with _quiet_stall_hints():
        for r in range(repeats):
            order = list(grid)
            shuffler.shuffle(order)
            for knobs in order:
                measured[knobs].append(
                    measure_one(source, batch_size, device, knobs, warmup, seconds, seed + r, shuffle))
                bar.update(r, knobs, device.type == "cuda")

    def others(k: Knobs) -> float | None:
        known = [x[2] for x in measured[k] if x[2] is not None]
        return statistics.median(known) if known else None

    rows = [TunePoint(k[0], k[1], k[2], samples_per_s=statistics.median(x[0] for x in measured[k]),
                      wait_share=statistics.median(x[1] for x in measured[k]),
                      rounds=tuple(x[0] for x in measured[k]), other_cores=others(k), workers=k[3]) for k in grid]
    return rows, seconds


def tune(source: SourceLike, batch_size: int, *, threads: Sequence[int] | int | None = None,
         prefetch: Sequence[int] | int | None = None, copy_streams: Sequence[int] | int | None = None,
         workers: Sequence[str] | str | None = None, device: Any = None, seconds: float | None = None,
         repeats: int = DEFAULT_REPEATS, window: int | tuple[int, int] | None = None, dtype: Any = None,
         format: str | None = None, dataset_args: Mapping[str, Any] | Sequence[Any] | None = None,
         shuffle: bool = True, seed: int = 0, progress: bool | TextIO = True,
         streams: Sequence[int] | int | None = None) -> TuneResult:
    """Measures samples/s of ``fl.Loader(source, batch_size, shuffle=shuffle, ...)`` over the grid
    ``threads`` x ``prefetch`` (x ``copy_streams`` on a GPU; x ``workers`` for a Python dataset) and
    recommends a configuration.

    Args:
        source: a ``fl.Dataset`` or ``fl.Windows``; a numpy array (a one-column Dataset, or token
            windows with ``window``); a path or URL, opened as the Loader's users open it: a dataset
            directory (``fl.Dataset.open``), Parquet files (``fl.Parquet``), a folder Hugging Face's
            ``save_to_disk`` wrote (``fl.Arrow``), a ``.npy`` file (memory-mapped), or a raw token
            file with ``window`` (``dtype``, default uint16; ``fl.Windows.from_files``); Arrow data
            (a Hugging Face dataset, a pyarrow Table); a map-style dataset (``__len__`` and ``__getitem__``, a ``torch.utils.data.Dataset``
            included); or ``"module:Class"`` (or ``"module:factory"``), called with ``dataset_args``.
        batch_size: samples per batch, as you will train with.
        threads: num_threads values, num_workers for a Python dataset (default: 1, 2, 4, ... up to
            the usable CPUs, and their count).
        prefetch: prefetch values (default: 2, 4, 8, 16, 32; 2, 8, 32 for a Python dataset;
            without those whose loader memory, (prefetch + 2) batches, would exceed 1 GiB).
        copy_streams: copy streams per GPU (default 1, 2, 4 on a GPU; only 1 on the CPU).
            ``streams`` is its old name, still accepted (with a FutureWarning).
        workers: for a Python dataset, "threads" and/or "processes" (default: both).
        device: where batches go, as for ``fl.Loader`` (default: a GPU if one is usable, else the CPU).
        seconds: measuring time per configuration and round (default: about 40 s spread over the
            grid, 0.25 to 1 s each, after a warm-up of a fifth of that).
        repeats: rounds over the whole grid, each in a new random order; a configuration's figure
            is the median of its rounds, so a burst of noise on a shared machine moves one round.
        window: for token data, the window length, or (length, stride).
        dtype: the tokens' dtype in a raw token file.
        format: what a path holds, where it cannot be told from the path (a URL prefix of
            Parquet files: "parquet"): one of "directory", "parquet", "hf", "npy", "tokens".
        dataset_args: for ``"module:Class"``: a dict of keyword arguments or a list of positional ones.
        shuffle: measure shuffled (random) reads, as in training, or the source's order.
        seed: seeds the sample order and the order of the grid in each round.
        progress: show progress on stderr (or on this stream); False for none.

    Returns a TuneResult: ``result.args`` for ``fl.Loader(source, **result.args)``, the table as
    ``result.rows``, ``print(result)`` for a report, ``result.plot(path)`` for a chart.
    """
    began = time.perf_counter()
    if streams is not None:
        if copy_streams is not None:
            raise ValueError(f"streams is the old name of copy_streams; give copy_streams only, got "
                             f"copy_streams={copy_streams!r} and streams={streams!r}")
        warnings.warn("fl.tune(streams=) is renamed copy_streams=; streams= will be removed", FutureWarning,
                      stacklevel=2)
        copy_streams = streams
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    batch_size = int(batch_size)
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats <= 0:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if seconds is not None and not (isinstance(seconds, (int, float)) and seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    src, name = as_tune_source(source, window, dtype, dataset_args, seed, format)
    # Loader resolves and checks the device (and every knob) the same way it will in training.
    probe = Loader(src, batch_size, device=device, num_threads=1, prefetch=1)
    dev = probe.device
    probe.close()
    defaults = default_config(src, batch_size, dev)  # what fl.Loader(src, batch_size, device=dev) picks
    grid = make_grid(python=isinstance(src, PythonSource), device=dev, batch_bytes=defaults.batch_bytes,
                     threads=threads, prefetch=prefetch, copy_streams=copy_streams, workers=workers)
    check_grid(src, batch_size, dev, grid)
    rows, seconds = measure_grid(src, batch_size, dev, grid, seconds=seconds, repeats=repeats, seed=seed,
                                 shuffle=bool(shuffle), progress=progress)
    fastest, recommended = recommend(rows)
    return TuneResult(args=loader_args(recommended, batch_size, str(dev)), recommended=recommended,
                      fastest=fastest, rows=rows, source=name, batch_size=batch_size,
                      row_bytes=defaults.batch_bytes // defaults.max_rows, device=str(dev), seconds=seconds,
                      repeats=repeats, elapsed_s=time.perf_counter() - began, defaults=defaults_of(defaults))
