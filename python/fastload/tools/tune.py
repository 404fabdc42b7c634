"""``fl.tune()`` and ``python -m fastload tune``: measure a source's throughput over a grid of
num_threads x prefetch (x streams on a GPU; x workers, threads or processes, for a Python
dataset) and recommend the cheapest near-fastest setting."""
from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, TextIO, Union

import numpy as np
import torch

from .. import _C
from ._cli import ProgressLine, check_device, int_list, positive_float, positive_int
from ._dataset_spec import is_spec, load_dataset, parse_arguments
from .._config import default_config
from .._loader import Loader
from .._machine import usable_cpus as _usable_cpus
from .._sources.arrays import Dataset, Windows
from .._sources.protocol import Source, as_source
from .._sources.python import PythonSource

# A configuration within this share of the fastest counts as just as fast; among those the
# recommendation takes the fewest threads, then the smallest prefetch (then the fewest streams).
NEAR_FASTEST = 0.03
DEFAULT_PREFETCH = (2, 4, 8, 16, 32)
# A Python dataset adds the workers axis and a worker process start per configuration and round:
# fewer prefetch values keep a run near a minute (prefetch matters less where __getitem__ costs more).
DEFAULT_PREFETCH_PYTHON = (2, 8, 32)
DEFAULT_WORKERS = ("threads", "processes")
DEFAULT_STREAMS = (1, 2, 4)
DEFAULT_REPEATS = 3
# seconds=None spreads about this much measuring time over the grid's points and rounds...
_BUDGET_S = 40.0
# ... giving each point a time within these bounds (and a warm-up before it).
_SECONDS_RANGE = (0.25, 1.0)
# Other processes using more CPU than this (cores, on average) while tune measures make its
# figures noisy: the report says so.
_CONTENDED_CORES = 0.3
# The default prefetch grid leaves out values whose loader memory, (prefetch + 2) batches
# (fastload._C.batches_held), exceeds this (keeping at least the smallest).
_MEMORY_CAP = 1 << 30
_REDRAW_S = 0.1

# A path, an array, a fastload source, "module:Class", or any map-style dataset object.
SourceLike = Union[Dataset, Windows, np.ndarray, str, "os.PathLike[str]", Any]


@dataclass(frozen=True)
class TunePoint:
    """One configuration of the grid: its median samples/s over the rounds, the median share of
    wall time the loop spent blocked in next() (fastload's own count, loader.stats()), the
    samples/s of every round, and the CPU cores other processes used meanwhile (median over the
    rounds; None where the system does not tell). ``workers``: "threads" or "processes" for a
    Python dataset (num_threads is then its num_workers), None for arrays."""

    num_threads: int
    prefetch: int
    streams: int
    samples_per_s: float
    wait_share: float
    rounds: tuple[float, ...] = ()
    other_cores: float | None = None
    workers: str | None = None

    @property
    def knobs(self) -> tuple[int, int, int]:
        return (self.num_threads, self.prefetch, self.streams)

    @property
    def key(self) -> tuple[int, int, int, str | None]:
        """What identifies the configuration in a grid."""
        return (self.num_threads, self.prefetch, self.streams, self.workers)

    @property
    def cost(self) -> tuple[bool, int, int, int]:
        """The order among near-fastest configurations: threads before worker processes (a process
        costs memory and a start-up), then fewer workers, a smaller prefetch, fewer streams."""
        return (self.workers == "processes", self.num_threads, self.prefetch, self.streams)

    def describe(self, gpu: bool) -> str:
        streams = f" copy_streams={self.streams}" if gpu else ""
        if self.workers is None:
            return f"num_threads={self.num_threads} prefetch={self.prefetch}{streams}"
        return f"num_workers={self.num_threads} workers={self.workers!r} prefetch={self.prefetch}{streams}"


@dataclass(frozen=True)
class TuneResult:
    """What ``fl.tune`` measured and recommends.

    ``args`` are keyword arguments for ``fl.Loader(source, **args)``: batch_size, num_threads
    and prefetch (num_workers, workers and prefetch for a Python dataset; and device and streams
    on a GPU). ``recommended`` is the configuration with the fewest threads (threads before worker
    processes), then the smallest prefetch, among those within 3% of ``fastest``. ``rows`` holds
    every configuration measured. ``print(result)`` shows the table.
    """

    args: dict[str, Any]
    recommended: TunePoint
    fastest: TunePoint
    rows: list[TunePoint]
    source: str
    batch_size: int
    row_bytes: int
    device: str
    seconds: float
    repeats: int
    elapsed_s: float
    defaults: dict[str, int] = field(default_factory=dict)

    def loader_call(self, source: str = "source") -> str:
        """The recommendation as code: ``fl.Loader(source, batch_size=..., ...)``."""
        return f"fl.Loader({source}, " + ", ".join(f"{k}={v!r}" for k, v in self.args.items()) + ")"

    def table(self) -> str:
        """One line per configuration, in grid order. spread: (max - min) / median of its rounds;
        others: CPU cores that other processes used while it was measured."""
        gpu = self.device.startswith("cuda")
        python = self.python
        others = any(r.other_cores is not None for r in self.rows)
        head = (["num_workers", "workers"] if python else ["threads"]) + ["prefetch"] + (["streams"] if gpu else []) + \
               ["samples/s", "GB/s", "data wait", "spread"] + (["others"] if others else []) + [""]
        body = []
        for r in self.rows:
            mark = ", ".join(m for m, p in (("fastest", self.fastest), ("recommended", self.recommended))
                             if p.key == r.key)
            spread = f"{100 * (max(r.rounds) - min(r.rounds)) / r.samples_per_s:.0f}%" if len(r.rounds) > 1 else "-"
            body.append([str(r.num_threads)] + ([str(r.workers)] if python else []) + [str(r.prefetch)] +
                        ([str(r.streams)] if gpu else []) +
                        [_si(r.samples_per_s), f"{r.samples_per_s * self.row_bytes / 1e9:.2f}",
                         f"{100 * r.wait_share:.1f}%", spread] +
                        ([f"{r.other_cores:.2f}" if r.other_cores is not None else "-"] if others else []) +
                        [f"<- {mark}" if mark else ""])
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        lines = ["  ".join(c.rjust(w) if i < len(head) - 1 else c for i, (c, w) in enumerate(zip(row, widths)))
                 for row in [head, *body]]
        return "\n".join(line.rstrip() for line in lines)

    @property
    def python(self) -> bool:
        """Whether the source was a Python dataset (the grid has a workers axis)."""
        return any(r.workers is not None for r in self.rows)

    def summary(self) -> str:
        """The recommendation in words, and the arguments that set it."""
        rec, best = self.recommended, self.fastest
        gpu = self.device.startswith("cuda")
        cheaper = "threads instead of processes, fewer workers" if self.python else "fewer threads"

        lines = [f"fastest:     {best.describe(gpu)}: {_si(best.samples_per_s)} samples/s"]
        if rec.key == best.key:
            lines.append(f"recommended: {rec.describe(gpu)} (the fastest; nothing within {100 * NEAR_FASTEST:.0f}% "
                         f"uses {cheaper} or a smaller prefetch)")
        else:
            lines.append(f"recommended: {rec.describe(gpu)}: {_si(rec.samples_per_s)} samples/s "
                         f"({100 * (rec.samples_per_s / best.samples_per_s - 1):+.1f}%, within "
                         f"{100 * NEAR_FASTEST:.0f}% of the fastest with {cheaper} or a smaller prefetch)")
        if self.defaults:
            kind = "threads" if self.python else None
            default = next((r for r in self.rows if r.num_threads == self.defaults.get("num_threads")
                            and r.prefetch == self.defaults.get("prefetch")
                            and r.streams == self.defaults.get("copy_streams", 1)
                            and r.workers == kind), None)
            measured = (f": {_si(default.samples_per_s)} samples/s" if default is not None
                        else " (not in the grid)")
            knob = "num_workers" if self.python else "num_threads"
            kind_text = " workers='threads'" if self.python else ""
            streams = f" copy_streams={self.defaults.get('copy_streams', 1)}" if gpu else ""
            lines.append(f"defaults:    {knob}={self.defaults['num_threads']}{kind_text} "
                         f"prefetch={self.defaults['prefetch']}{streams}{measured}")
        lines.append(f"    {self.loader_call()}")
        busy = self.other_cores
        if busy is not None and busy > _CONTENDED_CORES:
            lines.append(f"note: other processes used {busy:.1f} CPU cores on average (of {_usable_cpus()}) while "
                         f"this ran, so the figures are noisy; rerun on a quieter machine or with more --repeats")
        return "\n".join(lines)

    @property
    def other_cores(self) -> float | None:
        """CPU cores other processes used while tune measured, averaged over its configurations."""
        known = [r.other_cores for r in self.rows if r.other_cores is not None]
        return statistics.mean(known) if known else None

    def __str__(self) -> str:
        return f"{self.table()}\n\n{self.summary()}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["loader_call"] = self.loader_call()
        data["near_fastest"] = NEAR_FASTEST
        data["other_cores"] = self.other_cores
        data["cpus"] = _usable_cpus()
        data["fastload_version"] = _version()
        return data

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draws samples/s against num_threads, one line per prefetch (one panel per stream
        count on a GPU, and per kind of workers for a Python dataset), to an image file. Needs
        matplotlib (``pip install matplotlib``)."""
        plt = _pyplot()
        order = {"": 0, **{w: i for i, w in enumerate(DEFAULT_WORKERS)}}  # threads before processes
        panels = sorted({(r.workers or "", r.streams) for r in self.rows}, key=lambda k: (order[k[0]], k[1]))
        top = max(r.samples_per_s for r in self.rows)
        scale, unit = next(((v, u) for v, u in ((1e6, "M "), (1e3, "k ")) if top >= v), (1.0, ""))
        n = len(panels)
        fig, axes = plt.subplots(1, n, figsize=(6.4 * n ** 0.5 + 0.6 * n, 3.8), squeeze=False, sharey=True)
        threads = sorted({r.num_threads for r in self.rows})
        for ax, (kind, s) in zip(axes[0], panels):
            def here(r: TunePoint) -> bool:
                return (r.workers or "") == kind and r.streams == s

            for p in sorted({r.prefetch for r in self.rows}):
                line = sorted((r for r in self.rows if r.prefetch == p and here(r)), key=lambda r: r.num_threads)
                ax.plot([r.num_threads for r in line], [r.samples_per_s / scale for r in line], marker="o",
                        markersize=4, label=f"prefetch {p}")
            for point, style, label in ((self.fastest, dict(marker="o", markersize=11, fillstyle="none"), "fastest"),
                                        (self.recommended, dict(marker="*", markersize=13), "recommended")):
                if here(point):
                    ax.plot([point.num_threads], [point.samples_per_s / scale], linestyle="none", color="black",
                            label=label, **style)
            ax.set_xticks(threads)
            if len(threads) > 2 and threads[-1] / threads[0] >= 8:
                ax.set_xscale("log", base=2)
                ax.set_xticks(threads, [str(t) for t in threads])
            ax.set_xlabel("num_workers" if kind else "num_threads")
            ax.set_ylim(0, 1.12 * top / scale)
            ax.margins(x=0.08)
            ax.grid(alpha=0.3)
            if n > 1:
                title = [kind] if len({k for k, _ in panels}) > 1 else []
                title += [f"streams {s}"] if len({t for _, t in panels}) > 1 else []
                ax.set_title(", ".join(title), fontsize=9)
        axes[0][0].set_ylabel(f"{unit}samples/s (median of rounds)")
        # One legend for all panels: the fastest and the recommended point may sit in different ones.
        handles: dict[str, Any] = {}
        for ax in axes[0]:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        axes[0][-1].legend(list(handles.values()), list(handles), fontsize=7, loc="lower right")
        fig.suptitle(f"fastload tune: {Path(self.source).name or self.source}, batch {self.batch_size}, "
                     f"{self.device}", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)


# ---------------------------------------------------------------------------- helpers
def _si(value: float) -> str:
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g}"


def _version() -> str:
    from .. import __version__
    return __version__


def matplotlib_missing() -> str | None:
    """None when matplotlib can be imported, else a sentence saying how to get it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "drawing a plot needs matplotlib, which is not installed: pip install matplotlib " \
               "(or the extra: pip install 'fastload[plot]')"
    return None


def _pyplot() -> Any:
    missing = matplotlib_missing()
    if missing:
        raise ImportError(missing)
    import matplotlib
    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt
    return plt


def default_threads() -> list[int]:
    """1, 2, 4, ... up to the CPUs this process may use, and that count itself."""
    cpus = _usable_cpus()
    grid = [t for t in (2 ** i for i in range(int(math.log2(cpus)) + 1))]
    return sorted(set(grid) | {cpus})


def open_source(path: str | os.PathLike[str], window: tuple[int, int] | None = None,
                dtype: Any = None) -> Dataset | Windows:
    """A source from a file or folder: a .npy file (memory-mapped; with ``window``, token windows
    over its 1-D array), a token file of ``dtype`` (uint16 by default) with ``window``, or a dataset
    directory (``fl.Dataset.open``). Raises ValueError saying what is wrong."""
    p = Path(path)
    if p.is_dir():
        if window is not None:
            raise ValueError("--window applies to a token file, not to a dataset directory")
        if dtype is not None:
            raise ValueError("--dtype applies to a raw token file, not to a dataset directory (its manifest "
                             "records every column's dtype)")
        return Dataset.open(p)
    if not p.exists():
        raise ValueError(f"no such file or directory: {str(p)!r}")
    if not p.is_file():
        raise ValueError(f"{str(p)!r} is neither a regular file nor a directory")
    if p.suffix == ".npy":
        array = _load_npy(p)
        if dtype is not None:
            raise ValueError(f"--dtype applies to a raw token file; {p.name} is a .npy file, which carries its dtype "
                             f"({array.dtype})")
        if window is None:
            return Dataset({"x": array})
        if array.ndim != 1:
            raise ValueError(f"--window needs a 1-D array of tokens; {p.name} has shape {array.shape}")
        return Windows(array, length=window[0], stride=window[1])
    if window is None:
        raise ValueError(f"{p.name} is not a .npy file, so it is read as raw tokens, which needs --window "
                         f"LENGTH[:STRIDE] (and --dtype if they are not uint16)")
    token_dtype = np.dtype(dtype if dtype is not None else np.uint16)
    size = p.stat().st_size
    if size < token_dtype.itemsize:
        raise ValueError(f"{p.name} holds no {token_dtype} tokens ({size} bytes)")
    if size % token_dtype.itemsize:
        raise ValueError(f"{p.name} is {size} bytes, not a whole number of {token_dtype} tokens "
                         f"({token_dtype.itemsize} bytes each); is --dtype right?")
    tokens = np.memmap(p, dtype=token_dtype, mode="r")
    return Windows(tokens, length=window[0], stride=window[1])


def _load_npy(p: Path) -> np.ndarray:
    """A .npy file memory-mapped, or ValueError saying why it cannot be a source (np.load raises
    EOFError on an empty file, and accepts dtypes fastload cannot load)."""
    try:
        array = np.load(p, mmap_mode="r", allow_pickle=False)
    except (EOFError, ValueError, OSError, TypeError) as e:
        raise ValueError(f"{p.name} is not a readable .npy array ({type(e).__name__}: {e or 'empty file'})") from None
    if not isinstance(array, np.ndarray):
        raise ValueError(f"{p.name} is not a .npy array")
    if array.dtype.kind not in "iufcb":
        raise ValueError(f"{p.name} holds {array.dtype} values; fastload loads bool and numeric arrays")
    if array.ndim == 0 or array.shape[0] == 0:
        raise ValueError(f"{p.name} has shape {array.shape}: no samples to load")
    return array


def _check_output(option: str, path: Path, suffixes: Sequence[str] | None = None) -> None:
    """Refuses an output path that cannot be written, before any time is spent measuring."""
    import argparse
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{option} {path}: is a directory; give a file name")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{option} {path}: the directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{option} {path}: not writable")
    if suffixes is not None and path.suffix and path.suffix[1:].lower() not in suffixes:
        raise argparse.ArgumentTypeError(f"{option} {path}: matplotlib cannot write {path.suffix} files "
                                         f"(it writes {', '.join('.' + x for x in sorted(suffixes))})")


def _as_source(source: SourceLike, window: int | tuple[int, int] | None, dtype: Any,
               dataset_args: Mapping[str, Any] | Sequence[Any] | None = None, seed: int = 0) -> tuple[Source, str]:
    """The source to measure and its name for the report. Paths, arrays and fastload sources as
    before; "module:Class" (with `dataset_args`) or any map-style dataset object becomes a
    PythonSource, whose first sample is read now: every problem is a ValueError or TypeError here,
    before anything is measured."""
    if isinstance(window, int):
        window = (window, window)
    spec = isinstance(source, str) and not os.path.exists(source) and is_spec(source)
    if dataset_args is not None and not spec:
        raise ValueError(f"dataset_args apply to a 'module:Class' source, not to {source!r}")
    if isinstance(source, np.ndarray):
        if dtype is not None:
            raise ValueError("dtype applies to a token file path; an array carries its dtype")
        if window is None:
            return Dataset({"x": source}), "array"
        return Windows(source, length=window[0], stride=window[1]), "array"
    if spec or not isinstance(source, (str, os.PathLike)):
        if window is not None or dtype is not None:
            what = "a Dataset or Windows" if isinstance(source, Source) else "a Python dataset"
            raise ValueError(f"window and dtype apply to a path or an array, not to {what}")
        if spec:
            if isinstance(dataset_args, Mapping):
                args, kwargs = [], dict(dataset_args)
            else:
                args, kwargs = list(dataset_args or []), {}
            dataset, name = load_dataset(source, args, kwargs), source
        else:
            dataset = source
            name = type(source.dataset if isinstance(source, PythonSource) else source).__name__
        try:  # what the Loader reads, as the Loader makes it (a factory may return fl.Dataset or fl.Windows)
            return as_source(dataset, seed=seed), name
        except (TypeError, ValueError) as e:
            raise type(e)(f"{name}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the dataset's own __getitem__(0)
            raise ValueError(f"{name}: reading sample 0 (to learn the batch's structure) raised "
                             f"{type(e).__name__}: {e}") from None
    return open_source(source, window, dtype), os.fspath(source)


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


Knobs = tuple[int, int, int, Union[str, None]]  # num_threads, prefetch, streams, workers (None: arrays)


def _loader(source: Source, batch_size: int, device: Any, knobs: Knobs, **kw: Any) -> Loader:
    threads, prefetch, streams, workers = knobs
    if workers is None:
        return Loader(source, batch_size, device=device, num_threads=threads, prefetch=prefetch, copy_streams=streams,
                      **kw)
    return Loader(source, batch_size, device=device, num_workers=threads, workers=workers, prefetch=prefetch,
                  copy_streams=streams, **kw)


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


def _measure(source: Source, batch_size: int, device: torch.device, knobs: Knobs,
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


def tune(source: SourceLike, batch_size: int, *, threads: Sequence[int] | int | None = None,
         prefetch: Sequence[int] | int | None = None, streams: Sequence[int] | int | None = None,
         workers: Sequence[str] | str | None = None, device: Any = None, seconds: float | None = None,
         repeats: int = DEFAULT_REPEATS, window: int | tuple[int, int] | None = None, dtype: Any = None,
         dataset_args: Mapping[str, Any] | Sequence[Any] | None = None, shuffle: bool = True, seed: int = 0,
         progress: bool | TextIO = True) -> TuneResult:
    """Measures samples/s of ``fl.Loader(source, batch_size, shuffle=shuffle, ...)`` over the grid
    ``threads`` x ``prefetch`` (x ``streams`` on a GPU; x ``workers`` for a Python dataset) and
    recommends a configuration.

    Args:
        source: a ``fl.Dataset`` or ``fl.Windows``; a numpy array (a one-column Dataset, or token
            windows with ``window``); a path: a ``.npy`` file (memory-mapped), a raw token file
            with ``window`` (``dtype``, default uint16), or a dataset directory (``fl.Dataset.open``);
            a map-style dataset (``__len__`` and ``__getitem__``, a ``torch.utils.data.Dataset``
            included); or ``"module:Class"`` (or ``"module:factory"``), called with ``dataset_args``.
        batch_size: samples per batch, as you will train with.
        threads: num_threads values, num_workers for a Python dataset (default: 1, 2, 4, ... up to
            the usable CPUs, and their count).
        prefetch: prefetch values (default: 2, 4, 8, 16, 32; 2, 8, 32 for a Python dataset;
            without those whose loader memory, (prefetch + 2) batches, would exceed 1 GiB).
        streams: copy streams per GPU (default 1, 2, 4 on a GPU; only 1 on the CPU).
        workers: for a Python dataset, "threads" and/or "processes" (default: both).
        device: where batches go, as for ``fl.Loader`` (default: a GPU if one is usable, else the CPU).
        seconds: measuring time per configuration and round (default: about 40 s spread over the
            grid, 0.25 to 1 s each, after a warm-up of a fifth of that).
        repeats: rounds over the whole grid, each in a new random order; a configuration's figure
            is the median of its rounds, so a burst of noise on a shared machine moves one round.
        window: for token data, the window length, or (length, stride).
        dtype: the tokens' dtype in a raw token file.
        dataset_args: for ``"module:Class"``: a dict of keyword arguments or a list of positional ones.
        shuffle: measure shuffled (random) reads, as in training, or the source's order.
        seed: seeds the sample order and the order of the grid in each round.
        progress: show progress on stderr (or on this stream); False for none.

    Returns a TuneResult: ``result.args`` for ``fl.Loader(source, **result.args)``, the table as
    ``result.rows``, ``print(result)`` for a report, ``result.plot(path)`` for a chart.
    """
    began = time.perf_counter()
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    batch_size = int(batch_size)
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats <= 0:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if seconds is not None and not (isinstance(seconds, (int, float)) and seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    src, name = _as_source(source, window, dtype, dataset_args, seed)
    python = isinstance(src, PythonSource)
    # Loader resolves and checks the device (and every knob) the same way it will in training.
    probe = Loader(src, batch_size, device=device, num_threads=1, prefetch=1)
    dev = probe.device
    probe.close()
    gpu = dev.type == "cuda"
    defaults = default_config(src, batch_size, dev)  # what fl.Loader(src, batch_size, device=dev) picks
    batch_bytes = defaults.batch_bytes
    row_bytes = batch_bytes // defaults.max_rows
    thread_grid = _grid_values("num_workers" if python else "threads", threads, default_threads())
    if prefetch is None:
        default = DEFAULT_PREFETCH_PYTHON if python else DEFAULT_PREFETCH
        fitting = [p for p in default if _C.batches_held(p) * batch_bytes <= _MEMORY_CAP]
        prefetch_grid = fitting or [default[0]]
    else:
        prefetch_grid = _grid_values("prefetch", prefetch, DEFAULT_PREFETCH)
    stream_grid = _grid_values("streams", streams, DEFAULT_STREAMS if gpu else (1,))
    if not gpu and stream_grid != [1]:
        raise ValueError(f"streams are copy streams per GPU; on {dev} only streams=1 applies, got {stream_grid}")
    worker_grid = _worker_values(workers, python)
    grid: list[Knobs] = [(t, p, s, w) for w in worker_grid for t in thread_grid for p in prefetch_grid
                         for s in stream_grid]
    # Every configuration must construct before any time is spent measuring. Worker processes
    # differ from threads only by pickling the dataset, the same for every configuration: one
    # processes loader checks that (a loader starts no process before its first iter()).
    checked_processes = False
    for t, p, s, w in grid:
        if w == "processes":
            if checked_processes:
                continue
            checked_processes = True
        _loader(src, batch_size, dev, (t, p, s, w)).close()
    if seconds is None:
        lo, hi = _SECONDS_RANGE
        seconds = max(lo, min(hi, _BUDGET_S / (len(grid) * repeats) / 1.2))
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
                    _measure(src, batch_size, dev, knobs, warmup, seconds, seed + r, bool(shuffle)))
                bar.update(r, knobs, gpu)

    def others(k: Knobs) -> float | None:
        known = [x[2] for x in measured[k] if x[2] is not None]
        return statistics.median(known) if known else None

    rows = [TunePoint(k[0], k[1], k[2], samples_per_s=statistics.median(x[0] for x in measured[k]),
                      wait_share=statistics.median(x[1] for x in measured[k]),
                      rounds=tuple(x[0] for x in measured[k]), other_cores=others(k), workers=k[3]) for k in grid]
    fastest, recommended = recommend(rows)
    return TuneResult(args=loader_args(recommended, batch_size, str(dev)), recommended=recommended,
                      fastest=fastest, rows=rows, source=name, batch_size=batch_size, row_bytes=row_bytes,
                      device=str(dev), seconds=seconds, repeats=repeats, elapsed_s=time.perf_counter() - began,
                      defaults=_defaults(defaults))


def _worker_values(workers: Sequence[str] | str | None, python: bool) -> list[str | None]:
    """The workers axis: None for arrays (gathered natively, no workers); for a Python dataset
    the kinds asked for, default threads and processes (on the CPU and on a GPU alike)."""
    if not python:
        if workers is not None:
            raise ValueError(f"workers applies to Python datasets (__getitem__); this source is gathered natively by "
                             f"threads, got workers={workers!r}")
        return [None]
    if workers is None:
        return list(DEFAULT_WORKERS)
    values = [workers] if isinstance(workers, str) else list(workers)
    bad = [w for w in values if w not in DEFAULT_WORKERS]
    if bad or not values:
        raise ValueError(f"workers must hold 'threads' and/or 'processes', got {workers!r}")
    return sorted(set(values), key=DEFAULT_WORKERS.index)


def loader_args(point: TunePoint, batch_size: int, device: str) -> dict[str, Any]:
    """Keyword arguments for fl.Loader(source, **args) that set ``point``: device and streams
    only on a GPU (on the CPU the Loader's own device choice is the one measured)."""
    args: dict[str, Any] = {"batch_size": batch_size}
    if point.workers is None:
        args["num_threads"] = point.num_threads
    else:
        args["num_workers"] = point.num_threads
        args["workers"] = point.workers
    args["prefetch"] = point.prefetch
    if device.startswith("cuda"):
        args["device"] = device
        args["copy_streams"] = point.streams
    return args


def recommend(rows: Sequence[TunePoint]) -> tuple[TunePoint, TunePoint]:
    """(fastest, recommended): the recommendation is, among the configurations within
    NEAR_FASTEST of the fastest, the cheapest (TunePoint.cost: threads before worker processes,
    then the fewest threads, the smallest prefetch, the fewest streams; each costs CPU or memory
    that buys nothing measurable)."""
    fastest = max(rows, key=lambda r: r.samples_per_s)
    near = [r for r in rows if r.samples_per_s >= (1 - NEAR_FASTEST) * fastest.samples_per_s]
    return fastest, min(near, key=lambda r: r.cost)


def _defaults(config: Any) -> dict[str, int]:
    """What fl.Loader(source, batch_size) picks by itself (its resolved LoaderConfig), for comparison
    with the grid: num_threads, prefetch and copy_streams (those a GPU loader uses; 1 on the CPU)."""
    return {"num_threads": config.num_threads, "prefetch": config.prefetch, "copy_streams": config.copy_streams}


# ---------------------------------------------------------------------------- command line
def _window(text: str) -> tuple[int, int]:
    import argparse
    try:
        parts = [int(x) for x in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts) <= 0:
        raise argparse.ArgumentTypeError(f"expected LENGTH or LENGTH:STRIDE (positive integers), got {text!r}")
    return (parts[0], parts[-1])


def _dtype(text: str) -> np.dtype:
    import argparse
    try:
        dt = np.dtype(text)
    except TypeError:
        raise argparse.ArgumentTypeError(f"not a numpy dtype: {text!r}") from None
    if dt.kind not in "iu":
        raise argparse.ArgumentTypeError(f"tokens must be an integer dtype (uint16, int32, ...), got {text!r}")
    return dt


def _json_arguments(text: str) -> list[Any] | dict[str, Any]:
    import argparse
    try:
        args, kwargs = parse_arguments(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return kwargs if kwargs or not args else args


def _workers(text: str) -> list[str | None]:
    import argparse
    try:  # fl.tune's own check, in the command line's words
        return _worker_values([x.strip() for x in text.split(",") if x.strip()], python=True)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected threads, processes or threads,processes, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m fastload tune",
        description="Measure fastload's throughput on your own data over a grid of num_threads x prefetch "
                    "(x streams on a GPU; x workers, threads or processes, for a Python dataset) and print the "
                    "fastest configuration, the recommended one (within 3% of the fastest with the fewest "
                    "threads, then the smallest prefetch) and its fl.Loader(...) arguments. Batches are pulled as "
                    "fast as the loader hands them out (shuffle=True), so this is the loader's ceiling on your "
                    "data, not your training step's.",
        epilog="Exit status: 0 when done; 130 after Ctrl-C; 2 on bad arguments.")
    parser.add_argument("source", metavar="SOURCE",
                        help="a .npy file (memory-mapped), a raw token file such as train.bin (needs --window), "
                             "a dataset directory (read with fl.Dataset.open), or a map-style dataset as "
                             "module:Class or module:factory (imported from the current directory or PYTHONPATH; "
                             "constructor arguments with --dataset-args)")
    parser.add_argument("--batch-size", type=positive_int, required=True, metavar="B",
                        help="samples per batch, as you train with")
    parser.add_argument("--window", type=_window, default=None, metavar="L[:STRIDE]",
                        help="token windows of L tokens every STRIDE (default STRIDE=L) tokens: for a token file, "
                             "or a .npy of 1-D tokens")
    parser.add_argument("--dtype", type=_dtype, default=None,
                        help="the tokens' dtype in a raw token file (default: uint16)")
    parser.add_argument("--dataset-args", type=_json_arguments, default=None, metavar="JSON",
                        help="for module:Class: constructor arguments as a JSON object of keyword arguments "
                             """('{"n": 1000}') or a JSON list of positional ones""")
    parser.add_argument("--threads", "--num-workers", dest="threads", type=int_list, default=None, metavar="T,T,...",
                        help="num_threads values (num_workers for a Python dataset; default: 1,2,4,... up to the "
                             f"usable CPUs, and their count: {','.join(map(str, default_threads()))} here)")
    parser.add_argument("--workers", type=_workers, default=None, metavar="KIND[,KIND]",
                        help="for a Python dataset: threads and/or processes (default: both)")
    parser.add_argument("--prefetch", type=int_list, default=None, metavar="P,P,...",
                        help="prefetch values (default: " + ",".join(map(str, DEFAULT_PREFETCH)) + "; " +
                             ",".join(map(str, DEFAULT_PREFETCH_PYTHON)) + " for a Python dataset; without those "
                             "whose loader memory, (prefetch + 2) batches, exceeds 1 GiB)")
    parser.add_argument("--streams", type=int_list, default=None, metavar="S,S,...",
                        help="copy streams per GPU (GPU only; default: " + ",".join(map(str, DEFAULT_STREAMS)) + ")")
    parser.add_argument("--device", default=None, metavar="DEV",
                        help="'cpu', 'cuda' or 'cuda:N' (default: a GPU if one is usable, else cpu)")
    parser.add_argument("--seconds", type=positive_float, default=None, metavar="S",
                        help="measuring time per configuration and round (default: about 40 s spread over "
                             "the grid, 0.25 to 1 s each)")
    parser.add_argument("--repeats", type=positive_int, default=DEFAULT_REPEATS, metavar="R",
                        help="rounds over the whole grid, each in a new random order; the median counts "
                             "(default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                        help="draw samples/s against threads, one line per prefetch (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="no progress output on stderr")
    args = parser.parse_args(argv)

    if args.plot is not None:
        missing = matplotlib_missing()
        if missing:
            parser.error(f"--plot: {missing}")
    # Every output is checked before measuring: a result must never be lost at the end of a run.
    try:
        if args.json is not None:
            _check_output("--json", args.json)
        if args.plot is not None:
            from matplotlib.figure import Figure
            _check_output("--plot", args.plot, list(Figure().canvas.get_supported_filetypes()))
            if args.json is not None and args.json.resolve() == args.plot.resolve():
                parser.error(f"--json and --plot name the same file: {args.json}")
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    check_device(parser, args.device)
    gpu = (torch.device(args.device).type == "cuda") if args.device else torch.cuda.is_available()
    if args.streams is not None and not gpu and args.streams != [1]:
        parser.error(f"--streams: copy streams apply to a GPU device; this run is on the CPU "
                     f"(got --streams {','.join(map(str, args.streams))})")
    spec = not os.path.exists(args.source) and is_spec(args.source)
    if args.dataset_args is not None and not spec:
        parser.error(f"--dataset-args: constructor arguments apply to a module:Class SOURCE, not to {args.source}")
    if args.workers is not None and not spec:
        parser.error(f"--workers applies to a Python dataset (module:Class SOURCE); {args.source} is gathered "
                     "natively by threads")
    try:  # a dataset class is imported, built and its first sample read here: before any measuring
        source, _ = _as_source(args.source, args.window, args.dtype, args.dataset_args)
    except (ValueError, TypeError, OSError) as e:
        parser.error(f"SOURCE {args.source}: {e}")

    try:
        result = tune(source, args.batch_size, threads=args.threads, prefetch=args.prefetch, streams=args.streams,
                      workers=args.workers, device=args.device, seconds=args.seconds, repeats=args.repeats,
                      progress=not args.no_progress)
    except (ValueError, TypeError, MemoryError) as e:  # e.g. a batch or prefetch the loader refuses here
        parser.error(str(e))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    result = _named(result, args.source)
    n = len(result.rows)
    print(f"fastload tune: {args.source}, {len(source):,} samples of {result.row_bytes:,} B, "
          f"batch {args.batch_size}, {result.device}; {n} configurations x {args.repeats} rounds of "
          f"{result.seconds:.2f} s in {result.elapsed_s:.0f} s (samples/s: median of rounds)")
    print()
    print(result.table())
    print()
    print(result.summary())
    if args.json is not None:
        args.json.write_text(json.dumps(result.to_json(), indent=2) + "\n")
        print(f"wrote {args.json}")
    if args.plot is not None:
        result.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0


def _named(result: TuneResult, source: str) -> TuneResult:
    from dataclasses import replace
    return replace(result, source=source)

