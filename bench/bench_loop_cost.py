"""What the loader costs the training loop's own thread: fastload against torch's DataLoader.

A training loop whose step is slower than the loader (the usual case on a GPU) should lose as
little of its thread as possible to fetching batches. Here the "step" is a fixed busy wait; each
loop takes batches for a few seconds and reports, per batch, the CPU its own thread spent inside
next() (thread CPU time: waiting asleep costs none), and the steps it completed against the ideal
(1 / step time). Same data and workloads as bench/bench_loader.py (its files in bench/data).
Interleaved rounds; medians with min-max. Run `python bench/bench_loop_cost.py [--quick]`.
"""
from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import torch.utils.data

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_loader as bl  # noqa: E402 - the shared workloads and data files

import fastload as fl  # noqa: E402


def busy(seconds: float) -> None:
    """The stand-in for a training step: holds the thread (and a core) like a step's Python does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def run_loop(make_iter, step: float, seconds: float, warmup: int = 50) -> tuple[float, float]:
    """(thread CPU µs inside next() per batch, steps done / ideal steps) for a loop of `step`
    seconds per batch; StopIteration starts the next epoch, as a training loop does."""
    it = make_iter()

    def take():
        nonlocal it
        try:
            return next(it)
        except StopIteration:
            it = make_iter()
            return next(it)

    for _ in range(warmup):
        take()
        busy(step)
    cpu = 0.0
    steps = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.thread_time()
        take()
        cpu += time.thread_time() - t0
        busy(step)
        steps += 1
    wall = time.perf_counter() - start
    return cpu / steps * 1e6, steps * step / wall


def fastload_loop(w: bl.Workload, mm, step: float, seconds: float) -> tuple[float, float]:
    loader = fl.Loader(bl.fastload_source(w, mm), **bl.loader_args(w))
    try:
        return run_loop(lambda: iter(loader), step, seconds)
    finally:
        loader.close()


def dataloader_loop(w: bl.Workload, mm, step: float, seconds: float) -> tuple[float, float]:
    ds = bl.WindowDataset(mm, *w.window) if w.window else bl.RowDataset(mm)
    dl = torch.utils.data.DataLoader(ds, batch_size=w.batch, shuffle=True, num_workers=bl.CORES, drop_last=True,
                                     persistent_workers=True)
    its = []

    def make_iter():
        its.append(iter(dl))
        return its[-1]

    try:
        return run_loop(make_iter, step, seconds)
    finally:
        for it in its:
            shutdown = getattr(it, "_shutdown_workers", None)  # stop the workers now (private)
            if shutdown is not None:
                shutdown()


def spread(values: list[float], fmt: str) -> str:
    return f"{format(statistics.median(values), fmt)} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small files, one short round: a smoke test")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3, quick 1)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per loop (default 3, quick 0.3)")
    ap.add_argument("--steps-us", type=str, default="50,1000", help="step times in µs, comma-separated")
    args = ap.parse_args()
    rounds = args.rounds or (1 if args.quick else 3)
    seconds = args.seconds or (0.3 if args.quick else 3.0)
    steps = [float(s) * 1e-6 for s in args.steps_us.split(",")]
    logging.getLogger("fastload").setLevel(logging.ERROR)  # the stall hint would interleave with the table

    print("# What the loader costs the training loop's thread\n")
    print("\n".join(bl.machine_lines()))
    print(f"- command: `{' '.join(['python', 'bench/bench_loop_cost.py'] + sys.argv[1:])}`")
    print(f"- {seconds:g} s per loop, {rounds} interleaved round(s); {bl.CORES} threads/workers; default arguments\n")
    chosen = [w for w in bl.workloads(args.quick) if w.name.startswith(("1 KiB", "uint16"))]
    rows = []
    for w in chosen:
        mm = bl.ensure_file(bl.HERE / "data" / w.file, w.shape, w.dtype)
        bl.page_in(mm)
        for step in steps:
            got = {"fastload": ([], []), "DataLoader": ([], [])}
            for rnd in range(rounds):
                order = [("fastload", fastload_loop), ("DataLoader", dataloader_loop)]
                for name, fn in order if rnd % 2 == 0 else order[::-1]:
                    cpu, done = fn(w, mm, step, seconds)
                    got[name][0].append(cpu)
                    got[name][1].append(done)
                    print(f"  {w.name}, step {step * 1e6:g} µs, round {rnd + 1}, {name}: next() {cpu:.1f} µs "
                          f"of the loop's thread per batch, {done:.0%} of the ideal steps", flush=True)
            rows.append((w, step, got))
        del mm

    print(f"\n## Per batch: the loop thread's CPU inside next(), and steps done / ideal (median of {rounds}, min–max)\n")
    print("| workload | step | fastload next() | DataLoader next() | fastload steps | DataLoader steps |")
    print("| --- | --- | --- | --- | --- | --- |")
    for w, step, got in rows:
        (fc, fd), (dc, dd) = got["fastload"], got["DataLoader"]
        print(f"| {w.name} | {step * 1e6:g} µs | {spread(fc, '.1f')} µs | {spread(dc, '.1f')} µs | "
              f"{spread(fd, '.0%')} | {spread(dd, '.0%')} |")


if __name__ == "__main__":
    main()
