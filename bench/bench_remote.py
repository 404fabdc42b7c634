"""Object storage, side by side in one run on a loopback S3 server (moto's server mode, in its
own process): the network ceiling (parallel GETs of the same objects) with each client that is
installed (boto3, obstore, s3fs), then fastload reading the same dataset from s3:// (epoch 1 from
an empty cache, epoch 2 from the cache, and order="block" with a cache of 25% of the dataset),
against the same dataset directory read locally.

    python bench/bench_remote.py [--mb 192] [--shard-mb 8] [--rounds 3] [--threads 2]
    python bench/bench_remote.py --mb 1024 --shard-mb 64   # + block 25% with whole objects, not parts
    python bench/bench_remote.py --peers [--gb 2] [--rounds 3]   # beside Streaming and litdata

--peers runs issue 24's side-by-side instead (bench/remote_peers.py: fastload, MosaicML Streaming and
litdata on the same server, data and cache limit; the peers install from
bench/requirements-peers.txt).

moto serves from Python, so its ceiling is far below a real store's; what matters here are the
ratios measured in the same run. Not a timed test."""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import fastload as fl
from s3_ceiling import ceiling_boto3, ceiling_obstore, ceiling_obstore_files, ceiling_s3fs

BUCKET = "bench-remote"


def _start_server() -> tuple[subprocess.Popen, str]:
    """moto's server, with ranged GETs that read their bytes only (s3_counting_server.py)."""
    import remote_peers  # the bench folder is on sys.path (main())

    return remote_peers.start_server()


def _remove(path: str) -> None:
    """The cache folder of a dropped source: a download it had in flight may still finish (or
    drop its temporary file) while the folder is removed, so remove until it stays gone."""
    for _ in range(100):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.exists(path):
            return
        time.sleep(0.05)


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def epoch(loader: fl.Loader, e: int) -> tuple[float, float, int]:
    """(seconds to the first batch, seconds for the epoch, samples)."""
    loader.set_epoch(e)
    t = time.perf_counter()
    first = None
    n = 0
    for b in loader:
        if first is None:
            first = time.perf_counter() - t
        n += len(b["y"])
    return first or 0.0, time.perf_counter() - t, n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=192)
    ap.add_argument("--shard-mb", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--peers", action="store_true", help="fastload beside Streaming and litdata (remote_peers.py)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import remote_peers

    remote_peers.add_arguments(ap)
    args = ap.parse_args()
    if args.peers:
        if not any(a.startswith("--shard-mb") for a in sys.argv):
            args.shard_mb = 64  # the shards
        return remote_peers.main(args)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import boto3

    tmp = tempfile.mkdtemp(prefix="bench_remote_")
    proc, endpoint = _start_server()
    try:
        rows = args.mb * 1024  # 1 KiB rows
        per_shard = args.shard_mb * 1024
        x = np.random.default_rng(0).integers(0, 255, (rows, 1016), dtype=np.uint8)
        local = os.path.join(tmp, "ds")
        fl.write_dataset(local, {"x": x, "y": np.arange(rows, dtype=np.int64)}, rows_per_shard=per_shard, fsync=False)
        del x
        c = boto3.client("s3", endpoint_url=endpoint)
        c.create_bucket(Bucket=BUCKET)
        keys = []
        for d, _, fs in os.walk(local):
            for f in sorted(fs):
                p = os.path.join(d, f)
                key = "ds/" + os.path.relpath(p, local)
                with open(p, "rb") as fh:
                    c.put_object(Bucket=BUCKET, Key=key, Body=fh.read())
                if f.endswith(".npy"):
                    keys.append(key)
        total = sum(os.path.getsize(os.path.join(local, k[3:])) for k in keys)
        print(f"dataset: {rows} rows of 1 KiB in {len(keys)} objects, {total / 1e6:.0f} MB; moto on {endpoint}; "
              f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")

        # Rounds interleave the ceilings with fastload's runs, so that each ratio compares
        # measurements of one round (the machine's load drifts between rounds).
        ceiling_fns = [("boto3", ceiling_boto3), ("obstore", ceiling_obstore), ("obstore to files", ceiling_obstore_files),
                       ("s3fs", ceiling_s3fs)]
        ceilings: dict[str, list[float]] = {}
        url = f"s3://{BUCKET}/ds"
        results: dict[str, list] = {"local directory": []}
        fetched_ratio: dict[str, list] = {}
        missing: set[str] = set()
        for r in range(args.rounds):
            for name, fn in ceiling_fns:
                if name in missing:
                    continue
                try:
                    rate = fn(endpoint, keys, args.concurrency)
                except ImportError:
                    missing.add(name)
                    continue
                ceilings.setdefault(name, []).append(rate)
            kw = dict(batch_size=256, shuffle=True, seed=r, num_threads=args.threads)
            results["local directory"].append(epoch(fl.Loader(fl.Dataset.open(local), **kw), 0))
            for client in (c for c in ("obstore", "boto3") if c in ceilings):
                opts = {"endpoint_url": endpoint, "max_concurrency": args.concurrency, "client": client}
                cache = os.path.join(tmp, f"cache{r}")
                ds = fl.Dataset.open(url, storage_options=opts, cache_dir=cache)
                loader = fl.Loader(ds, **kw)
                results.setdefault(f"{client} epoch 1", []).append(epoch(loader, 0))
                results.setdefault(f"{client} epoch 2", []).append(epoch(loader, 1))
                del loader, ds
                _remove(cache)
                small = fl.Dataset.open(url, storage_options=opts, cache_dir=cache, cache_limit=total // 4)
                results.setdefault(f"{client} block 25%", []).append(epoch(fl.Loader(small, order="block", **kw), 0))
                fetched_ratio.setdefault(client, []).append(small.storage_stats().bytes_fetched / total)
                del small
                _remove(cache)
                if args.shard_mb >= 32 and client == "obstore":  # its shards come in parts: the same, whole
                    whole = fl.Dataset.open(url, storage_options={**opts, "part_size": 0}, cache_dir=cache,
                                            cache_limit=total // 4)
                    results.setdefault(f"{client} block 25% whole", []).append(
                        epoch(fl.Loader(whole, order="block", **kw), 0))
                    del whole
                    _remove(cache)
            print(f"round {r + 1}/{args.rounds} done (load {os.getloadavg()[0]:.1f})", flush=True)

        print("\nnetwork ceiling: parallel GETs of every object, MB/s (median of rounds)")
        for name in ceilings:
            print(f"  {name:16s} {_median(ceilings[name]) / 1e6:8.1f}   rounds {[round(r / 1e6) for r in ceilings[name]]}")
        for name in sorted(missing):
            print(f"  {name:16s} not installed")
        print(f"\nfastload, batch 256, {args.threads} threads, shuffled, median of {args.rounds} rounds; x ceiling: the "
              "median (min-max) over rounds of the per-round ratio to the same client's parallel GETs (bytes/s); "
              "epoch 2: to the local directory")
        print(f"  {'run':22s} {'first batch s':>13s} {'samples/s':>10s} {'MB/s':>8s} {'ratio':>26s}")
        for name, runs in results.items():
            first = _median([f for f, _, _ in runs])
            rates = [n / t * (1016 + 8) for _, t, n in runs]
            # Epoch 2 against the local directory (same round), the others against the ceiling.
            local_rates = [n / t * (1016 + 8) for _, t, n in results["local directory"]]
            per_round = local_rates if name.endswith("epoch 2") else ceilings.get(name.split()[0])
            if name.endswith("25% whole"):  # parts against whole objects, same round
                per_round = [n / t * (1016 + 8) for _, t, n in results[name[:-len(" whole")]]]
            ratio = ""
            if per_round and name != "local directory":
                rs = [a / b for a, b in zip(rates, per_round)]
                ratio = f"{_median(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})" + (
                    " local" if name.endswith("epoch 2") else " of parts" if name.endswith("whole") else "")
            print(f"  {name:22s} {first:13.3f} {_median(rates) / 1024:10.0f} {_median(rates) / 1e6:8.1f} {ratio:>26s}")
        for client, ratios in fetched_ratio.items():
            print(f"\n{client}: order='block' with cache_limit 25% of the dataset fetched {_median(ratios):.2f}x "
                  f"({min(ratios):.2f}-{max(ratios):.2f}) the dataset in one epoch (disk use <= cache_limit: "
                  "tests/test_storage.py checks it)")
        print(f"load average now {os.getloadavg()[0]:.1f}")
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
