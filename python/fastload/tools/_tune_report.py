"""What ``fl.tune`` found, and how it is shown: one measured configuration (TunePoint), the
result (TuneResult: its table, summary, JSON and plot), and the rule that picks the recommended
configuration among the measured ones. Nothing here measures (_tune_measure.py) or parses a
command line (_tune_cli.py)."""
from __future__ import annotations

import os
import statistics
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .._machine import usable_cpus
from .._version import __version__

__all__ = ["TunePoint", "TuneResult", "recommend", "loader_args", "matplotlib_missing", "NEAR_FASTEST", "WORKER_KINDS"]

# A configuration within this share of the fastest counts as just as fast; among those the
# recommendation takes the fewest threads, then the smallest prefetch (then the fewest copy streams).
NEAR_FASTEST = 0.03
# The kinds of workers a Python dataset's grid holds, cheapest first.
WORKER_KINDS = ("threads", "processes")
# Other processes using more CPU than this (cores, on average) while tune measures make its
# figures noisy: the report says so.
_CONTENDED_CORES = 0.3

@dataclass(frozen=True)
class TunePoint:
    """One configuration of the grid: its median samples/s over the rounds, the median share of
    wall time the loop spent blocked in next() (fastload's own count, loader.stats()), the
    samples/s of every round, and the CPU cores other processes used meanwhile (median over the
    rounds; None where the system does not tell). ``workers``: "threads" or "processes" for a
    Python dataset (num_threads is then its num_workers), None for arrays."""

    num_threads: int
    prefetch: int
    copy_streams: int
    samples_per_s: float
    wait_share: float
    rounds: tuple[float, ...] = ()
    other_cores: float | None = None
    workers: str | None = None

    @property
    def knobs(self) -> tuple[int, int, int]:
        return (self.num_threads, self.prefetch, self.copy_streams)

    @property
    def key(self) -> tuple[int, int, int, str | None]:
        """What identifies the configuration in a grid."""
        return (self.num_threads, self.prefetch, self.copy_streams, self.workers)

    @property
    def cost(self) -> tuple[bool, int, int, int]:
        """The order among near-fastest configurations: threads before worker processes (a process
        costs memory and a start-up), then fewer workers, a smaller prefetch, fewer copy streams."""
        return (self.workers == "processes", self.num_threads, self.prefetch, self.copy_streams)

    def describe(self, gpu: bool) -> str:
        streams = f" copy_streams={self.copy_streams}" if gpu else ""
        if self.workers is None:
            return f"num_threads={self.num_threads} prefetch={self.prefetch}{streams}"
        return f"num_workers={self.num_threads} workers={self.workers!r} prefetch={self.prefetch}{streams}"

    @property
    def streams(self) -> int:
        """The old name of copy_streams."""
        warnings.warn("TunePoint.streams is renamed copy_streams", FutureWarning, stacklevel=2)
        return self.copy_streams


@dataclass(frozen=True)
class TuneResult:
    """What ``fl.tune`` measured and recommends.

    ``args`` are keyword arguments for ``fl.Loader(source, **args)``: batch_size, num_threads
    and prefetch (num_workers, workers and prefetch for a Python dataset; and device and copy_streams
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
        head = (["num_workers", "workers"] if python else ["threads"]) + ["prefetch"] + (["copy_streams"] if gpu else []) + \
               ["samples/s", "GB/s", "data wait", "spread"] + (["others"] if others else []) + [""]
        body = []
        for r in self.rows:
            mark = ", ".join(m for m, p in (("fastest", self.fastest), ("recommended", self.recommended))
                             if p.key == r.key)
            spread = f"{100 * (max(r.rounds) - min(r.rounds)) / r.samples_per_s:.0f}%" if len(r.rounds) > 1 else "-"
            body.append([str(r.num_threads)] + ([str(r.workers)] if python else []) + [str(r.prefetch)] +
                        ([str(r.copy_streams)] if gpu else []) +
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
                            and r.copy_streams == self.defaults.get("copy_streams", 1)
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
            lines.append(f"note: other processes used {busy:.1f} CPU cores on average (of {usable_cpus()}) while "
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
        data["cpus"] = usable_cpus()
        data["fastload_version"] = __version__
        return data

    def plot(self, path: str | os.PathLike[str]) -> None:
        """Draws samples/s against num_threads, one line per prefetch (one panel per stream
        count on a GPU, and per kind of workers for a Python dataset), to an image file. Needs
        matplotlib (``pip install matplotlib``)."""
        plt = _pyplot()
        order = {"": 0, **{w: i for i, w in enumerate(WORKER_KINDS)}}  # threads before processes
        panels = sorted({(r.workers or "", r.copy_streams) for r in self.rows}, key=lambda k: (order[k[0]], k[1]))
        top = max(r.samples_per_s for r in self.rows)
        scale, unit = next(((v, u) for v, u in ((1e6, "M "), (1e3, "k ")) if top >= v), (1.0, ""))
        n = len(panels)
        fig, axes = plt.subplots(1, n, figsize=(6.4 * n ** 0.5 + 0.6 * n, 3.8), squeeze=False, sharey=True)
        threads = sorted({r.num_threads for r in self.rows})
        for ax, (kind, s) in zip(axes[0], panels):
            def here(r: TunePoint) -> bool:
                return (r.workers or "") == kind and r.copy_streams == s

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
                title += [f"copy_streams {s}"] if len({t for _, t in panels}) > 1 else []
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


def loader_args(point: TunePoint, batch_size: int, device: str) -> dict[str, Any]:
    """Keyword arguments for fl.Loader(source, **args) that set ``point``: device and copy_streams
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
        args["copy_streams"] = point.copy_streams
    return args


def recommend(rows: Sequence[TunePoint]) -> tuple[TunePoint, TunePoint]:
    """(fastest, recommended): the recommendation is, among the configurations within
    NEAR_FASTEST of the fastest, the cheapest (TunePoint.cost: threads before worker processes,
    then the fewest threads, the smallest prefetch, the fewest copy streams; each costs CPU or memory
    that buys nothing measurable)."""
    fastest = max(rows, key=lambda r: r.samples_per_s)
    near = [r for r in rows if r.samples_per_s >= (1 - NEAR_FASTEST) * fastest.samples_per_s]
    return fastest, min(near, key=lambda r: r.cost)


def defaults_of(config: Any) -> dict[str, int]:
    """What fl.Loader(source, batch_size) picks by itself (its resolved LoaderConfig), for comparison
    with the grid: num_threads, prefetch and copy_streams (those a GPU loader uses; 1 on the CPU)."""
    return {"num_threads": config.num_threads, "prefetch": config.prefetch, "copy_streams": config.copy_streams}

