"""Lazily mapped shards against the same data mapped eagerly: a shuffled epoch of a dataset
directory read through the bounded mapping cache (csrc/core/lazy_mappings.h) and through one
mapping per file, and optionally the eager path of another build (--baseline-python, e.g. a main
build) to show that the eager path did not slow down.

Each measurement is its own process (fresh mappings), the alternatives interleaved within every
round; a measurement is the median of --epochs shuffled epochs after one warm-up epoch (pages in
the page cache, eager mappings made). Reported: the median over rounds and the spread (min-max),
and the per-round ratio to "eager" of the same round.

    python bench/bench_lazy_mappings.py [--rounds 5] [--baseline-python /path/to/main/venv/bin/python]

Data go to bench/data/lazy (git-ignored), written once.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "lazy"

# name: (shards, rows per shard, row shape of float32): each fits eagerly beside the default budget
# (40,000 mappings; 65,530 - 16,000 - what the process holds).
DATASETS = {
    "40k one-row shards, 128 B rows": (40_000, 1, (32,)),
    "4k shards x 64 rows, 1 KiB rows": (4_000, 64, (256,)),
}

ONE = """
import json, os, sys, time
import numpy as np
import fastload as fl
path, order, budget, epochs, batch, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), \\
    int(sys.argv[5]), int(sys.argv[6])
try:
    from fastload._columns import mapping as _mapping
    ctx = _mapping.mapping_budget(budget)
except (ImportError, AttributeError):  # a build without lazy mappings: eager only
    import contextlib
    ctx = contextlib.nullcontext()
with ctx as cache:
    ds = fl.Dataset.open(path)
    loader = fl.Loader(ds, batch, shuffle=True, order=order, device="cpu", num_threads=threads)
    kind = type(getattr(ds, "_maps", None)).__name__
    times = []
    for epoch in range(epochs + 1):
        if epoch == 1:
            warm = cache.stats() if cache is not None else {}
        t = time.perf_counter()
        for b in loader:
            pass
        if epoch:
            times.append(time.perf_counter() - t)
    stats = cache.stats() if cache is not None else {}
maps = (stats["maps"] - warm["maps"]) / epochs if stats else None  # in the timed epochs
print(json.dumps({"kind": kind, "epoch_s": sorted(times)[len(times) // 2], "maps_per_epoch": maps}))
"""


def ensure(name: str) -> Path:
    shards, rows, shape = DATASETS[name]
    path = DATA / f"{shards}x{rows}x{'x'.join(map(str, shape))}"
    if (path / "manifest.json").exists():
        return path
    import fastload as fl

    DATA.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(0).standard_normal((shards * rows,) + shape).astype(np.float32)
    print(f"writing {path} ({shards} shards)...", flush=True)
    fl.write_dataset(path, {"x": x}, rows_per_shard=rows, fsync=False, checksum=False, overwrite=True)
    return path


def measure(python: str, path: Path, order: str, budget: int, args: argparse.Namespace) -> dict:
    out = subprocess.run([python, "-c", ONE, str(path), order, str(budget), str(args.epochs), str(args.batch),
                          str(args.threads)], capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs per measurement (median)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--baseline-python", default=None, help="a Python whose fastload's eager path is compared")
    ap.add_argument("--dataset", action="append", default=None, help="only datasets whose name contains TEXT")
    ap.add_argument("--alt", action="append", default=None,
                    help="only alternatives whose name starts with TEXT (\"eager\" is always run)")
    args = ap.parse_args()
    for name in DATASETS:
        if args.dataset and not any(t in name for t in args.dataset):
            continue
        path = ensure(name)
        files = DATASETS[name][0]
        # eager: a budget above the file count; lazy, all cached: every file but one fits the
        # cache; lazy, 1/4: a quarter of the files fit, as for a dataset 4x the default budget.
        # Each is compared with eager of the same order in the same round.
        alternatives = {"eager": ("random", 1 << 30), "lazy, budget = files": ("random", files - 1),
                        "lazy, budget = files / 4": ("random", files // 4),
                        "eager, order=block": ("block", 1 << 30),
                        "lazy, budget = files / 4, order=block": ("block", files // 4)}
        if args.baseline_python:
            alternatives["eager, baseline build"] = ("random", 1 << 30)
        if args.alt:
            alternatives = {a: v for a, v in alternatives.items()
                            if a == "eager" or any(a.startswith(t) for t in args.alt)}
        results: dict[str, list[dict]] = {a: [] for a in alternatives}
        for r in range(args.rounds):
            for alt, (order, budget) in alternatives.items():
                python = args.baseline_python if alt == "eager, baseline build" else sys.executable
                results[alt].append(measure(python, path, order, budget, args))
            print(f"  {name}: round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
        rows = DATASETS[name][0] * DATASETS[name][1]
        print(f"\n### {name}: {rows:,} rows, batch {args.batch}, {args.threads} threads, shuffled, "
              f"{args.rounds} interleaved rounds\n")
        print("| alternative | mapped | epoch s, median (min-max) | ratio to eager of its order, median (min-max) | "
              "maps per epoch |")
        print("| --- | --- | --- | --- | --- |")
        for alt, ms in results.items():
            ref = "eager, order=block" if "block" in alt and "eager, order=block" in results else "eager"
            eager = [m["epoch_s"] for m in results[ref]]
            t = [m["epoch_s"] for m in ms]
            ratio = [a / b for a, b in zip(t, eager)]
            maps = ms[-1]["maps_per_epoch"]
            per_epoch = f"{maps:,.0f}" if maps is not None and ms[-1]["kind"] != "list" else "-"
            print(f"| {alt} | {ms[-1]['kind']} | {statistics.median(t):.3f} ({min(t):.3f}-{max(t):.3f}) | "
                  f"{statistics.median(ratio):.2f} ({min(ratio):.2f}-{max(ratio):.2f}) | {per_epoch} |")


if __name__ == "__main__":
    main()
