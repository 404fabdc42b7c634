"""Hugging Face datasets and Parquet, side by side: fastload against what a user would write.

HF dataset (save_to_disk + load_from_disk; `input_ids` list<int32> of 64-512 tokens, `label`
int64), batch 64, 2 workers/threads each, shuffled:
- fastload: fl.Loader(ds) through fl.Arrow(ds, max_length=512) (native gather, padded)
- dl_rows: torch DataLoader(ds, num_workers=2), HF's default per-row format, numpy padding collate
- dl_torch: DataLoader over ds.with_format("torch") with a padding collate
- take_pool: 2 threads, one ds[ids] per batch as an Arrow table, numpy padding (the simplest fast thing)
Parquet (the same rows, directories of snappy part files; row groups of ~128 MiB and small ones):
- pq_block / pq_random: fl.Parquet(dir, max_length=512), order "block" (the default) / "random";
  whole epochs, each opening the files afresh (so every row group is decoded in every epoch,
  whatever the cache holds: open and decode are in the time; random order over row groups is
  timed over `seconds` instead, an epoch of it would take hours), 2 collation threads, fastload's
  decode threads (each decoding one row group with pyarrow, use_threads=False)
- pq_ceiling: pyarrow's own sequential iter_batches decode of the same columns at its defaults
  (batch_size 65536, use_threads=True: pyarrow's CPU pool), whole passes over the files, no
  shuffle, no padding, no tensors
- pq_ceiling_1t: the same with use_threads=False (one decoding thread)
- pq_ceiling_jemalloc: pq_ceiling with pyarrow's jemalloc pool (ARROW_DEFAULT_MEMORY_POOL=jemalloc):
  fl.Parquet decodes into jemalloc, and pyarrow's default pool (mimalloc) decodes these 128 MiB
  row groups markedly slower, so this is the ceiling at its best

Each alternative runs in a fresh process (its peak RSS is its own, DataLoader workers included);
rounds visit them in a new order each time; the table gives the median over rounds of the
per-round ratio, with its min-max. The data is written once into a cache folder (--data, by
default one per --rows in the temp folder) and reused by later runs.
Run `python bench/bench_arrow.py [--rows 1000000] [--rounds 5] [--seconds 4] [--only pq]`.
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
# fl.Parquet's budget of decoded row groups: below the data's size (as for a dataset larger than
# memory); its floor (an order="block" window and two row groups per collation thread) applies.
CACHE_MIB = 64
BIG_GROUP_BYTES = 128 << 20
HERE = Path(__file__).resolve().parent
HF = ["fastload", "dl_rows", "dl_torch", "take_pool"]
PQ = ["pq_block", "pq_random", "pq_ceiling", "pq_ceiling_1t", "pq_ceiling_jemalloc",
      "pq_small_block", "pq_small_random", "pq_small_ceiling", "pq_small_ceiling_1t", "pq_small_ceiling_jemalloc"]


def make_data(root: Path, rows: int, small_group_rows: int) -> None:
    """The rows as an HF dataset and as two Parquet directories (big and small row groups), in
    root; a marker file says the folder is complete (an interrupted write is made again)."""
    import shutil

    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    for sub in ("hf", "pq_big", "pq_small"):
        shutil.rmtree(root / sub, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    lengths = rng.integers(64, 513, rows)
    offsets = np.zeros(rows + 1, np.int32 if lengths.sum() < 2**31 else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.int32)
    list_type = pa.ListArray if offsets.dtype == np.int32 else pa.LargeListArray
    table = pa.table({"input_ids": list_type.from_arrays(pa.array(offsets), pa.array(values)),
                      "label": pa.array(rng.integers(0, 10, rows))})
    datasets.Dataset(table).save_to_disk(str(root / "hf"), max_shard_size="500MB")
    big_rows = max(1, int(BIG_GROUP_BYTES // (table.nbytes / rows)))  # ~128 MiB decoded per row group
    for name, group_rows in (("pq_big", big_rows), ("pq_small", small_group_rows)):
        d = root / name
        d.mkdir()
        per_file = max(group_rows, 2 * big_rows)  # files of whole row groups, as Spark writes them
        for k, a in enumerate(range(0, rows, per_file)):
            part = table.slice(a, min(per_file, rows - a))
            pq.write_table(part, d / f"part-{k:05d}.snappy.parquet", row_group_size=group_rows, compression="snappy")
        (d / "_SUCCESS").write_bytes(b"")
    (root / "complete").write_text(json.dumps({"rows": rows, "big_group_rows": big_rows,
                                               "small_group_rows": small_group_rows}))


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


def parquet_epoch(root: Path, name: str, info: dict, epoch: int):
    """One epoch of fl.Parquet over a freshly opened source (its open and every decode in the time)."""
    import fastload as fl
    d = root / ("pq_small" if "small" in name else "pq_big")
    order = "random" if name.endswith("random") else "block"
    t = time.perf_counter()
    src = fl.Parquet(d, max_length={"input_ids": MAX_LEN}, cache_bytes=CACHE_MIB << 20)
    loader = fl.Loader(src, batch_size=BATCH, shuffle=True, seed=epoch, order=order, num_threads=2,
                       device="cpu", drop_last=True)
    info.setdefault("open_s", time.perf_counter() - t)
    info["decode_threads"] = src.decode_threads
    yield from loader
    info["decodes_per_epoch"] = src.decode_stats()[0]
    src.close()


def ceiling_epoch(root: Path, name: str, info: dict, epoch: int):
    """pyarrow's sequential decode of the same columns, file after file, at its defaults."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    d = root / ("pq_small" if "small" in name else "pq_big")
    use_threads = not name.endswith("_1t")  # _jemalloc: the pool comes from the environment (main())
    info["decode_threads"] = pa.cpu_count() if use_threads else 1
    for f in sorted(str(p) for p in d.glob("part-*")):
        for rb in pq.ParquetFile(f).iter_batches(columns=["input_ids", "label"], use_threads=use_threads):
            yield {"n": rb.num_rows}


def run_one(name: str, root: Path, seconds: float) -> dict:
    t0 = time.perf_counter()
    import datasets
    import torch
    import fastload as fl
    datasets.disable_progress_bars()
    info: dict = {}
    if name in HF:
        t_open = time.perf_counter()
        ds = datasets.load_from_disk(str(root / "hf"))
        if name == "fastload":
            src = fl.Arrow(ds, max_length={"input_ids": MAX_LEN})
            loader = fl.Loader(src, batch_size=BATCH, shuffle=True, num_threads=2, device="cpu", drop_last=True)
            info["open_s"] = time.perf_counter() - t_open
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
        warm = min(2.0, seconds / 2)
    elif name in PQ:
        epoch_of = ceiling_epoch if "ceiling" in name else parquet_epoch
        if not name.endswith("random"):
            # Whole epochs, each opening the files afresh, until `seconds` have passed: with 128 MiB
            # row groups the first batch of an epoch waits for a window of them to be decoded,
            # so a part of an epoch would not measure the decoding rate.
            start, rows, epoch = time.perf_counter(), 0, 0
            while epoch == 0 or time.perf_counter() - start < seconds:
                rows += sum(b["n"] if "n" in b else len(b["label"]) for b in epoch_of(root, name, info, epoch))
                epoch += 1
            elapsed = time.perf_counter() - start
            return {"name": name, "rows_per_s": rows / elapsed, "peak_rss_mib": peak_rss_mib(), "epochs": epoch,
                    "total_s": time.perf_counter() - t0, **info}
        it = (b for epoch in range(10**9) for b in epoch_of(root, name, info, epoch))
        warm = 0.0
    else:
        raise ValueError(name)
    warm_until = time.perf_counter() + warm
    rows = 0
    if warm:
        for b in it:  # warm-up: workers started
            if time.perf_counter() > warm_until:
                break
    start = time.perf_counter()
    for b in it:
        rows += b["n"] if "n" in b else len(b["label"])
        if time.perf_counter() - start > seconds:
            break
    elapsed = time.perf_counter() - start
    return {"name": name, "rows_per_s": rows / elapsed, "peak_rss_mib": peak_rss_mib(), "total_s": time.perf_counter() - t0,
            **info}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--small-group-rows", type=int, default=2048)
    ap.add_argument("--data", type=str, default=None,
                    help="the data folder (written once, reused); default: one per --rows in the temp folder")
    ap.add_argument("--only", choices=["hf", "pq"], default=None, help="run only the HF or the Parquet part")
    ap.add_argument("--one", type=str, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    root = Path(args.data) if args.data else Path(tempfile.gettempdir()) / f"fastload-bench-arrow-{args.rows}"
    if args.one:
        print(json.dumps(run_one(args.one, root, args.seconds)))
        return
    if not (root / "complete").exists():
        t = time.perf_counter()
        make_data(root, args.rows, args.small_group_rows)
        print(f"data: {args.rows} rows written at {root} in {time.perf_counter() - t:.0f} s", flush=True)
    layout = json.loads((root / "complete").read_text())
    names = {"hf": HF, "pq": PQ}.get(args.only, HF + PQ)
    results: dict[str, list[dict]] = {n: [] for n in names}
    loads = [os.getloadavg()[0]]
    for r in range(args.rounds):
        order = names[:]
        random.Random(r).shuffle(order)
        for n in order:
            env = dict(os.environ, **({"ARROW_DEFAULT_MEMORY_POOL": "jemalloc"} if n.endswith("_jemalloc") else {}))
            out = subprocess.run([sys.executable, __file__, "--one", n, "--data", str(root), "--seconds",
                                  str(args.seconds)], capture_output=True, text=True, check=False, env=env)
            if out.returncode != 0:
                print(f"{n} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            results[n].append(json.loads(out.stdout.strip().splitlines()[-1]))
        loads.append(os.getloadavg()[0])
        print(f"round {r + 1}/{args.rounds} done (load {loads[-1]:.1f})", flush=True)

    def ratio(a: str, b: str) -> str:
        rs = [x["rows_per_s"] / y["rows_per_s"] for x, y in zip(results.get(a, []), results.get(b, []))
              if y["rows_per_s"] > 0]
        return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})" if rs else "n/a"

    def med(n: str, key: str) -> float | None:
        xs = [x[key] for x in results.get(n, []) if x.get(key) is not None]
        return statistics.median(xs) if xs else None

    print(f"\n{layout['rows']} rows, batch {BATCH}, 2 workers/threads, {args.rounds} interleaved rounds, "
          f"{args.seconds:g} s each; load average {min(loads):.1f}-{max(loads):.1f} on {os.cpu_count()} CPUs; "
          f"Parquet row groups of {layout['big_group_rows']} rows (~128 MiB decoded) and "
          f"{layout['small_group_rows']} rows; fl.Parquet cache_bytes={CACHE_MIB} MiB\n")
    refs = {"dl_rows": "fastload", "dl_torch": "fastload", "take_pool": "fastload",
            "pq_random": "pq_block", "pq_ceiling": "pq_block", "pq_ceiling_1t": "pq_block",
            "pq_ceiling_jemalloc": "pq_block", "pq_small_random": "pq_small_block",
            "pq_small_ceiling": "pq_small_block", "pq_small_ceiling_1t": "pq_small_block",
            "pq_small_ceiling_jemalloc": "pq_small_block"}
    print("| alternative | decode threads | samples/s (median) | peak RSS MiB | open ms | ratio of the reference to it |")
    print("| --- | --- | --- | --- | --- | --- |")
    for n in names:
        if not results[n]:
            continue
        opens = med(n, "open_s")
        threads = med(n, "decode_threads")
        ref = refs.get(n)
        print(f"| {n} | {'' if threads is None else int(threads)} | {med(n, 'rows_per_s'):,.0f} | "
              f"{med(n, 'peak_rss_mib'):,.0f} | {'' if opens is None else f'{opens * 1e3:.0f}'} | "
              f"{f'{ref}: ' + ratio(ref, n) if ref else ''} |")
    print("\nfastload's Parquet lines: 2 collation threads plus its decode threads (each row group decoded by one "
          "thread, pyarrow use_threads=False); pq_ceiling: iter_batches at pyarrow's defaults (use_threads=True, "
          "pyarrow's CPU pool, its default memory pool); pq_ceiling_1t: use_threads=False; pq_ceiling_jemalloc: "
          "pq_ceiling with pyarrow's jemalloc memory pool (fl.Parquet decodes into that pool).")


if __name__ == "__main__":
    main()
