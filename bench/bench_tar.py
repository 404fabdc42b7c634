"""Tar shards (issue 37): fastload's fl.Tar against webdataset and DALI's webdataset reader, on
shards made here (bench/tar_data.py), locally and from moto's S3 server, in one run.

- Throughput: two sets of 64 MiB shards, small samples (a 1 KiB .npy + a .cls) and photo-like
  ~100 KB JPEGs (+ a .cls, the evaluation transform to 224x224 uint8 on every side). Each loader
  runs one epoch in a process of its own with 2 threads or workers and batch 256; rounds are
  interleaved (the order rotates) and each round's ratio fastload / other is kept: the table gives
  the median and the min-max of those ratios.
    fastload:   fl.Tar + fl.Loader(shuffle=True, num_threads=2); JPEGs by fl.Image(224, crop="center").
    webdataset: WebLoader(WebDataset(urls, shardshuffle=True).decode(...).to_tuple(...).batched(256),
                num_workers=2); JPEGs by PIL (decode, resize the shorter side to 256, center crop).
    dali-cpu:   fn.readers.webdataset(random_shuffle=True) in a CPU pipeline of 2 threads (device_id
                None); JPEGs by fn.decoders.image + fn.resize(resize_shorter=256) + fn.crop; small
                samples as the members' raw bytes (DALI does not parse .npy or .cls).
  local: shards in the page cache; the clock starts when the source is built (fastload's index
  cached, DALI's pipeline built) and covers one epoch (worker and thread start included).
  s3: moto's server on 127.0.0.1, objects in memory: `--moto stock` is `python -m moto.server` as
  the tests run it; `--moto ranges` (the default) is bench/s3_counting_server.py, whose ranged GETs
  read their bytes only, as S3's do (stock moto copies the whole object for each range, which
  charges fastload's ranged parts for moto's copy). The clock covers opening too: fastload
  fetches the shards into an empty cache each round (and indexes them), webdataset streams
  `pipe:curl -s -f <presigned URL>`, DALI reads s3:// URLs only with --dali-s3 (slow against
  moto). "GET ceiling": the same shards fetched whole by 2 boto3 threads, counted in samples.
- First batch after open over --first-shards small shards against a fastload dataset directory of
  the same samples (fl.Dataset.open: the comparable local source, one dataset shard per tar),
  every file evicted from the page cache first (posix_fadvise): the tar index built (an empty
  index cache) and from its cache. The index's cost per GB: the open with an empty index cache
  over the evicted shards (cold), and again with the shards in the page cache (warm).

    python bench/bench_tar.py [--rounds 5] [--shard-mib 64] [--small-shards 2] [--jpeg-shards 2]
        [--first-shards 100] [--data /tmp/tarbench/data] [--dali-python /path/to/venv/bin/python]

Not a timed test: the ratios are this run's, on this machine, at its load.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BATCH = 256
# Why DALI's s3:// rows are left out unless asked for (--dali-s3).
DALI_S3_NOTE = ("left out (--dali-s3 runs it): against moto, a trial with 4 MiB shards read 21 small samples/s "
                "and 9 JPEGs/s through DALI's s3:// paths: over 30 min an epoch at 64 MiB")


# ------------------------------------------------------------------------------ loaders (worker side)
def _fastload(kind, urls, endpoint, cache):
    import fastload as fl

    opts = {"endpoint_url": endpoint} if endpoint else None
    if kind == "small":
        ds = fl.Tar(urls, fields=["npy", "cls"], cache_dir=cache, storage_options=opts)
    else:
        ds = fl.Tar(urls, fields=["jpg", "cls"], decode={"jpg": fl.Image(224, crop="center")}, cache_dir=cache,
                    storage_options=opts)
    loader = fl.Loader(ds, batch_size=BATCH, shuffle=True, seed=0, num_threads=2, device="cpu")
    return lambda: sum(len(b["cls"]) for b in loader)


def _eval_transform(sample):
    import numpy as np
    from PIL import Image

    img, cls = sample
    w, h = img.size
    scale = 256 / min(w, h)
    img = img.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
    w, h = img.size
    left, top = (w - 224) // 2, (h - 224) // 2
    return np.asarray(img.crop((left, top, left + 224, top + 224))), cls


def _webdataset(kind, urls, endpoint, cache):
    import warnings

    import webdataset as wds

    warnings.simplefilter("ignore")
    if endpoint:
        sys.path.insert(0, str(HERE))
        from tar_data import presigned

        urls = [f"pipe:curl -s -f '{presigned(endpoint, u)}'" for u in urls]
    ds = wds.WebDataset(urls, shardshuffle=True, empty_check=False)
    if kind == "small":
        ds = ds.decode().to_tuple("npy", "cls")
    else:
        ds = ds.decode("pil").to_tuple("jpg", "cls").map(_eval_transform)
    loader = wds.WebLoader(ds.batched(BATCH), batch_size=None, num_workers=2)
    return lambda: sum(len(b[1]) for b in loader)


def _dali(kind, urls, endpoint, cache):
    from nvidia.dali import fn, pipeline_def, types

    if endpoint:
        os.environ["AWS_ENDPOINT_URL"] = endpoint
    exts = ["npy", "cls"] if kind == "small" else ["jpg", "cls"]

    @pipeline_def(batch_size=BATCH, num_threads=2, device_id=None)
    def pipe():
        a, cls = fn.readers.webdataset(paths=urls, ext=exts, random_shuffle=True, name="r")
        if kind == "jpeg":
            a = fn.decoders.image(a, device="cpu", output_type=types.RGB)
            a = fn.resize(a, resize_shorter=256)
            a = fn.crop(a, crop=(224, 224))
        return a, cls
    p = pipe()
    p.build()
    size = p.epoch_size("r")

    def epoch():
        n = 0
        while n < size:
            n += len(p.run()[1])
        return n
    return epoch


def _get_ceiling(urls, endpoint):
    """Seconds to GET the shards whole, 2 at a time (boto3, bodies read and dropped): the
    server's ceiling for the s3 rows."""
    from concurrent.futures import ThreadPoolExecutor

    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)

    def get(url):
        bucket, key = url[len("s3://"):].split("/", 1)
        body, n = s3.get_object(Bucket=bucket, Key=key)["Body"], 0
        while chunk := body.read(1 << 20):
            n += len(chunk)
        return n
    t0 = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        n = sum(pool.map(get, urls))
    return n, time.perf_counter() - t0


def _first_batch(what, paths, index_cache):
    """(seconds to open, seconds from open to the first batch)."""
    import fastload as fl

    t0 = time.perf_counter()
    ds = fl.Dataset.open(paths[0]) if what == "dir" else fl.Tar(paths, fields=["npy", "cls"], cache_dir=index_cache)
    t1 = time.perf_counter()
    if what == "index-warm":
        return t1 - t0, 0.0
    with fl.Loader(ds, batch_size=BATCH, shuffle=True, seed=0, num_threads=2, device="cpu") as loader:
        next(iter(loader))
    return t1 - t0, time.perf_counter() - t1


def worker(a) -> None:
    spec = json.loads(a.worker)
    if spec["loader"] == "first":
        opened, first = _first_batch(spec["what"], spec["urls"], spec["cache"])
        print(json.dumps({"open": opened, "first": first}), flush=True)
        return
    if spec["loader"] == "get-ceiling":
        n, seconds = _get_ceiling(spec["urls"], spec["endpoint"])
        print(json.dumps({"samples": spec["samples"], "seconds": seconds, "bytes": n}), flush=True)
        return
    make = {"fastload": _fastload, "webdataset": _webdataset, "dali-cpu": _dali}[spec["loader"]]
    remote = spec["endpoint"] is not None
    __import__({"fastload": "fastload", "webdataset": "webdataset", "dali-cpu": "nvidia.dali"}[spec["loader"]])
    t0 = time.perf_counter()  # the module imported: its import is no loader's cost
    epoch = make(spec["kind"], spec["urls"], spec["endpoint"], spec["cache"])
    if not remote:
        t0 = time.perf_counter()  # local: the source built, not timed
    n = epoch()
    print(json.dumps({"samples": n, "seconds": time.perf_counter() - t0}), flush=True)


# ------------------------------------------------------------------------------ orchestrator
def run_child(python: str, spec: dict, timeout: float = 900) -> tuple[dict | None, str | None]:
    cmd = [python, str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        return None, lines[-1] if lines else f"exit status {p.returncode}"
    return json.loads(p.stdout.strip().splitlines()[-1]), None


def evict(paths) -> None:
    from page_cache import evict as evict_file

    for p in paths:
        if os.path.isdir(p):
            for d, _, files in os.walk(p):
                for f in files:
                    evict_file(Path(d) / f)
        else:
            evict_file(Path(p))


def throughput(a, kinds, sets, endpoint, s3_urls, scratch, counts) -> dict:
    results = {}
    for kind, paths in sets.items():
        for source in (["local"] + (["s3"] if endpoint else [])):
            urls = paths if source == "local" else s3_urls[kind]
            here = kinds + ([("get-ceiling", sys.executable)] if source == "s3" else [])
            rows: dict[str, list[float]] = {k: [] for k, _ in here}
            notes: dict[str, str] = {}
            if source == "s3" and not a.dali_s3 and any(k == "dali-cpu" for k, _ in kinds):
                notes["dali-cpu"] = DALI_S3_NOTE
            index_cache = str(scratch / f"index-{kind}")
            for r in range(a.rounds):
                order = here[r % len(here):] + here[:r % len(here)]
                for name, python in order:
                    if name in notes:
                        continue  # failed before: not retried every round
                    cache = index_cache if source == "local" else str(scratch / f"cache-{kind}-{r}-{name}")
                    spec = {"loader": name, "kind": kind, "urls": urls, "cache": cache, "samples": counts[kind],
                            "endpoint": endpoint if source == "s3" else None}
                    res, err = run_child(python, spec)
                    shutil.rmtree(scratch / f"cache-{kind}-{r}-{name}", ignore_errors=True)
                    if res is None:
                        notes[name] = err
                        print(f"  {kind}/{source}: {name} did not run: {err}", flush=True)
                        continue
                    rows[name].append(res["samples"] / res["seconds"])
                    rows.setdefault(name + ":samples", []).append(res["samples"])
                print(f"  {kind}/{source} round {r + 1}: " + ", ".join(
                    f"{k} {v[-1]:,.0f}/s" for k, v in rows.items() if ":" not in k and len(v) == r + 1), flush=True)
            results[f"{kind}/{source}"] = {"rows": rows, "notes": notes}
    return results


def first_batches(a, paths, directory, scratch) -> dict:
    """Interleaved rounds: the dataset directory, the tar with an empty index cache, the tar with
    its index cached, every file evicted before each; then the index built over cached pages."""
    cached = str(scratch / "first-index-cached")
    out: dict[str, list[dict]] = {"dir": [], "tar-cold-index": [], "tar-cached-index": [], "index-warm": []}
    run_child(sys.executable, {"loader": "first", "what": "tar", "urls": paths, "cache": cached})  # fills it
    for r in range(a.first_rounds):
        order = ["dir", "tar-cold-index", "tar-cached-index"]
        order = order[r % 3:] + order[:r % 3]
        for what in order:
            cold = str(scratch / "first-index-cold")
            shutil.rmtree(cold, ignore_errors=True)
            evict(paths + [directory])
            spec = {"loader": "first", "what": "dir" if what == "dir" else "tar",
                    "urls": [directory] if what == "dir" else paths,
                    "cache": cold if what == "tar-cold-index" else cached}
            res, err = run_child(sys.executable, spec)
            if res is None:
                raise RuntimeError(f"first batch ({what}) failed: {err}")
            out[what].append(res)
        shutil.rmtree(scratch / "first-index-cold", ignore_errors=True)
        res, err = run_child(sys.executable, {"loader": "first", "what": "index-warm", "urls": paths,
                                              "cache": str(scratch / "first-index-warm")})
        shutil.rmtree(scratch / "first-index-warm", ignore_errors=True)
        if res is not None:
            out["index-warm"].append(res)
        print(f"  first batch round {r + 1}: " + ", ".join(
            f"{k} {v[-1]['open'] + v[-1]['first']:.2f} s" for k, v in out.items() if len(v) == r + 1), flush=True)
    return out


def _med(xs):
    return statistics.median(xs)


def print_tables(a, results, first, size, counts) -> None:
    print(f"\nThroughput (samples/s, median of {a.rounds} interleaved rounds; ratio = fastload / row, median "
          "(min-max) of the per-round ratios)")
    print("| set | source | loader | samples/epoch | samples/s | fastload / loader |")
    print("| --- | --- | --- | --- | --- | --- |")
    for key, res in results.items():
        kind, source = key.split("/")
        rows, notes = res["rows"], res["notes"]
        fast = rows["fastload"]
        for name in [k for k in rows if ":" not in k]:
            v = rows[name]
            if not v:
                print(f"| {kind} | {source} | {name} | | did not run: {notes.get(name, '')[:200]} | |")
                continue
            ratios = [f / x for f, x in zip(fast, v)]
            ratio = "1" if name == "fastload" else f"{_med(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
            n = rows[name + ":samples"][-1]
            label = "GET ceiling: the shards' bytes by 2 boto3 GETs" if name == "get-ceiling" else name
            print(f"| {kind} | {source} | {label} | {n:,} | {_med(v):,.0f} | {ratio} |")
    if first:
        gb = size / 1e9
        print(f"\nFirst batch after open, {a.first_shards} small shards ({gb:.2f} GB, {counts:,} samples), batch "
              f"{BATCH} shuffled, files evicted from the page cache first; median (min-max) of "
              f"{a.first_rounds} interleaved rounds, seconds")
        print("| source | open | open to first batch | total | total - directory's |")
        print("| --- | --- | --- | --- | --- |")
        base = [x["open"] + x["first"] for x in first["dir"]]
        names = {"dir": "fl.Dataset.open(dataset directory of the same samples)",
                 "tar-cold-index": "fl.Tar, index built (empty index cache)",
                 "tar-cached-index": "fl.Tar, index from its cache"}
        for what, label in names.items():
            v = first[what]
            tot = [x["open"] + x["first"] for x in v]
            diff = [t - b for t, b in zip(tot, base)]
            print(f"| {label} | {_med([x['open'] for x in v]):.3f} | {_med([x['first'] for x in v]):.3f} | "
                  f"{_med(tot):.3f} ({min(tot):.3f}-{max(tot):.3f}) | {_med(diff):+.3f} ({min(diff):+.3f}-"
                  f"{max(diff):+.3f}) |")
        cold = [x["open"] for x in first["tar-cold-index"]]
        warm = [x["open"] for x in first["index-warm"]]
        print(f"\nIndex cost: {_med(cold) / gb:.2f} s/GB ({min(cold) / gb:.2f}-{max(cold) / gb:.2f}) with the shards "
              f"evicted (read from disk)" + (f", {_med(warm) / gb:.2f} s/GB ({min(warm) / gb:.2f}-"
                                             f"{max(warm) / gb:.2f}) with them in the page cache" if warm else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--first-rounds", type=int, default=3)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument("--small-shards", type=int, default=2, help="shards per epoch in the throughput runs")
    ap.add_argument("--jpeg-shards", type=int, default=2)
    ap.add_argument("--first-shards", type=int, default=100, help="0: no first-batch measurement")
    ap.add_argument("--data", default="/tmp/tarbench/data", help="the shards, made once and kept")
    ap.add_argument("--dali-python", default=os.environ.get("FASTLOAD_BENCH_DALI_PYTHON"),
                    help="a python with nvidia-dali (its CPU pipeline runs without a GPU)")
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--moto", choices=["stock", "ranges"], default="ranges",
                    help="stock: python -m moto.server; ranges: ranged GETs read their bytes only (as S3)")
    ap.add_argument("--dali-s3", action="store_true", help="also DALI reading s3:// URLs (slow against moto)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    sys.path.insert(0, str(HERE))
    import tar_data

    data = Path(a.data)
    first_n = max(a.first_shards, a.small_shards)
    small_all = tar_data.make_small(data, first_n, a.shard_mib)
    sets = {"small": small_all[:a.small_shards], "jpeg": tar_data.make_jpegs(data, a.jpeg_shards, a.shard_mib)}
    directory = tar_data.make_small_dataset(data, a.first_shards, a.shard_mib) if a.first_shards else None
    kinds = [("fastload", sys.executable), ("webdataset", sys.executable)]
    if a.dali_python:
        kinds.append(("dali-cpu", a.dali_python))
    scratch = Path(tempfile.mkdtemp(prefix="bench_tar_", dir=data))
    server = None
    try:
        endpoint, s3_urls = None, {}
        if not a.no_s3:
            server, endpoint = tar_data.start_moto(ranges=a.moto == "ranges")
            os.environ.update(tar_data.CREDENTIALS)
            s3_urls = {k: tar_data.upload(endpoint, "bench-tar", v) for k, v in sets.items()}
        for k, v in sets.items():
            print(f"{k}: {len(v)} shards, {sum(os.path.getsize(p) for p in v) / 2**20:.0f} MiB", flush=True)
        print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()}; 2 threads / 2 workers; batch {BATCH}; "
              f"S3: {'no' if a.no_s3 else a.moto + ' moto'}", flush=True)
        counts = {k: tar_data.count_samples(v) for k, v in sets.items()}
        results = throughput(a, kinds, sets, endpoint, s3_urls, scratch, counts)
        first = first_batches(a, small_all[:a.first_shards], directory, scratch) if a.first_shards else None
        size = sum(os.path.getsize(p) for p in small_all[:a.first_shards])
        print(f"load average at the end {os.getloadavg()}")
        print_tables(a, results, first, size, a.first_shards * tar_data.samples_per_small_shard(a.shard_mib))
        if a.json:
            Path(a.json).write_text(json.dumps({"throughput": results, "first": first}, indent=1))
    finally:
        if server is not None:
            server.kill()
            server.wait()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
