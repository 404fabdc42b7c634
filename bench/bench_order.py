"""Shuffled reads from a dataset that is not in the page cache: order="block" (shards shuffled,
samples shuffled within windows of a few shards) vs order="random" (one permutation of all rows).

Owns its data file (bench/data/order_*.npy, git-ignored; deleted after the run unless --keep).
A dataset several times larger than RAM does not fit this machine's disk budget, so the page
cache is emptied instead: before every measurement the file is evicted with
posix_fadvise(POSIX_FADV_DONTNEED), and each measurement is short next to the file (random order
then finds almost nothing cached, as when the data is much larger than RAM). Rounds alternate the
two orders; the table shows the median and the spread (min-max) over rounds, and the bytes the
process read from the disk (/proc/self/io). Run `python bench/bench_order.py [--quick]`.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import fastload as fl
from fastload._sources.arrays import _declare_shards

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from page_cache import evict  # noqa: E402
BAR = 3.0  # block >= 3x random (issue 8)


def read_bytes() -> int:
    """Bytes this process caused to be read from storage (page-fault read-around included)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def ensure_file(path: Path, rows: int, row_bytes: int) -> None:
    if path.exists() and np.load(path, mmap_mode="r").shape == (rows, row_bytes):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=(rows, row_bytes))
    chunk = max(1, (64 << 20) // row_bytes)
    for lo in range(0, rows, chunk):
        hi = min(rows, lo + chunk)
        out[lo:hi] = (np.arange(lo, hi, dtype=np.uint64) % 251).astype(np.uint8)[:, None]
    out.flush()
    del out
    fd = os.open(tmp, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    os.replace(tmp, path)


def measure(path: Path, shard_rows: int, order: str, seed: int, seconds: float, batch: int,
            threads: int) -> tuple[float, int]:
    """(samples/s, bytes read from disk) over `seconds` of shuffled batches from a cold cache."""
    x = np.load(path, mmap_mode="r")
    rows = x.shape[0]
    shards = [shard_rows] * (rows // shard_rows) + ([rows % shard_rows] if rows % shard_rows else [])
    ds = _declare_shards(fl.Dataset({"x": x}), shards)
    evict(path)
    before = read_bytes()
    loader = fl.Loader(ds, batch, shuffle=True, seed=seed, order=order, rank=0, world_size=1, device="cpu",
                       num_threads=threads)
    samples = 0
    start = time.perf_counter()
    with loader:
        for b in loader:
            samples += len(b["x"])
            if time.perf_counter() - start >= seconds:
                break
        elapsed = time.perf_counter() - start
    return samples / elapsed, read_bytes() - before


def human(rate: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if rate >= scale:
            return f"{rate / scale:.3g} {unit}/s"
    return f"{rate:.3g} /s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a 512 MiB file, short rounds (a smoke test)")
    ap.add_argument("--gib", type=float, default=None, help="file size in GiB (default 8, quick 0.5)")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=None, help="per measurement")
    ap.add_argument("--keep", action="store_true", help="keep the data file for the next run")
    args = ap.parse_args()
    gib = args.gib or (0.5 if args.quick else 8.0)
    rounds = args.rounds or (2 if args.quick else 5)
    seconds = args.seconds or (0.5 if args.quick else 1.0)
    # Quick: smaller shards, so that a short measurement still spans several windows.
    row_bytes, shard_bytes, batch = 4096, (16 << 20) if args.quick else (64 << 20), 256
    threads = min(2, len(os.sched_getaffinity(0)))
    rows = int(gib * (1 << 30)) // row_bytes
    shard_rows = shard_bytes // row_bytes
    path = HERE / "data" / f"order_{rows}x{row_bytes}.npy"

    t0 = time.perf_counter()
    ensure_file(path, rows, row_bytes)
    write_s = time.perf_counter() - t0
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    print(f"# bench_order: shuffled reads from an evicted file, order='block' vs order='random'")
    print(f"- date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}")
    print(f"- machine: {threads} collation threads ({os.cpu_count()} CPUs online), {platform.processor() or platform.machine()}, "
          f"{mem:.1f} GiB RAM, Linux {platform.release()}")
    print(f"- data: {path.name}: {rows} rows x {row_bytes} B = {gib:g} GiB uint8, shards of {shard_rows} rows "
          f"({shard_bytes >> 20} MiB) declared on it; written in {write_s:.1f} s (0 = reused)")
    print(f"- eviction: posix_fadvise(POSIX_FADV_DONTNEED) on the whole file before every measurement "
          f"(not a memory cgroup); read-ahead of the device: "
          f"{Path('/sys/block/vda/queue/read_ahead_kb').read_text().strip() if Path('/sys/block/vda/queue/read_ahead_kb').exists() else '?'} KiB")
    print(f"- loader: batch {batch}, shuffle=True, {threads} threads, default prefetch; order='block' windows of "
          f"4 shards; {seconds:g} s per measurement from the first iter(), {rounds} rounds alternating the orders")
    print()

    results: dict[str, list[tuple[float, int]]] = {"block": [], "random": []}
    for r in range(rounds):
        for order in (("block", "random") if r % 2 == 0 else ("random", "block")):
            results[order].append(measure(path, shard_rows, order, seed=r, seconds=seconds, batch=batch,
                                          threads=threads))
    print("| order | samples/s (median) | spread (min-max) | MB/s of samples | read from disk per round (median) | "
          "of the file |")
    print("| --- | --- | --- | --- | --- | --- |")
    med = {}
    for order, runs in results.items():
        rates = [x for x, _ in runs]
        reads = statistics.median(b for _, b in runs)
        med[order] = statistics.median(rates)
        print(f"| {order} | {human(med[order])} | {human(min(rates))} - {human(max(rates))} | "
              f"{med[order] * row_bytes / 1e6:.0f} | {reads / 1e6:.0f} MB | {100 * reads / (rows * row_bytes):.0f}% |")
    ratio = med["block"] / med["random"] if med["random"] else float("inf")
    ratios = [b / r for (b, _), (r, _) in zip(results["block"], results["random"]) if r]
    print()
    print(f"block / random: {ratio:.1f}x (per round {min(ratios):.1f}x - {max(ratios):.1f}x); "
          f"bar >= {BAR:g}x: {'met' if ratio >= BAR else 'NOT met'}")
    if not args.keep:
        path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
