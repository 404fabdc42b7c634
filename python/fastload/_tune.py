"""``fl.tune()`` and ``python -m fastload tune``: measure a source's throughput over a grid of
num_threads x prefetch (x streams on a GPU) and recommend the cheapest near-fastest setting."""
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
from typing import Any, Iterator, Sequence, TextIO, Union

import numpy as np
import torch

from ._cli import ProgressLine, check_device, int_list, positive_float, positive_int
from ._source import Source, batch_bytes_of
from ._dataset import Dataset, Windows
from ._loader import Loader

# A configuration within this share of the fastest counts as just as fast; among those the
# recommendation takes the fewest threads, then the smallest prefetch (then the fewest streams).
NEAR_FASTEST = 0.03
DEFAULT_PREFETCH = (2, 4, 8, 16, 32)
DEFAULT_STREAMS = (1, 2, 4)
DEFAULT_REPEATS = 3
# seconds=None spreads about this much measuring time over the grid's points and rounds...
_BUDGET_S = 40.0
# ... giving each point a time within these bounds (and a warm-up before it).
_SECONDS_RANGE = (0.25, 1.0)
# Other processes using more CPU than this (cores, on average) while tune measures make its
# figures noisy: the report says so.
_CONTENDED_CORES = 0.3
# The default prefetch grid leaves out values whose loader memory, (prefetch + 2) batches,
# exceeds this (keeping at least the smallest).
_MEMORY_CAP = 1 << 30
_REDRAW_S = 0.1

SourceLike = Union[Dataset, Windows, np.ndarray, str, "os.PathLike[str]"]


@dataclass(frozen=True)
class TunePoint:
    """One configuration of the grid: its median samples/s over the rounds, the median share of
    wall time the loop spent blocked in next() (fastload's own count, loader.stats()), the
    samples/s of every round, and the CPU cores other processes used meanwhile (median over the
    rounds; None where the system does not tell)."""

    num_threads: int
    prefetch: int
    streams: int
    samples_per_s: float
    wait_share: float
    rounds: tuple[float, ...] = ()
    other_cores: float | None = None

    @property
    def knobs(self) -> tuple[int, int, int]:
        return (self.num_threads, self.prefetch, self.streams)


@dataclass(frozen=True)
class TuneResult:
    """What ``fl.tune`` measured and recommends.

    ``args`` are keyword arguments for ``fl.Loader(source, **args)``: batch_size, num_threads
    and prefetch (and device and streams on a GPU). ``recommended`` is the configuration with the
    fewest threads, then the smallest prefetch, among those within 3% of ``fastest``. ``rows``
    holds every configuration measured. ``print(result)`` shows the table.
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
        others = any(r.other_cores is not None for r in self.rows)
        head = ["threads", "prefetch"] + (["streams"] if gpu else []) + \
               ["samples/s", "GB/s", "data wait", "spread"] + (["others"] if others else []) + [""]
        body = []
        for r in self.rows:
            mark = ", ".join(m for m, p in (("fastest", self.fastest), ("recommended", self.recommended))
                             if p.knobs == r.knobs)
            spread = f"{100 * (max(r.rounds) - min(r.rounds)) / r.samples_per_s:.0f}%" if len(r.rounds) > 1 else "-"
            body.append([str(r.num_threads), str(r.prefetch)] + ([str(r.streams)] if gpu else []) +
                        [_si(r.samples_per_s), f"{r.samples_per_s * self.row_bytes / 1e9:.2f}",
                         f"{100 * r.wait_share:.1f}%", spread] +
                        ([f"{r.other_cores:.2f}" if r.other_cores is not None else "-"] if others else []) +
                        [f"<- {mark}" if mark else ""])
        widths = [max(len(x) for x in col) for col in zip(head, *body)]
        lines = ["  ".join(c.rjust(w) if i < len(head) - 1 else c for i, (c, w) in enumerate(zip(row, widths)))
                 for row in [head, *body]]
        return "\n".join(line.rstrip() for line in lines)

    def summary(self) -> str:
        """The recommendation in words, and the arguments that set it."""
        rec, best = self.recommended, self.fastest

        def name(p: TunePoint) -> str:
            streams = f" streams={p.streams}" if self.device.startswith("cuda") else ""
            return f"num_threads={p.num_threads} prefetch={p.prefetch}{streams}"

        lines = [f"fastest:     {name(best)}: {_si(best.samples_per_s)} samples/s"]
        if rec.knobs == best.knobs:
            lines.append(f"recommended: {name(rec)} (the fastest; nothing within {100 * NEAR_FASTEST:.0f}% "
                         f"uses fewer threads or a smaller prefetch)")
        else:
            lines.append(f"recommended: {name(rec)}: {_si(rec.samples_per_s)} samples/s "
                         f"({100 * (rec.samples_per_s / best.samples_per_s - 1):+.1f}%, within "
                         f"{100 * NEAR_FASTEST:.0f}% of the fastest with fewer threads or a smaller prefetch)")
        if self.defaults:
            default = next((r for r in self.rows if r.num_threads == self.defaults.get("num_threads")
                            and r.prefetch == self.defaults.get("prefetch") and r.streams == 1), None)
            measured = (f": {_si(default.samples_per_s)} samples/s" if default is not None
                        else " (not in the grid)")
            lines.append(f"defaults:    num_threads={self.defaults['num_threads']} "
                         f"prefetch={self.defaults['prefetch']}{measured}")
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
        count on a GPU), to an image file. Needs matplotlib (``pip install matplotlib``)."""
        plt = _pyplot()
        streams = sorted({r.streams for r in self.rows})
        fig, axes = plt.subplots(1, len(streams), figsize=(6.4 * len(streams) ** 0.5 + 0.6 * len(streams), 3.8),
                                 squeeze=False, sharey=True)
        threads = sorted({r.num_threads for r in self.rows})
        for ax, s in zip(axes[0], streams):
            for p in sorted({r.prefetch for r in self.rows}):
                line = sorted((r for r in self.rows if r.prefetch == p and r.streams == s),
                              key=lambda r: r.num_threads)
                ax.plot([r.num_threads for r in line], [r.samples_per_s / 1e6 for r in line], marker="o",
                        markersize=4, label=f"prefetch {p}")
            for point, style, label in ((self.fastest, dict(marker="o", markersize=11, fillstyle="none"), "fastest"),
                                        (self.recommended, dict(marker="*", markersize=13), "recommended")):
                if point.streams == s:
                    ax.plot([point.num_threads], [point.samples_per_s / 1e6], linestyle="none", color="black",
                            label=label, **style)
            ax.set_xticks(threads)
            if len(threads) > 2 and threads[-1] / threads[0] >= 8:
                ax.set_xscale("log", base=2)
                ax.set_xticks(threads, [str(t) for t in threads])
            ax.set_xlabel("num_threads")
            ax.set_ylim(0, 1.12 * max(r.samples_per_s for r in self.rows) / 1e6)
            ax.margins(x=0.08)
            ax.grid(alpha=0.3)
            if len(streams) > 1:
                ax.set_title(f"streams {s}", fontsize=9)
        axes[0][0].set_ylabel("M samples/s (median of rounds)")
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


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _version() -> str:
    from . import __version__
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


def _as_source(source: SourceLike, window: int | tuple[int, int] | None, dtype: Any) -> tuple[Dataset | Windows, str]:
    if isinstance(window, int):
        window = (window, window)
    if isinstance(source, Source):
        if window is not None or dtype is not None:
            raise ValueError("window and dtype apply to a path or an array, not to a Dataset or Windows")
        return source, type(source).__name__
    if isinstance(source, np.ndarray):
        if dtype is not None:
            raise ValueError("dtype applies to a token file path; an array carries its dtype")
        if window is None:
            return Dataset({"x": source}), "array"
        return Windows(source, length=window[0], stride=window[1]), "array"
    if isinstance(source, (str, os.PathLike)):
        return open_source(source, window, dtype), os.fspath(source)
    raise TypeError(f"source must be a path, a numpy array, a fastload.Dataset or a fastload.Windows, "
                    f"got {type(source).__name__}")


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


def _measure(source: Dataset | Windows, batch_size: int, device: torch.device, knobs: tuple[int, int, int],
             warmup: float, seconds: float, seed: int, shuffle: bool = True) -> tuple[float, float, float | None]:
    """(samples/s, share of wall time blocked in next(), CPU cores other processes used) of one
    loader, pulled as fast as it hands out batches for `seconds` after `warmup`, across epochs as
    a training loop would."""
    threads, prefetch, streams = knobs
    loader = Loader(source, batch_size, shuffle=shuffle, seed=seed, drop_last=len(source) >= batch_size,
                    device=device, num_threads=threads, prefetch=prefetch, streams=streams)
    on_cuda = device.type == "cuda"
    clock = time.perf_counter
    try:
        it = iter(loader)
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
        busy0, own0 = _machine_busy_s(), time.process_time()
        start = clock()
        end = start + seconds
        while True:
            try:
                batch = next(it)
            except StopIteration:
                wait += loader.stats().wait_s
                it = iter(loader)
                continue
            samples += next(iter(batch.values())).shape[0]
            if clock() >= end:
                break
        del batch
        if on_cuda:
            torch.cuda.synchronize(device)  # copies still queued belong to the measured time
        wall = clock() - start
        busy1, own1 = _machine_busy_s(), time.process_time()
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

    def update(self, round_index: int, knobs: tuple[int, int, int], gpu: bool) -> None:
        self.done += 1
        if self.stream is None:
            return
        elapsed = time.perf_counter() - self.began
        left = elapsed / self.done * (self.total - self.done)
        per_round = self.total // self.rounds
        if self.line is not None:
            streams = f" streams={knobs[2]}" if gpu else ""
            self.line.draw(self.done, self.total,
                           f"{self.done}/{self.total}  round {round_index + 1}/{self.rounds}  threads={knobs[0]} "
                           f"prefetch={knobs[1]}{streams}  ~{left:.0f} s left", force=self.done == self.total)
            if self.done == self.total:
                self.line.close()
        elif self.done % per_round == 0:
            print(f"tune: round {self.done // per_round}/{self.rounds} done ({per_round} configurations, "
                  f"{elapsed:.1f} s elapsed, ~{left:.0f} s left)", file=self.stream, flush=True)


def tune(source: SourceLike, batch_size: int, *, threads: Sequence[int] | int | None = None,
         prefetch: Sequence[int] | int | None = None, streams: Sequence[int] | int | None = None,
         device: Any = None, seconds: float | None = None, repeats: int = DEFAULT_REPEATS,
         window: int | tuple[int, int] | None = None, dtype: Any = None, shuffle: bool = True, seed: int = 0,
         progress: bool | TextIO = True) -> TuneResult:
    """Measures samples/s of ``fl.Loader(source, batch_size, shuffle=shuffle, ...)`` over the grid
    ``threads`` x ``prefetch`` (x ``streams`` on a GPU) and recommends a configuration.

    Args:
        source: a ``fl.Dataset`` or ``fl.Windows``; a numpy array (a one-column Dataset, or token
            windows with ``window``); or a path: a ``.npy`` file (memory-mapped), a raw token file
            with ``window`` (``dtype``, default uint16), or a dataset directory (``fl.Dataset.open``).
        batch_size: samples per batch, as you will train with.
        threads: num_threads values (default: 1, 2, 4, ... up to the usable CPUs, and their count).
        prefetch: prefetch values (default: 2, 4, 8, 16, 32, without those whose loader memory,
            (prefetch + 2) batches, would exceed 1 GiB).
        streams: copy streams per GPU (default 1, 2, 4 on a GPU; only 1 on the CPU).
        device: where batches go, as for ``fl.Loader`` (default: a GPU if one is usable, else the CPU).
        seconds: measuring time per configuration and round (default: about 40 s spread over the
            grid, 0.25 to 1 s each, after a warm-up of a fifth of that).
        repeats: rounds over the whole grid, each in a new random order; a configuration's figure
            is the median of its rounds, so a burst of noise on a shared machine moves one round.
        window: for token data, the window length, or (length, stride).
        dtype: the tokens' dtype in a raw token file.
        shuffle: measure shuffled (random) reads, as in training, or the source's order.
        seed: seeds the sample order and the order of the grid in each round.
        progress: show progress on stderr (or on this stream); False for none.

    Returns a TuneResult: ``result.args`` for ``fl.Loader(source, **result.args)``, the table as
    ``result.rows``, ``print(result)`` for a report, ``result.plot(path)`` for a chart.
    """
    began = time.perf_counter()
    src, name = _as_source(source, window, dtype)
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    batch_size = int(batch_size)
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats <= 0:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if seconds is not None and not (isinstance(seconds, (int, float)) and seconds > 0 and math.isfinite(seconds)):
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    # Loader resolves and checks the device (and every knob) the same way it will in training.
    probe = Loader(src, batch_size, device=device, num_threads=1, prefetch=1)
    dev = probe.device
    probe.close()
    gpu = dev.type == "cuda"
    batch_bytes = batch_bytes_of(src, batch_size)
    row_bytes = batch_bytes // max(1, min(batch_size, len(src)))
    thread_grid = _grid_values("threads", threads, default_threads())
    if prefetch is None:
        fitting = [p for p in DEFAULT_PREFETCH if (p + 2) * batch_bytes <= _MEMORY_CAP]
        prefetch_grid = fitting or [DEFAULT_PREFETCH[0]]
    else:
        prefetch_grid = _grid_values("prefetch", prefetch, DEFAULT_PREFETCH)
    stream_grid = _grid_values("streams", streams, DEFAULT_STREAMS if gpu else (1,))
    if not gpu and stream_grid != [1]:
        raise ValueError(f"streams are copy streams per GPU; on {dev} only streams=1 applies, got {stream_grid}")
    grid = [(t, p, s) for t in thread_grid for p in prefetch_grid for s in stream_grid]
    for knobs in grid:  # every configuration must construct before any time is spent measuring
        Loader(src, batch_size, device=dev, num_threads=knobs[0], prefetch=knobs[1], streams=knobs[2]).close()
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
    measured: dict[tuple[int, int, int], list[tuple[float, float, float | None]]] = {k: [] for k in grid}
    with _quiet_stall_hints():
        for r in range(repeats):
            order = list(grid)
            shuffler.shuffle(order)
            for knobs in order:
                measured[knobs].append(
                    _measure(src, batch_size, dev, knobs, warmup, seconds, seed + r, bool(shuffle)))
                bar.update(r, knobs, gpu)

    def others(k: tuple[int, int, int]) -> float | None:
        known = [x[2] for x in measured[k] if x[2] is not None]
        return statistics.median(known) if known else None

    rows = [TunePoint(*k, samples_per_s=statistics.median(x[0] for x in measured[k]),
                      wait_share=statistics.median(x[1] for x in measured[k]),
                      rounds=tuple(x[0] for x in measured[k]), other_cores=others(k)) for k in grid]
    fastest, recommended = recommend(rows)
    return TuneResult(args=loader_args(recommended, batch_size, str(dev)), recommended=recommended, fastest=fastest, rows=rows, source=name,
                      batch_size=batch_size, row_bytes=row_bytes, device=str(dev), seconds=seconds,
                      repeats=repeats, elapsed_s=time.perf_counter() - began, defaults=_defaults(src, batch_size))


def loader_args(point: TunePoint, batch_size: int, device: str) -> dict[str, Any]:
    """Keyword arguments for fl.Loader(source, **args) that set ``point``: device and streams
    only on a GPU (on the CPU the Loader's own device choice is the one measured)."""
    args: dict[str, Any] = {"batch_size": batch_size, "num_threads": point.num_threads, "prefetch": point.prefetch}
    if device.startswith("cuda"):
        args["device"] = device
        args["streams"] = point.streams
    return args


def recommend(rows: Sequence[TunePoint]) -> tuple[TunePoint, TunePoint]:
    """(fastest, recommended): the recommendation is, among the configurations within
    NEAR_FASTEST of the fastest, the one with the fewest threads, then the smallest prefetch, then
    the fewest streams (each costs CPU or memory that buys nothing measurable)."""
    fastest = max(rows, key=lambda r: r.samples_per_s)
    near = [r for r in rows if r.samples_per_s >= (1 - NEAR_FASTEST) * fastest.samples_per_s]
    return fastest, min(near, key=lambda r: r.knobs)


def _defaults(src: Dataset | Windows, batch_size: int) -> dict[str, int]:
    """What fl.Loader(source, batch_size) picks by itself, for comparison with the grid."""
    from ._environment import default_num_threads
    from ._loader import default_prefetch
    threads = default_num_threads()
    return {"num_threads": threads, "prefetch": default_prefetch(batch_bytes_of(src, batch_size), threads)}


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


def main(argv: Sequence[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(
        prog="python -m fastload tune",
        description="Measure fastload's throughput on your own data over a grid of num_threads x prefetch "
                    "(x streams on a GPU) and print the fastest configuration, the recommended one (within 3% "
                    "of the fastest with the fewest threads, then the smallest prefetch) and its fl.Loader(...) "
                    "arguments. Batches are pulled as fast as the loader hands them out (shuffle=True), so this "
                    "is the loader's ceiling on your data, not your training step's.",
        epilog="Exit status: 0 when done; 130 after Ctrl-C; 2 on bad arguments.")
    parser.add_argument("source", metavar="SOURCE",
                        help="a .npy file (memory-mapped), a raw token file such as train.bin (needs --window), "
                             "or a dataset directory (read with fl.Dataset.open)")
    parser.add_argument("--batch-size", type=positive_int, required=True, metavar="B",
                        help="samples per batch, as you train with")
    parser.add_argument("--window", type=_window, default=None, metavar="L[:STRIDE]",
                        help="token windows of L tokens every STRIDE (default STRIDE=L) tokens: for a token file, "
                             "or a .npy of 1-D tokens")
    parser.add_argument("--dtype", type=_dtype, default=None,
                        help="the tokens' dtype in a raw token file (default: uint16)")
    parser.add_argument("--threads", type=int_list, default=None, metavar="T,T,...",
                        help="num_threads values (default: 1,2,4,... up to the usable CPUs, and their count: "
                             f"{','.join(map(str, default_threads()))} here)")
    parser.add_argument("--prefetch", type=int_list, default=None, metavar="P,P,...",
                        help="prefetch values (default: " + ",".join(map(str, DEFAULT_PREFETCH)) +
                             ", without those whose loader memory, (prefetch + 2) batches, exceeds 1 GiB)")
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
    try:
        source = open_source(args.source, args.window, args.dtype)
    except (ValueError, TypeError, OSError) as e:
        parser.error(f"SOURCE {args.source}: {e}")

    try:
        result = tune(source, args.batch_size, threads=args.threads, prefetch=args.prefetch, streams=args.streams,
                      device=args.device, seconds=args.seconds, repeats=args.repeats,
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

