"""Hugging Face datasets and Parquet, side by side: fastload against what a user would write.

HF dataset (save_to_disk + load_from_disk; `input_ids` list<int32> of 64-512 tokens, `label`
int64), batch 64, 2 workers/threads each, shuffled:
- fastload: fl.Loader(ds) through fl.Arrow(ds, max_length=512) (native gather, padded)
- dl_rows: torch DataLoader(ds, num_workers=2), HF's default per-row format, numpy padding collate
- dl_torch: DataLoader over ds.with_format("torch") with a padding collate
- take_pool: 2 threads, one ds[ids] per batch as an Arrow table, numpy padding (the simplest fast thing)
Parquet (the same rows, a directory of snappy files; big and small row groups):
- pq_block / pq_random: fl.Parquet(dir, max_length=512), order "block" (the default) / "random"
- pq_ceiling: pyarrow's own sequential iter_batches decode of the same columns (no shuffle, no padding)

Each alternative runs in a fresh process (its peak RSS is its own, DataLoader workers included);
rounds visit them in a new order each time; the table gives the median over rounds of the
per-round ratio, with its min-max. Run `python bench/bench_arrow.py [--rows 1000000] [--rounds 5]`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BATCH = 64
MAX_LEN = 512
# fl.Parquet's budget of decoded row groups: below the data's size, so every epoch decodes (as a
# dataset larger than memory would); its floor (two order="block" windows) still applies.
CACHE_MIB = 64
HERE = Path(__file__).resolve().parent


def make_data(root: Path, rows: int) -> None:
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    lengths = rng.integers(64, 513, rows)
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
                      "label": pa.array(rng.integers(0, 10, rows))})
    datasets.Dataset(table).save_to_disk(str(root / "hf"), max_shard_size="500MB")
    for name, group_rows in (("pq_big", 110_000), ("pq_small", 2_048)):  # ~128 MiB row groups, and small ones
        d = root / name
        d.mkdir()
        parts = 4
        for k in range(parts):
            a, b = rows * k // parts, rows * (k + 1) // parts
            pq.write_table(table.slice(a, b - a), d / f"part-{k:05d}.snappy.parquet", row_group_size=group_rows,
                           compression="snappy")
        (d / "_SUCCESS").write_bytes(b"")


def pad_rows(rows: list) -> np.ndarray:
    out = np.zeros((len(rows), MAX_LEN), np.int32)
    for i, r in enumerate(rows):
        r = r[:MAX_LEN]
        out[i, :len(r)] = r
    return out


def collate_rows(samples: list) -> dict:
    import torch
    ids = [s["input_ids"] for s in samples]
    return {"input_ids": torch.from_numpy(pad_rows(ids)), "input_ids_lengths": torch.tensor([len(x) for x in ids]),
            "label": torch.tensor([s["label"] for s in samples])}


def collate_torch(samples: list) -> dict:
    import torch
    ids = [s["input_ids"] for s in samples]
    out = torch.zeros((len(ids), MAX_LEN), dtype=ids[0].dtype)
    for i, r in enumerate(ids):
        out[i, :len(r)] = r[:MAX_LEN]
    return {"input_ids": out, "input_ids_lengths": torch.tensor([len(x) for x in ids]),
            "label": torch.stack([s["label"] for s in samples])}


def take_batches(ds, seed: int):
    """2 threads, one ds[ids] per batch (HF's own gather, as an Arrow table: no Python per row),
    then numpy padding from the Arrow buffers. (pyarrow's Table.take on the memory-mapped table's
    1000-row chunks concatenates them: seconds per batch, so HF's gather is the fast thing here.)"""
    import collections
    from concurrent.futures import ThreadPoolExecutor

    import torch
    arrow = ds.with_format("arrow")
    order = np.random.default_rng(seed).permutation(len(ds))

    def one(k: int) -> dict:
        t = arrow[order[k * BATCH:(k + 1) * BATCH].tolist()]
        col = t.column("input_ids").combine_chunks()
        offs = col.offsets.to_numpy()
        vals = col.values.to_numpy()
        lens = np.minimum(np.diff(offs), MAX_LEN)
        out = np.zeros((len(lens), MAX_LEN), np.int32)
        for i, (a, n) in enumerate(zip(offs[:-1] - offs[0], lens)):
            out[i, :n] = vals[a:a + n]
        return {"input_ids": torch.from_numpy(out), "label": torch.from_numpy(t.column("label").to_numpy())}

    with ThreadPoolExecutor(2) as pool:
        pending: collections.deque = collections.deque()
        for k in range(len(ds) // BATCH):
            pending.append(pool.submit(one, k))
            if len(pending) >= 4:  # a few batches ahead, like a loader's prefetch
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def peak_rss_mib() -> float:
    """This process's peak RSS plus its live children's (DataLoader workers), from /proc: VmHWM is
    per address space, so unlike ru_maxrss it does not carry the parent's peak across exec."""
    def hwm(pid: str) -> int:
        try:
            with open(f"/proc/{pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
        except (OSError, StopIteration):
            return 0
    total = hwm("self")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                total += sum(hwm(c) for c in f.read().split())
        except OSError:
            pass
    return total / 1024


def forever(loader):
    """Batches of epoch after epoch (a measurement longer than an epoch)."""
    while True:
        yield from loader


def run_one(name: str, root: Path, seconds: float) -> dict:
    t0 = time.perf_counter()
    import datasets
    import torch
    import fastload as fl
    datasets.disable_progress_bars()
    open_s = None
    if name in ("fastload", "dl_rows", "dl_torch", "take_pool"):
        t_open = time.perf_counter()
        ds = datasets.load_from_disk(str(root / "hf"))
        if name == "fastload":
            src = fl.Arrow(ds, max_length={"input_ids": MAX_LEN})
            loader = fl.Loader(src, batch_size=BATCH, shuffle=True, num_threads=2, device="cpu", drop_last=True)
            open_s = time.perf_counter() - t_open
            it = forever(loader)
        elif name == "dl_rows":
            it = forever(torch.utils.data.DataLoader(ds, batch_size=BATCH, shuffle=True, num_workers=2,
                                                     collate_fn=collate_rows, drop_last=True, persistent_workers=True))
        elif name == "dl_torch":
            it = forever(torch.utils.data.DataLoader(ds.with_format("torch"), batch_size=BATCH, shuffle=True,
                                                     num_workers=2, collate_fn=collate_torch, drop_last=True,
                                                     persistent_workers=True))
        else:
            it = (b for epoch in range(10**9) for b in take_batches(ds, epoch))
    elif name in ("pq_block", "pq_random", "pq_small_block", "pq_small_random"):
        d = root / ("pq_small" if "small" in name else "pq_big")
        order = "random" if name.endswith("random") else "block"
        src = fl.Parquet(d, max_length={"input_ids": MAX_LEN}, cache_bytes=CACHE_MIB << 20)
        it = forever(fl.Loader(src, batch_size=BATCH, shuffle=True,
                               order=order, num_threads=2, device="cpu", drop_last=True))
    elif name in ("pq_ceiling", "pq_small_ceiling"):
        import pyarrow.parquet as pq
        d = root / ("pq_small" if "small" in name else "pq_big")
        files = sorted(str(p) for p in d.glob("part-*"))

        def decode():
            for f in files:
                for rb in pq.ParquetFile(f).iter_batches(batch_size=BATCH * 16, columns=["input_ids", "label"]):
                    yield {"n": rb.num_rows}
        it = (b for epoch in range(10**9) for b in decode())
    else:
        raise ValueError(name)
    warm_until = time.perf_counter() + min(2.0, seconds / 2)
    rows = 0
    for b in it:  # warm-up: workers started, first row groups decoded
        if time.perf_counter() > warm_until:
            break
    start = time.perf_counter()
    for b in it:
        rows += b["n"] if "n" in b else len(b["label"])
        if time.perf_counter() - start > seconds:
            break
    elapsed = time.perf_counter() - start
    return {"name": name, "rows_per_s": rows / elapsed, "peak_rss_mib": peak_rss_mib(), "open_s": open_s,
            "total_s": time.perf_counter() - t0}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--data", type=str, default=None, help="reuse a data directory made by an earlier run")
    ap.add_argument("--one", type=str, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, Path(args.data), args.seconds)))
        return
    root = Path(args.data) if args.data else Path(tempfile.mkdtemp(prefix="bench_arrow_"))
    if not (root / "hf").exists():
        t = time.perf_counter()
        make_data(root, args.rows)
        print(f"data: {args.rows} rows at {root} ({time.perf_counter() - t:.0f} s to write)", flush=True)
    names = ["fastload", "dl_rows", "dl_torch", "take_pool", "pq_block", "pq_random", "pq_ceiling",
             "pq_small_block", "pq_small_random", "pq_small_ceiling"]
    results: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        order = names[:]
        random.Random(r).shuffle(order)
        for n in order:
            out = subprocess.run([sys.executable, __file__, "--one", n, "--data", str(root), "--seconds",
                                  str(args.seconds)], capture_output=True, text=True, check=False)
            if out.returncode != 0:
                print(f"{n} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            results[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    def ratio(a: str, b: str) -> str:
        rs = [x["rows_per_s"] / y["rows_per_s"] for x, y in zip(results[a], results[b]) if y["rows_per_s"] > 0]
        return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})" if rs else "n/a"

    print(f"\n{args.rows} rows, batch {BATCH}, 2 workers/threads, {args.rounds} interleaved rounds, "
          f"{args.seconds:.0f} s each; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| alternative | samples/s (median) | peak RSS MiB | fastload's ratio to it |")
    print("| --- | --- | --- | --- |")
    for n in names:
        if not results[n]:
            continue
        med = statistics.median(x["rows_per_s"] for x in results[n])
        rss = statistics.median(x["peak_rss_mib"] for x in results[n])
        ref = {"dl_rows": "fastload", "dl_torch": "fastload", "take_pool": "fastload",
               "pq_ceiling": "pq_block", "pq_small_ceiling": "pq_small_block"}.get(n)
        print(f"| {n} | {med:,.0f} | {rss:,.0f} | {ratio(ref, n) if ref else ''} |")
    print(f"\nfl.Parquet cache_bytes={CACHE_MIB} MiB")
    print(f"pq_random / pq_block: {ratio('pq_random', 'pq_block')}; "
          f"pq_small_random / pq_small_block: {ratio('pq_small_random', 'pq_small_block')}")
    opens = [x["open_s"] for x in results["fastload"] if x["open_s"] is not None]
    if opens:
        print(f"open (load_from_disk + fl.Arrow + Loader): median {statistics.median(opens) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
