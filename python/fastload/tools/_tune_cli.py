"""``python -m fastload tune``: its arguments, the checks made before anything is measured (every
output writable, the source opened), and the report it prints. The measuring is fl.tune's
(_tune_measure.py)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from .._machine import torch_sees_gpu
from ._cli import check_device, int_list, positive_float, positive_int
from ._dataset_spec import is_spec, parse_arguments
from ._tune_measure import DEFAULT_COPY_STREAMS, DEFAULT_PREFETCH, DEFAULT_PREFETCH_PYTHON, DEFAULT_REPEATS, \
    worker_values, default_threads, tune
from ._tune_report import TuneResult, matplotlib_missing
from ._tune_source import FORMATS, as_tune_source

__all__ = ["main"]


def _check_output(option: str, path: Path, suffixes: Sequence[str] | None = None) -> None:
    """Refuses an output path that cannot be written, before any time is spent measuring."""
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


def _window(text: str) -> tuple[int, int]:
    try:
        parts = [int(x) for x in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (1, 2) or min(parts) <= 0:
        raise argparse.ArgumentTypeError(f"expected LENGTH or LENGTH:STRIDE (positive integers), got {text!r}")
    return (parts[0], parts[-1])


def _dtype(text: str) -> np.dtype:
    try:
        dt = np.dtype(text)
    except TypeError:
        raise argparse.ArgumentTypeError(f"not a numpy dtype: {text!r}") from None
    if dt.kind not in "iu":
        raise argparse.ArgumentTypeError(f"tokens must be an integer dtype (uint16, int32, ...), got {text!r}")
    return dt


def _json_arguments(text: str) -> list[Any] | dict[str, Any]:
    try:
        args, kwargs = parse_arguments(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return kwargs if kwargs or not args else args


def _workers(text: str) -> list[str | None]:
    try:  # fl.tune's own check, in the command line's words
        return worker_values([x.strip() for x in text.split(",") if x.strip()], python=True)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected threads, processes or threads,processes, got {text!r}") from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastload tune",
        description="Measure fastload's throughput on your own data over a grid of num_threads x prefetch "
                    "(x copy_streams on a GPU; x workers, threads or processes, for a Python dataset) and print the "
                    "fastest configuration, the recommended one (within 3% of the fastest with the fewest "
                    "threads, then the smallest prefetch) and its fl.Loader(...) arguments. Batches are pulled as "
                    "fast as the loader hands them out (shuffle=True), so this is the loader's ceiling on your "
                    "data, not your training step's.",
        epilog="Exit status: 0 when done; 130 after Ctrl-C; 2 on bad arguments.")
    parser.add_argument("source", metavar="SOURCE",
                        help="a dataset directory (fl.Dataset.open), Parquet files (a .parquet file or a folder of "
                             "them: fl.Parquet), a folder Hugging Face's save_to_disk wrote (fl.Arrow), a .npy file "
                             "(memory-mapped), a raw token file such as train.bin (needs --window), a URL of any of "
                             "these (s3://, gs://, https://), or a map-style dataset as module:Class or "
                             "module:factory (imported from the current directory or PYTHONPATH; constructor "
                             "arguments with --dataset-args)")
    parser.add_argument("--batch-size", type=positive_int, required=True, metavar="B",
                        help="samples per batch, as you train with")
    parser.add_argument("--window", type=_window, default=None, metavar="L[:STRIDE]",
                        help="token windows of L tokens every STRIDE (default STRIDE=L) tokens: for a token file, "
                             "or a .npy of 1-D tokens")
    parser.add_argument("--dtype", type=_dtype, default=None,
                        help="the tokens' dtype in a raw token file (default: uint16)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="what SOURCE holds, where its name does not tell (a URL prefix of Parquet files: "
                             "parquet); default: found from the path")
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
    parser.add_argument("--copy-streams", "--streams", dest="copy_streams", type=int_list, default=None,
                        metavar="S,S,...", help="copy streams per GPU (GPU only; default: " +
                        ",".join(map(str, DEFAULT_COPY_STREAMS)) + "; --streams is its old name)")
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
    gpu = (torch.device(args.device).type == "cuda") if args.device else torch_sees_gpu()
    if args.copy_streams is not None and not gpu and args.copy_streams != [1]:
        parser.error(f"--copy-streams: copy streams apply to a GPU device; this run is on the CPU "
                     f"(got --copy-streams {','.join(map(str, args.copy_streams))})")
    spec = not os.path.exists(args.source) and is_spec(args.source)
    if args.dataset_args is not None and not spec:
        parser.error(f"--dataset-args: constructor arguments apply to a module:Class SOURCE, not to {args.source}")
    if args.format is not None and spec:
        parser.error(f"--format applies to a path or URL SOURCE, not to the dataset class {args.source}")
    if args.workers is not None and not spec:
        parser.error(f"--workers applies to a Python dataset (module:Class SOURCE); {args.source} is gathered "
                     "natively by threads")
    try:  # a dataset class is imported, built and its first sample read here: before any measuring
        source, _ = as_tune_source(args.source, args.window, args.dtype, args.dataset_args, format=args.format)
    except (ValueError, TypeError, OSError) as e:
        parser.error(f"SOURCE {args.source}: {e}")

    try:
        result = tune(source, args.batch_size, threads=args.threads, prefetch=args.prefetch,
                      copy_streams=args.copy_streams,
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
    return replace(result, source=source)

