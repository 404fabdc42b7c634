"""``fl.tune()`` and ``python -m fastload tune``: measure a source's throughput over a grid of
num_threads x prefetch (x copy_streams on a GPU; x workers, threads or processes, for a Python
dataset) and recommend the cheapest near-fastest setting.

The public names, in one place (``fastload.tools.tune``); the work is split by job:
_tune_source.py (what is measured, opened by the library's own constructors), _tune_measure.py
(tune() itself, the grid and the measuring), _tune_report.py (the result: table, summary, JSON,
plot), _tune_cli.py (the command line)."""
from __future__ import annotations

from ._tune_cli import main
from ._tune_measure import (DEFAULT_COPY_STREAMS, DEFAULT_PREFETCH, DEFAULT_PREFETCH_PYTHON, DEFAULT_REPEATS,
                            default_threads, measure_one, worker_values, tune)
from ._tune_report import NEAR_FASTEST, TunePoint, TuneResult, defaults_of, loader_args, matplotlib_missing, recommend
from ._tune_source import open_source

__all__ = ["tune", "TuneResult", "TunePoint", "main", "open_source", "recommend", "loader_args", "default_threads",
           "matplotlib_missing", "NEAR_FASTEST", "DEFAULT_PREFETCH", "DEFAULT_PREFETCH_PYTHON", "DEFAULT_COPY_STREAMS",
           "DEFAULT_REPEATS", "defaults_of", "measure_one", "worker_values"]
