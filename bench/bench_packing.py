"""fl.Pack side by side with what users pack with today (issue 35).

Data: a Hugging Face dataset of --docs documents (default 1M) of int32 token ids with lognormal
lengths (median 300, sigma 1.0: mean ~495, 0.4% past 4096), saved once to a cache folder. Rows of
LENGTH=4096 tokens, batches of 8 rows, 2 threads/workers, shuffled; documents past 4096 tokens are
cut (split="truncate"; the peers get them cut the same way).

1. Packing efficiency (non-pad tokens / all tokens; one pass each, deterministic): fl.Pack
   (its default window), Grain's FirstFit and BestFit packing (num_packing_bins 8 and 128, over the
   same shuffled order), torchtune's PackedDataset rule (next fit in order: reimplemented here over
   every document, and checked against torchtune 0.6.1's own PackedDataset on the first 20,000),
   padding to each batch's longest document, and padding to 4096.
2. Tokens delivered per second (non-pad tokens; median of --rounds interleaved rounds, each
   alternative in a fresh process for --seconds after its first batch, epochs back to back):
   fl_packed (fl.Loader(fl.Pack(ds, 4096), 8)), fl_padded (fastload's padded gather of the same
   documents: fl.Loader(fl.Arrow(ds, max_length=4096), 8)), grain_bestfit (Grain's BestFit
   pipeline, 2 read threads) and hf_flatten (HF's DataCollatorWithFlattening over a DataLoader
   with 2 workers). Ratios are per round, against fl_packed of the same round.
3. Planning cost at --planning sizes (lengths only: an fl.Ragged over an offsets array and a
   sparse file of values, nothing read but offsets): making the Pack (it reads every length),
   time to the first batch, and each epoch's planning (wall time and the process's CPU time).

Grain, transformers and torchtune do not install beside fastload's test extras: give a Python that
has them with --peers-python (a venv with torch==2.13.0, numpy, datasets, grain, transformers,
torchtune==0.6.1 and torchao==0.11.0: torchtune 0.6.1 does not import with torchao 0.18). Without
it the peers' rows are left out.
Run `python bench/bench_packing.py [--docs 1000000] [--rounds 5] [--seconds 5]
[--peers-python /path/to/python] [--planning 1000000,100000000] [--only efficiency,throughput,planning]`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

LENGTH = 4096
BATCH = 8
THREADS = 2
HERE = Path(__file__).resolve().parent
OURS = ["fl_packed", "fl_padded"]
PEERS = ["grain_bestfit", "hf_flatten"]


def lognormal_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.maximum(1, rng.lognormal(np.log(300), 1.0, n)).astype(np.int64)


def document_order(n: int, seed: int = 0) -> np.ndarray:
    """fl.Pack's order of documents in epoch 0 with shuffle=True, seed 0 (the Loader's own)."""
    import fastload as fl

    s = fl._C.Sampler(n, 1, 1, 0, seed, True, "random", "pad", False, fl._C.BLOCK_SIZE, "samples", [],
                      fl._C.WINDOW_SHARDS)
    return s.permutation(0, 0, n)


def make_data(root: Path, docs: int) -> None:
    import datasets
    import pyarrow as pa

    if (root / "complete").exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    lengths = lognormal_lengths(docs)
    offsets = np.zeros(docs + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = np.random.default_rng(1).integers(0, 32000, int(offsets[-1]), dtype=np.int32)
    table = pa.table({"input_ids": pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values))})
    del values
    datasets.Dataset(table).save_to_disk(str(root / "hf"), max_shard_size="1GB")
    np.save(root / "lengths.npy", lengths)
    np.save(root / "order.npy", document_order(docs))
    (root / "complete").write_text(json.dumps({"docs": docs}))


# ---------------------------------------------------------------- 1. efficiency

def next_fit_rows(lengths: np.ndarray) -> int:
    """torchtune PackedDataset's rule (split_across_pack=False): documents in order are appended to
    the current pack; one that does not fit closes it and starts the next."""
    rows, used = 0, LENGTH + 1
    for n in lengths.tolist():
        if used + n > LENGTH:
            rows += 1
            used = 0
        used += n
    return rows


SUBSET = 50_000  # documents of the shuffled order that Grain packs (its packing runs at ~1 ms a document)


def pack_lengths(lengths: np.ndarray) -> Any:
    """fl.Pack's stats over documents of these lengths in this order (no shuffle; values never read)."""
    import fastload as fl

    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ds = fl.Dataset({"input_ids": fl.Ragged(np.zeros(int(offsets[-1]), np.uint8), offsets)})
    return fl.Loader(fl.Pack(ds, LENGTH), BATCH).stats().packing


def efficiency(root: Path, peers_python: str | None) -> dict:
    """Every rule over every document in fl.Pack's epoch-0 order; Grain over the first SUBSET of
    that order, with fl.Pack and the torchtune rule over the same subset beside it."""
    import datasets

    import fastload as fl

    lengths = np.minimum(np.load(root / "lengths.npy"), LENGTH)
    ordered = lengths[np.load(root / "order.npy")]
    tokens = int(lengths.sum())
    ds = datasets.load_from_disk(str(root / "hf"))
    t = time.perf_counter()
    pack = fl.Pack(ds, LENGTH)
    made = time.perf_counter() - t
    stats = fl.Loader(pack, BATCH, shuffle=True, seed=0, num_threads=THREADS).stats().packing
    out = {"fl_pack": {"efficiency": stats.efficiency, "rows": stats.rows, "window": pack.window,
                       "pack_s": made, "planning_s": stats.planning_s}}
    rows = next_fit_rows(ordered)
    out["torchtune_rule"] = {"efficiency": tokens / (rows * LENGTH), "rows": rows}
    batches = ordered[: len(ordered) // BATCH * BATCH].reshape(-1, BATCH)
    out["pad_longest"] = {"efficiency": float((batches.sum(1) / (BATCH * batches.max(1))).mean())}
    out["pad_4096"] = {"efficiency": tokens / (len(lengths) * LENGTH)}
    subset = ordered[:SUBSET]
    sub = pack_lengths(subset)
    out[f"fl_pack_first_{SUBSET}"] = {"efficiency": sub.efficiency, "rows": sub.rows}
    rows = next_fit_rows(subset)
    out[f"torchtune_rule_first_{SUBSET}"] = {"efficiency": int(subset.sum()) / (rows * LENGTH), "rows": rows}
    if peers_python:
        with tempfile.TemporaryDirectory() as tmp:
            res = Path(tmp) / "peers.json"
            subprocess.run([peers_python, str(HERE / "packing_peers.py"), "efficiency", str(root), str(res),
                            str(SUBSET)], check=True, env=dict(os.environ, TQDM_DISABLE="1"))
            peers = json.loads(res.read_text())
        for k, v in peers.items():
            if k.startswith("grain"):
                out[f"{k}_first_{SUBSET}"] = v
        tt = peers["torchtune_first_20k"]
        ours = next_fit_rows(ordered[:20_000])
        out["torchtune_check"] = {"torchtune_rows": tt["rows"], "rule_rows": ours, "equal": tt["rows"] == ours,
                                  "torchtune_s": tt["seconds"]}
    return out


# ---------------------------------------------------------------- 2. throughput

def run_ours(name: str, root: Path, seconds: float) -> dict:
    import datasets

    import fastload as fl

    ds = datasets.load_from_disk(str(root / "hf"))
    if name == "fl_packed":
        loader = fl.Loader(fl.Pack(ds, LENGTH), BATCH, shuffle=True, num_threads=THREADS)
    else:
        loader = fl.Loader(fl.Arrow(ds, max_length=LENGTH), BATCH, shuffle=True, num_threads=THREADS)

    def batches():
        epoch = 0
        while True:
            loader.set_epoch(epoch)
            for b in loader:
                yield b
            epoch += 1

    it = batches()
    t0 = time.perf_counter()
    next(it)
    first = time.perf_counter() - t0
    tokens = rows = 0
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    t = time.perf_counter()
    packed = name == "fl_packed"
    while time.perf_counter() - t < seconds:
        b = next(it)
        rows += b["input_ids"].shape[0]
        if not packed:
            tokens += int(b["input_ids_lengths"].sum())
    dt = time.perf_counter() - t
    if packed:  # counting each batch's tokens would cost more than building it: the epochs' share
        tokens = int(rows * LENGTH * loader.stats().packing.efficiency)
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)
    return {"tokens_per_s": tokens / dt, "rows_per_s": rows / dt, "first_batch_s": first,
            "cpu_ns_per_token": cpu / tokens * 1e9}


def measure(name: str, root: Path, seconds: float, peers_python: str | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        res = Path(tmp) / "r.json"
        if name in OURS:
            cmd = [sys.executable, __file__, "--run", name, "--data", str(root), "--seconds", str(seconds),
                   "--out", str(res)]
        else:
            cmd = [peers_python, str(HERE / "packing_peers.py"), name, str(root), str(seconds), str(res)]
        subprocess.run(cmd, check=True, env=dict(os.environ, TQDM_DISABLE="1"))
        return json.loads(res.read_text())


def throughput(root: Path, rounds: int, seconds: float, peers_python: str | None) -> dict:
    names = OURS + (PEERS if peers_python else [])
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[:]
        random.Random(r).shuffle(order)
        for n in order:
            runs[n].append(measure(n, root, seconds, peers_python))
            print(f"round {r} {n}: {runs[n][-1]['tokens_per_s'] / 1e6:.1f} M tokens/s", flush=True)
    out = {}
    for n in names:
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[n], runs["fl_packed"])]
        out[n] = {"tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs[n]),
                  "first_batch_s": statistics.median(x["first_batch_s"] for x in runs[n]),
                  "ratio_to_packed": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                  "runs": runs[n]}
        if "rows_per_s" in runs[n][0]:
            out[n]["rows_per_s"] = statistics.median(x["rows_per_s"] for x in runs[n])
            out[n]["cpu_ns_per_token"] = statistics.median(x["cpu_ns_per_token"] for x in runs[n])
    return out


# ---------------------------------------------------------------- 3. planning

def run_planning(docs: int) -> dict:
    """Planning at `docs` documents with nothing but lengths: offsets in memory, values a sparse
    file that is never read."""
    import fastload as fl

    lengths = lognormal_lengths(docs, seed=2)
    offsets = np.zeros(docs + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    del lengths
    with tempfile.TemporaryDirectory(dir=os.environ.get("FASTLOAD_BENCH_TMP")) as tmp:
        values = np.memmap(Path(tmp) / "values.u16", dtype=np.uint16, mode="w+", shape=(int(offsets[-1]),))
        rss0 = _rss_mib()
        t = time.perf_counter()
        ds = fl.Dataset({"input_ids": fl.Ragged(values, offsets)})
        pack = fl.Pack(ds, LENGTH)
        made = time.perf_counter() - t
        loader = fl.Loader(pack, BATCH, shuffle=True, num_threads=THREADS)
        epochs = []
        for epoch in range(2):
            loader.set_epoch(epoch)
            c0, t0 = _cpu(), time.perf_counter()
            next(iter(loader))
            first, cpu = time.perf_counter() - t0, _cpu() - c0
            s = loader.stats().packing
            epochs.append({"first_batch_s": first, "planning_s": s.planning_s, "process_cpu_s": cpu,
                           "rows": s.rows, "efficiency": s.efficiency})
            if epoch == 0:
                # Epoch 1 is planned ahead (one thread) while epoch 0 runs; a training epoch lasts far
                # longer than that plan, so let it finish before epoch 1's first batch is timed.
                time.sleep(3 * s.planning_s + 1)
        return {"docs": docs, "pack_s": made, "window": pack.window, "epochs": epochs,
                "rss_mib_after": _rss_mib(), "rss_mib_before_pack": rss0,
                "offsets_mib": offsets.nbytes / 2**20}


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def planning(sizes: list[int]) -> list[dict]:
    out = []
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            res = Path(tmp) / "p.json"
            subprocess.run([sys.executable, __file__, "--plan", str(n), "--out", str(res)], check=True)
            out.append(json.loads(res.read_text()))
            print(json.dumps(out[-1]), flush=True)
    return out


# ---------------------------------------------------------------- report

def report(result: dict) -> None:
    eff = result.get("efficiency")
    if eff:
        print("\npacking efficiency (non-pad tokens / all tokens), rows of 4096")
        for k, v in eff.items():
            if "efficiency" in v:
                print(f"  {k:<32} {v['efficiency']:.4f}" + (f"  ({v['rows']:,} rows)" if "rows" in v else ""))
        if "torchtune_check" in eff:
            print(f"  torchtune 0.6.1 PackedDataset on the first 20,000: {eff['torchtune_check']}")
    tp = result.get("throughput")
    if tp:
        print("\nnon-pad tokens delivered per second (median over rounds; ratio to fl_packed: median (min-max))")
        for k, v in tp.items():
            extra = f", rows/s {v['rows_per_s']:,.0f}, CPU {v['cpu_ns_per_token']:.2f} ns/token" if "rows_per_s" in v else ""
            print(f"  {k:<14} {v['tokens_per_s'] / 1e6:8.1f} M/s  {v['ratio_to_packed']:.3f}x "
                  f"({v['ratio_min']:.3f}-{v['ratio_max']:.3f}); first batch {v['first_batch_s']:.2f} s{extra}")
    for p in result.get("planning") or []:
        e = p["epochs"]
        print(f"\nplanning at {p['docs']:,} documents (window {p['window']}): Pack made in {p['pack_s']:.2f} s; "
              f"epoch 0: first batch {e[0]['first_batch_s']:.2f} s (planning {e[0]['planning_s']:.2f} s wall, "
              f"{e[0]['process_cpu_s']:.2f} s CPU); epoch 1: {e[1]['first_batch_s']:.2f} s "
              f"({e[1]['planning_s']:.2f} s, {e[1]['process_cpu_s']:.2f} s CPU); efficiency {e[0]['efficiency']:.4f}; "
              f"RSS {p['rss_mib_after']:.0f} MiB (offsets {p['offsets_mib']:.0f} MiB)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--peers-python", default=None)
    ap.add_argument("--planning", default="1000000,100000000")
    ap.add_argument("--only", default="efficiency,throughput,planning")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--plan", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        a.out.write_text(json.dumps(run_ours(a.run, a.data, a.seconds)))
        return
    if a.plan:
        a.out.write_text(json.dumps(run_planning(a.plan)))
        return
    root = a.data or Path(tempfile.gettempdir()) / f"fastload_bench_packing_{a.docs}"
    only = set(a.only.split(","))
    result: dict = {"docs": a.docs, "rounds": a.rounds, "seconds": a.seconds}
    if only & {"efficiency", "throughput"}:
        make_data(root, a.docs)
    if "efficiency" in only:
        result["efficiency"] = efficiency(root, a.peers_python)
    if "throughput" in only:
        result["throughput"] = throughput(root, a.rounds, a.seconds, a.peers_python)
    if "planning" in only:
        result["planning"] = planning([int(x) for x in a.planning.split(",")])
    report(result)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
