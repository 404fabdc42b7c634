"""Data-on-disk benchmark: opening a 1,000-shard dataset directory (time, and that no data page
was read), Windows.from_files against in-memory Windows, and the dataset writer against dd.

Run `python bench/bench_disk.py [--quick]`; results that matter are recorded in bench/RESULTS.md.
Files go to bench/data/disk (git-ignored), on the disk the writer is measured against.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import mmap
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import fastload as fl

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_loader import machine_lines  # noqa: E402
from page_cache import evict  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]

BAR_OPEN_MS = 50.0
BAR_FROM_FILES = 0.9  # from_files >= 0.9x in-memory Windows
BAR_WRITER = 0.5  # writer >= 0.5x dd


def resident_pages(path: Path) -> int:
    """Pages of the file in the page cache (mincore on a fresh mapping reads nothing)."""
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)
    try:
        n = (size + PAGE - 1) // PAGE
        vec = (ctypes.c_ubyte * n)()
        view = np.frombuffer(mm, dtype=np.uint8)  # the mapping's address, without touching a page
        if _libc.mincore(ctypes.c_void_p(view.__array_interface__["data"][0]), size, vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        del view
        return int(np.frombuffer(vec, dtype=np.uint8).__and__(1).sum())
    finally:
        mm.close()


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.4g} (min {min(xs):.4g}, max {max(xs):.4g}, n={len(xs)})"


# ----------------------------------------------------------------------------- open
def bench_open(root: Path, shards: int, rows: int) -> dict:
    path = root / "open1000"
    if path.exists():
        shutil.rmtree(path)
    x = np.random.default_rng(0).standard_normal((shards * rows, 16)).astype(np.float32)
    y = np.arange(shards * rows)
    fl.write_dataset(path, {"x": x, "y": y}, rows_per_shard=rows)
    files = sorted(p for p in path.rglob("*.npy"))
    for f in files:
        evict(f)
    before = sum(resident_pages(f) for f in files)
    times, faults = [], []
    for _ in range(7):
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        ds = fl.Dataset.open(path)
        times.append((time.perf_counter() - t) * 1e3)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        faults.append(r1.ru_majflt - r0.ru_majflt)
        assert ds.num_shards == shards
    after = sum(resident_pages(f) for f in files)
    t = time.perf_counter()
    loader = fl.Loader(ds, 256)  # maps every shard (headers read)
    map_ms = (time.perf_counter() - t) * 1e3
    mapped = sum(resident_pages(f) for f in files)
    t = time.perf_counter()
    fl.Dataset.open(path, verify=True)
    verify_s = time.perf_counter() - t
    loader.close()
    total = sum(f.stat().st_size for f in files)
    return {"files": len(files), "open_ms": times, "major_faults": faults, "resident_before": before,
            "resident_after_open": after, "resident_after_loader": mapped, "loader_ms": map_ms,
            "verify_gbs": total / verify_s / 1e9, "bytes": total}


# ----------------------------------------------------------------------------- windows
def rate(loader: fl.Loader, seconds: float) -> float:
    it = iter(loader)
    n = 0
    for _ in range(3):  # warm-up
        try:
            next(it)
        except StopIteration:
            it = iter(loader)
    t = time.perf_counter()
    while True:
        try:
            b = next(it)
        except StopIteration:
            it = iter(loader)
            continue
        n += len(b["tokens"])
        if time.perf_counter() - t >= seconds:
            break
    return n / (time.perf_counter() - t)


def bench_windows(root: Path, files: int, tokens_per_file: int, seconds: float, rounds: int) -> dict:
    rng = np.random.default_rng(1)
    paths = []
    for k in range(files):
        p = root / f"tokens_{k:03d}.bin"
        if not p.exists() or p.stat().st_size != tokens_per_file * 2:
            rng.integers(0, 50_000, tokens_per_file, dtype=np.uint16).tofile(p)
        paths.append(p)
    whole = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in paths])  # in memory
    single = root / f"tokens_all_{files}.bin"  # the same tokens as one file
    if not single.exists() or single.stat().st_size != whole.nbytes:
        whole.tofile(single)
    length, stride, batch = 1025, 1024, 64
    kw = dict(shuffle=True, seed=0, num_threads=2)
    sources = {"in-memory Windows (one array in RAM)": fl.Windows(whole, length=length, stride=stride),
               "in-memory Windows (one np.memmap of the concatenated file)":
                   fl.Windows(np.memmap(single, dtype=np.uint16, mode="r"), length=length, stride=stride),
               f"Windows.from_files ({files} files)": fl.Windows.from_files(paths, dtype=np.uint16, length=length,
                                                                             stride=stride)}
    for src in sources.values():  # page-cache the files, fault in the memory
        for b in fl.Loader(src, 1024, num_threads=2):
            pass
    loaders = {k: fl.Loader(v, batch, **kw) for k, v in sources.items()}
    out: dict[str, list[float]] = {k: [] for k in loaders}
    for _ in range(rounds):
        for k, loader in loaders.items():
            out[k].append(rate(loader, seconds))
    for loader in loaders.values():
        loader.close()
    return {"rates": out, "unused": sources[f"Windows.from_files ({files} files)"].unused_tokens,
            "windows": {k: len(v) for k, v in sources.items()}}


# ----------------------------------------------------------------------------- writer
def bench_writer(root: Path, mib: int, rounds: int) -> dict:
    chunk = np.random.default_rng(2).integers(0, 255, (8 << 20) // 1024 * 1024, dtype=np.uint8).reshape(-1, 1024)
    chunks = mib // 8
    results: dict[str, list[float]] = {"dd conv=fdatasync": [], "dd oflag=direct": [],
                                       "DatasetWriter (fl64 checksum, fsync)": [], "DatasetWriter (no checksum, fsync)": []}
    target = root / "writer"
    ddfile = root / "dd.bin"
    names = list(results)
    for r in range(rounds):
        # A new order each round: no fixed position and no fixed predecessor (an O_DIRECT dd leaves
        # the virtual disk busy flushing, which slowed whatever ran next).
        order = names[:]
        random.Random(r).shuffle(order)
        for name in order:
            if target.exists():
                shutil.rmtree(target)
            if ddfile.exists():
                ddfile.unlink()
            os.sync()
            t = time.perf_counter()
            if name.startswith("dd"):
                flag = "conv=fdatasync" if "fdatasync" in name else "oflag=direct"
                subprocess.run(["dd", "if=/dev/zero", f"of={ddfile}", "bs=1M", f"count={mib}", flag],
                               check=True, capture_output=True)
            else:
                with fl.DatasetWriter(target, rows_per_shard=(64 << 20) // 1024,
                                      checksum="no checksum" not in name) as w:
                    for _ in range(chunks):
                        w.append({"x": chunk})
            results[name].append(mib / 1024 * 2**30 / (time.perf_counter() - t) / 1e9)
    if target.exists():
        shutil.rmtree(target)
    if ddfile.exists():
        ddfile.unlink()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke test")
    ap.add_argument("--parts", default="open,windows,writer", help="comma-separated: open, windows, writer")
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    root = HERE / "data" / "disk"
    root.mkdir(parents=True, exist_ok=True)
    quick = args.quick
    print("# fastload data-on-disk benchmark\n")
    print("\n".join(machine_lines()))
    print(f"- command: `python bench/bench_disk.py {' '.join(sys.argv[1:])}`")
    df = subprocess.run(["df", "-hT", str(root)], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(f"- disk: `{df}`\n")

    if "open" in parts:
        report_open(root, quick)
    if "windows" in parts:
        report_windows(root, quick)
    if "writer" in parts:
        report_writer(root, quick)
    print(f"\nload average after the run: {open('/proc/loadavg').read().split()[:3]}")


def report_open(root: Path, quick: bool) -> None:
    o = bench_open(root, 1000, 256 if quick else 1024)
    med = statistics.median(o["open_ms"])
    print("## Open of a 1,000-shard directory\n")
    print(f"{o['files']} .npy files ({o['bytes'] / 1e6:.0f} MB: x float32[16] and y int64, 1,000 shards), "
          "evicted from the page cache with posix_fadvise(DONTNEED) before the opens.\n")
    print("| measure | value |\n| --- | --- |")
    print(f"| Dataset.open, ms (7 opens) | {spread(o['open_ms'])} |")
    print(f"| major faults during the opens | {o['major_faults']} |")
    print(f"| data pages resident before / after the opens (mincore over all files) | "
          f"{o['resident_before']} / {o['resident_after_open']} |")
    print(f"| first Loader over it (maps the 2,000 files), ms | {o['loader_ms']:.1f} |")
    print(f"| pages resident after that Loader | {o['resident_after_loader']} |")
    print(f"| Dataset.open(verify=True): reads and checksums every shard (cold), GB/s | {o['verify_gbs']:.2f} |")
    ok = med < BAR_OPEN_MS and o["resident_after_open"] == o["resident_before"]
    print(f"\nBar: open < {BAR_OPEN_MS:.0f} ms with no data pages read: median {med:.2f} ms, "
          f"{o['resident_after_open'] - o['resident_before']} pages read: {'MEETS' if ok else 'MISSES'}\n")



def report_windows(root: Path, quick: bool) -> None:
    files, per_file = (8, 1 << 20) if quick else (64, 4 << 20)
    w = bench_windows(root, files, per_file, 0.3 if quick else 1.5, 1 if quick else 7)
    print("## Windows.from_files vs in-memory Windows\n")
    print(f"{files} files of {per_file} uint16 tokens (page-cached), length 1025, stride 1024, batch 64, shuffled, "
          f"2 threads; samples/s, median of interleaved rounds. from_files leaves {w['unused']} tokens unused at "
          f"file ends (windows: {w['windows']}).\n")
    print("| source | samples/s | GB/s (median) |\n| --- | --- | --- |")
    for k, xs in w["rates"].items():
        print(f"| {k} | {spread([x / 1e6 for x in xs])} M | {statistics.median(xs) * 2050 / 1e9:.2f} |")
    ram_rate, map_rate, file_rate = (statistics.median(v) for v in w["rates"].values())
    per_round = [f / m for f, m in zip(*(list(w["rates"].values())[k] for k in (2, 1)))]
    print(f"\nfrom_files / one memmap, per round: {', '.join(f'{x:.3f}' for x in per_round)}\n")
    for label, base in (("one np.memmap (same page-cached bytes, 4 KiB pages)", map_rate),
                        ("one array in RAM (numpy asks for huge pages: fewer TLB misses)", ram_rate)):
        r = file_rate / base
        print(f"Bar: from_files >= {BAR_FROM_FILES:.1f}x in-memory Windows over {label}: {r:.3f}x: "
              f"{'MEETS' if r >= BAR_FROM_FILES else 'MISSES'}")
    print()



def report_writer(root: Path, quick: bool) -> None:
    mib = 256 if quick else 1024
    wr = bench_writer(root, mib, 1 if quick else 7)
    print("## Writer vs dd\n")
    print(f"{mib} MiB per run, to {root}; the writer appends 8 MiB chunks of 1 KiB rows into 64 MiB shards and "
          "fsyncs each shard (on a helper thread, while the next is written), the manifest and the directories before "
          "the final rename; GB/s including all of that; median of rounds, each in a new random order (the disk is shared).\n")
    print("| writer | GB/s |\n| --- | --- |")
    for k, xs in wr.items():
        print(f"| {k} | {spread(xs)} |")
    dd = statistics.median(wr["dd conv=fdatasync"])
    ours = statistics.median(wr["DatasetWriter (fl64 checksum, fsync)"])
    print(f"\nBar: writer >= {BAR_WRITER:.1f}x dd (conv=fdatasync, the same durability): {ours / dd:.2f}x: "
          f"{'MEETS' if ours / dd >= BAR_WRITER else 'MISSES'}")


if __name__ == "__main__":
    main()
