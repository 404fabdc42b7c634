"""fastload beside MosaicML Streaming and litdata on one S3 server, the same data, the same cache
limit (issue 24's side-by-side; run through `python bench/bench_remote.py --peers`).

Data, written once per run in each loader's own format and uploaded to moto's server on 127.0.0.1
(bench/s3_counting_server.py, in its own process, counting what it serves):
  - rows: 1 KiB rows (x: 1016 uint8, y: int64) in shards of --shard-mb (64 MiB):
    a fastload dataset directory, MDS shards (size_limit = the shard size), litdata chunks
    (chunk_bytes = the shard size);
  - tokens: uint16 tokens in files of --shard-mb, read as windows of 2049 tokens (stride 2048):
    fastload Windows.from_files over the raw files, MDS samples of one window each, litdata
    chunks read with its TokensLoader(block_size=2049) (its windows do not overlap: stride 2049;
    one token file is one item, so one chunk, and litdata warns that the item is larger than
    chunk_bytes).
litdata's max_pre_download is 1 (--litdata-pre-download; its default 2 hangs on a 25% cache).
Each loader reads with 2 threads or 2 DataLoader workers, batch 256, shuffled (fastload
order="block", the peers' default shard-aware shuffles), a cache of 25% of the dataset, two
epochs, in a child process of its own (a peer that hangs or fails is a row saying why). Every round
runs every loader, in an order that rotates round to round, and the network ceiling: parallel GETs
of fastload's objects with obstore and with boto3 (16 in flight), bytes/s. Figures are medians over
rounds of each round's figure (a ratio is taken within its round), with the min-max.

Reported per loader: time to first batch (from building the dataset), epoch 1 and epoch 2
samples/s, epoch 1 against the round's best ceiling (payload bytes/s over object bytes/s), bytes the
server sent per byte of samples the loader yielded (each epoch), and the most disk its cache
held against the limit (sampled every 50 ms). "fastload, local directory" reads fastload's
directory from local disk, no cache: epoch 2 of a remote source is held against it.
"""
from __future__ import annotations

import argparse
import functools
import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.request
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BUCKET = "bench-remote"
ROW_X = 1016  # x bytes; with y's 8, a row is 1 KiB
ROW_BYTES = ROW_X + 8
WINDOW, STRIDE = 2049, 2048
VOCAB = 50257
LOADERS = ("fastload", "streaming", "litdata", "fastload-local")
SHAPES = ("rows", "tokens")
INSTALL_HINT = "pip install -r bench/requirements-peers.txt (see that file)"


# ---------------------------------------------------------------- the data, the same in every format
def row_chunk(i: int, rows_per_shard: int, total_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows [i * rows_per_shard, ...) of the rows dataset: the same bytes for every format."""
    lo = i * rows_per_shard
    n = min(rows_per_shard, total_rows - lo)
    x = np.random.default_rng(i).integers(0, 256, (n, ROW_X), dtype=np.uint8)
    return x, np.arange(lo, lo + n, dtype=np.int64)


def token_file(i: int, tokens_per_file: int) -> np.ndarray:
    return np.random.default_rng(1_000_000 + i).integers(0, VOCAB, tokens_per_file, dtype=np.uint16)


def import_streaming():
    """Imports MosaicML Streaming. Its package imports its vision datasets, which import torchvision;
    PyPI's torchvision is built for torch's CUDA wheels, and beside a CPU torch its operator library
    does not load, so the import fails. MDS reading never touches torchvision: then the two names
    Streaming's vision module takes from it are given as stand-ins."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, RuntimeError, OSError):
        import importlib.machinery
        import types

        import torch.utils.data

        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]

        def unavailable(*args, **kwargs):
            raise RuntimeError("torchvision is not usable beside this torch (bench/remote_peers.py)")
        mods = {n: types.ModuleType(n) for n in ("torchvision", "torchvision.datasets", "torchvision.transforms",
                                                 "torchvision.transforms.functional")}
        for n, m in mods.items():
            m.__spec__ = importlib.machinery.ModuleSpec(n, None)  # transformers asks for it
        mods["torchvision.datasets"].VisionDataset = type("VisionDataset", (torch.utils.data.Dataset,), {})
        mods["torchvision.datasets"].CIFAR10 = unavailable
        mods["torchvision.transforms.functional"].to_tensor = unavailable
        mods["torchvision"].datasets = mods["torchvision.datasets"]
        mods["torchvision"].transforms = mods["torchvision.transforms"]
        mods["torchvision.transforms"].functional = mods["torchvision.transforms.functional"]
        sys.modules.update(mods)
    import streaming

    return streaming


def _litdata_rows(i: int, rows_per_shard: int, total_rows: int):
    x, y = row_chunk(i, rows_per_shard, total_rows)
    for j in range(len(y)):
        yield {"x": x[j], "y": int(y[j])}


def _litdata_tokens(i: int, tokens_per_file: int):
    import torch

    yield torch.from_numpy(token_file(i, tokens_per_file))


def write_formats(shape: str, root: Path, gb: float, shard_mb: int) -> dict:
    """Writes the shape's data as fastload, MDS and litdata directories under root; returns the
    workload's description (sizes, samples, where each format is)."""
    shard_bytes = shard_mb << 20
    out = {"shape": shape, "dirs": {}}
    if shape == "rows":
        per = shard_bytes // ROW_BYTES
        total = max(per, int(gb * 1e9) // ROW_BYTES)
        shards = -(-total // per)
        out.update(samples=total, sample_bytes=ROW_BYTES, samples_per_shard=per)
        import fastload as fl

        d = root / "fastload-rows"
        with fl.DatasetWriter(d, rows_per_shard=per, fsync=False) as w:
            for i in range(shards):
                x, y = row_chunk(i, per, total)
                w.append({"x": x, "y": y})
        out["dirs"]["fastload"] = d
        try:
            MDSWriter = import_streaming().MDSWriter
            d = root / "mds-rows"
            with MDSWriter(out=str(d), columns={"x": f"ndarray:uint8:{ROW_X}", "y": "int64"},
                           size_limit=shard_bytes, progress_bar=False) as w:
                for i in range(shards):
                    x, y = row_chunk(i, per, total)
                    for j in range(len(y)):
                        w.write({"x": x[j], "y": int(y[j])})
            out["dirs"]["streaming"] = d
        except ImportError:
            pass
        try:
            import litdata as ld

            d = root / "litdata-rows"
            ld.optimize(fn=functools.partial(_litdata_rows, rows_per_shard=per, total_rows=total),
                        inputs=list(range(shards)), output_dir=str(d), chunk_bytes=shard_bytes, num_workers=1,
                        mode="overwrite", verbose=False)
            out["dirs"]["litdata"] = d
        except ImportError:
            pass
    else:
        per = shard_bytes // 2
        files = max(1, -(-int(gb * 1e9) // shard_bytes))
        windows_per_file = (per - WINDOW) // STRIDE + 1
        out.update(samples=files * windows_per_file, sample_bytes=WINDOW * 2, samples_per_shard=windows_per_file)
        d = root / "fastload-tokens"
        d.mkdir()
        for i in range(files):
            token_file(i, per).tofile(d / f"tokens-{i:05d}.bin")
        out["dirs"]["fastload"] = d
        try:
            MDSWriter = import_streaming().MDSWriter
            d = root / "mds-tokens"
            with MDSWriter(out=str(d), columns={"tokens": f"ndarray:uint16:{WINDOW}"}, size_limit=shard_bytes,
                           progress_bar=False) as w:
                for i in range(files):
                    t = token_file(i, per)
                    for s in range(windows_per_file):
                        w.write({"tokens": t[s * STRIDE:s * STRIDE + WINDOW]})
            out["dirs"]["streaming"] = d
        except ImportError:
            pass
        try:
            import litdata as ld
            from litdata.streaming.item_loader import TokensLoader

            d = root / "litdata-tokens"
            ld.optimize(fn=functools.partial(_litdata_tokens, tokens_per_file=per), inputs=list(range(files)),
                        output_dir=str(d), chunk_bytes=shard_bytes, item_loader=TokensLoader(), num_workers=1,
                        mode="overwrite", verbose=False)
            out["dirs"]["litdata"] = d
        except ImportError:
            pass
    return out


def upload(client, local: Path, prefix: str) -> int:
    """Puts every file under local at BUCKET/prefix/...; returns the bytes put."""
    total = 0
    for p in sorted(local.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                client.put_object(Bucket=BUCKET, Key=f"{prefix}/{p.relative_to(local).as_posix()}", Body=f)
            total += p.stat().st_size
    return total


# ---------------------------------------------------------------- the server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command=None) -> tuple[subprocess.Popen, str]:
    """A local S3 server on a free port: the counting one, or the one `command(port)` starts."""
    port = free_port()
    argv = command(port) if command else [sys.executable, str(HERE / "s3_counting_server.py"), str(port)]
    # moto keeps an object of over 8 MB in a temporary file unless told otherwise: at 2 GB a format
    # that fills a small disk (and reads slower than the memory a real store's cache would serve).
    env = dict(os.environ)
    env.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(256 << 20))
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(300):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the moto server did not start")


def server_counts(endpoint: str) -> dict:
    with urllib.request.urlopen(f"{endpoint}/_bench/counts", timeout=30) as r:
        return json.load(r)


# ---------------------------------------------------------------- one loader, in a child process
class DiskWatch:
    """The most bytes of files under a folder, sampled every 50 ms by a thread; it also ends the
    process (a JSON error on stdout) when the server has sent more than max_fetch bytes since it
    started: a loader that re-downloads without end is a finding, not a reason to wait."""

    def __init__(self, path: str, endpoint: str, max_fetch: int):
        self.path, self.peak, self._stop = path, 0, threading.Event()
        self.endpoint, self.max_fetch = endpoint, max_fetch
        self._start = server_counts(endpoint)["get_bytes"]
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _size(self) -> int:
        n = 0
        for d, _, files in os.walk(self.path):
            for f in files:
                try:
                    n += os.stat(os.path.join(d, f)).st_size
                except OSError:
                    pass  # removed while we looked
        return n

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._size())
            i += 1
            if i % 20 == 0:
                fetched = server_counts(self.endpoint)["get_bytes"] - self._start
                if fetched > self.max_fetch:
                    print(json.dumps({"error": f"stopped: fetched {fetched / 1e9:.1f} GB, more than "
                                               f"{self.max_fetch / 1e9:.1f} GB (8x the dataset an epoch), "
                                               f"disk peak {self.peak / 1e6:.0f} MB"}), flush=True)
                    os._exit(3)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, self._size())


def _fastload(spec: dict, seed: int):
    import fastload as fl

    kw = dict(batch_size=spec["batch"], shuffle=True, seed=seed, num_threads=spec["workers"], order="block")
    if spec["loader"] == "fastload-local":
        local = spec["local"]
        src = fl.Dataset.open(local) if spec["shape"] == "rows" else fl.Windows.from_files(
            sorted(str(p) for p in Path(local).iterdir()), dtype="uint16", length=WINDOW, stride=STRIDE)
    else:
        remote = dict(storage_options={"endpoint_url": spec["endpoint"]}, cache_dir=spec["cache"],
                      cache_limit=spec["cache_limit"])
        src = fl.Dataset.open(spec["url"], **remote) if spec["shape"] == "rows" else fl.Windows.from_files(
            spec["url"] + "/", dtype="uint16", length=WINDOW, stride=STRIDE, **remote)
    loader = fl.Loader(src, **kw)

    def epoch(e: int):
        loader.set_epoch(e)
        return iter(loader)
    return epoch


def _streaming(spec: dict, seed: int):
    streaming = import_streaming()
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()  # a killed earlier child may have left its segments
    os.environ["S3_ENDPOINT_URL"] = spec["endpoint"]  # Streaming's setting for S3-compatible servers
    # py1e (the default) moves each sample within a window of shuffle_block_size samples; its
    # default (262,144) spans 4 of the 64 MiB shards of 1 KiB rows, 16 of token windows, all
    # of a small run's shards, and a window wider than a 25% cache re-downloads shards without end
    # (measured). Windows of 2 shards leave room in the cache for its predownload.
    ds = streaming.StreamingDataset(remote=spec["url"], local=spec["cache"], shuffle=True, shuffle_seed=seed,
                                    shuffle_block_size=2 * spec["samples_per_shard"], batch_size=spec["batch"],
                                    cache_limit=spec["cache_limit"])
    dl = streaming.StreamingDataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"])
    return lambda e: iter(dl)  # Streaming advances its epoch itself


def _litdata(spec: dict, seed: int):
    import litdata as ld
    from litdata.streaming.item_loader import TokensLoader
    from litdata.streaming.resolver import Dir

    os.environ.setdefault("DISABLE_S5CMD", "1")  # s5cmd is not installed; say so rather than probe
    # litdata GETs chunks with obstore (its fast path), building the S3Store from its boto3 client's
    # endpoint with fixed client options that do not allow http://, which real S3 never needs but
    # the loopback server does: add allow_http to them (the workers fork after this, and keep it).
    from litdata.streaming import downloader

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}
    ds = ld.StreamingDataset(input_dir=Dir(path=spec["cache"], url=spec["url"]),
                             storage_options={"endpoint_url": spec["endpoint"]}, shuffle=True, seed=seed,
                             max_cache_size=spec["cache_limit"], max_pre_download=spec.get("litdata_pre", 2),
                             item_loader=TokensLoader(block_size=WINDOW) if spec["shape"] == "tokens" else None)
    dl = ld.StreamingDataLoader(ds, batch_size=spec["batch"], num_workers=spec["workers"])
    return lambda e: iter(dl)  # the StreamingDataLoader counts its epochs itself


OPENERS = {"fastload": _fastload, "fastload-local": _fastload, "streaming": _streaming, "litdata": _litdata}
# Imported before the clock starts: the first batch is timed from building the dataset, not from
# importing torch, transformers (Streaming's) or lightning's packages.
IMPORTS = {"fastload": lambda: __import__("fastload"), "fastload-local": lambda: __import__("fastload"),
           "streaming": import_streaming, "litdata": lambda: __import__("litdata.streaming.item_loader")}


def _batch_len(b) -> int:
    if isinstance(b, dict):
        b = next(iter(b.values()))
    return len(b)


def child(spec: dict) -> dict:
    """Two epochs of one loader; what it measured, as JSON-able figures."""
    os.makedirs(spec["cache"], exist_ok=True)
    IMPORTS[spec["loader"]]()
    endpoint = spec["endpoint"]
    watch = DiskWatch(spec["cache"], endpoint, 8 * spec["epochs"] * spec["stored_bytes"])
    before = server_counts(endpoint)
    t0 = time.perf_counter()
    epoch_iter = OPENERS[spec["loader"]](spec, spec["seed"])
    first = None
    epochs = []
    for e in range(spec["epochs"]):
        t = t0 if e == 0 else time.perf_counter()
        n = 0
        for b in epoch_iter(e):
            if first is None:
                first = time.perf_counter() - t0
            n += _batch_len(b)
        seconds = time.perf_counter() - t
        after = server_counts(endpoint)
        epochs.append({"seconds": seconds, "samples": n, "gets": after["gets"] - before["gets"],
                       "get_bytes": after["get_bytes"] - before["get_bytes"]})
        before = after
    return {"first_batch_s": first or 0.0, "epochs": epochs, "peak_disk": watch.stop()}


# ---------------------------------------------------------------- the rounds
def ceiling(client: str, endpoint: str, keys: list[str], concurrency: int) -> float:
    """Object bytes/s of parallel GETs of keys with one client (bench_remote.py's ceilings)."""
    sys.path.insert(0, str(HERE))
    import s3_ceiling

    return {"obstore": s3_ceiling.ceiling_obstore, "boto3": s3_ceiling.ceiling_boto3}[client](
        endpoint, keys, concurrency)


def run_child(spec: dict, timeout: float) -> dict:
    """Runs one loader in a child of its own; {"error": why} when it cannot."""
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = None, ""
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # DataLoader workers left behind by a child that failed
    except ProcessLookupError:
        pass
    if out is None:
        proc.communicate()
        return {"error": f"no result after {timeout:.0f} s (killed)"}
    last = out.strip().splitlines()[-1] if out.strip() else ""
    if last.startswith('{"error"'):
        return json.loads(last)
    if proc.returncode != 0 or not out.strip():
        if os.environ.get("BENCH_PEERS_STDERR"):  # a folder to keep failed children's stderr in
            Path(os.environ["BENCH_PEERS_STDERR"], f"{spec['loader']}-{spec['shape']}-{spec['seed']}.log").write_text(err)
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        raised = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", ln)]
        why = (raised or lines or [f"exit status {proc.returncode}"])[-1]
        if "ModuleNotFoundError" in why:
            why = f"not installed ({why.split(':', 1)[-1].strip()}): {INSTALL_HINT}"
        return {"error": why[:300]}
    return json.loads(out.strip().splitlines()[-1])


def loader_available(loader: str) -> str | None:
    module = {"streaming": "streaming", "litdata": "litdata"}.get(loader)
    if module is None:
        return None
    import importlib.util

    return None if importlib.util.find_spec(module) else f"not installed: {INSTALL_HINT}"


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    if not xs:
        return "n/a"
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main(args: argparse.Namespace) -> None:
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import boto3

    shapes = args.shape or list(SHAPES)
    loaders = args.loader or list(LOADERS)
    tmp = Path(tempfile.mkdtemp(prefix="bench_remote_peers_"))
    proc, endpoint = start_server()
    versions = []
    for dist in ("fastload", "torch", "mosaicml-streaming", "litdata", "moto", "obstore", "boto3"):
        try:
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist} not installed")
    print(f"# bench_remote --peers: {args.gb:g} GB per shape in {args.shard_mb} MiB shards, {args.rounds} round(s), "
          f"{args.threads} threads/workers, batch {args.batch}, cache {args.cache_share:.0%} of the dataset; moto on {endpoint}; "
          f"load average at start {loadavg()} on {os.cpu_count()} CPUs\n# {', '.join(versions)}", flush=True)
    try:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket=BUCKET)
        workloads = []
        for shape in shapes:
            t = time.perf_counter()
            w = write_formats(shape, tmp, args.gb, args.shard_mb)
            w["urls"], w["stored"] = {}, {}
            for fmt, d in w["dirs"].items():
                w["stored"][fmt] = upload(client, d, f"{fmt}-{shape}")
                w["urls"][fmt] = f"s3://{BUCKET}/{fmt}-{shape}"
                if fmt != "fastload":
                    shutil.rmtree(d)  # only fastload's local copy is read again (the local row)
            keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(
                Bucket=BUCKET, Prefix=f"fastload-{shape}/") for o in page.get("Contents", [])
                if not o["Key"].endswith(".json")]
            w["keys"] = keys
            w["dataset_bytes"] = w["samples"] * w["sample_bytes"]
            w["cache_limit"] = int(w["stored"]["fastload"] * args.cache_share)
            print(f"{shape}: {w['samples']} samples of {w['sample_bytes']} B, {len(keys)} objects; stored bytes "
                  + ", ".join(f"{k} {v / 1e6:.0f} MB" for k, v in w["stored"].items())
                  + f"; cache_limit {w['cache_limit'] / 1e6:.0f} MB; written and uploaded in "
                  f"{time.perf_counter() - t:.0f} s", flush=True)
            workloads.append(w)

        results: dict = {}  # shape -> loader -> list of per-round dicts
        ceilings: dict = {}  # shape -> client -> round -> bytes/s
        for r in range(args.rounds):
            for w in workloads:
                shape = w["shape"]
                jobs = ["ceiling"] + loaders
                jobs = jobs[r % len(jobs):] + jobs[:r % len(jobs)]
                for job in jobs:
                    if job == "ceiling":
                        for c in ("obstore", "boto3"):
                            try:
                                rate = ceiling(c, endpoint, w["keys"], args.concurrency)
                            except ImportError:
                                continue
                            ceilings.setdefault(shape, {}).setdefault(c, {})[r] = rate
                        continue
                    fmt = "fastload" if job.startswith("fastload") else job
                    why = loader_available(job) or (None if fmt in w["urls"] else "its data was not written")
                    if why:
                        got = {"error": why}
                    else:
                        cache = tmp / f"cache-{job}-{shape}-{r}"
                        spec = {"loader": job, "shape": shape, "endpoint": endpoint, "url": w["urls"][fmt],
                                "local": str(w["dirs"]["fastload"]), "cache": str(cache),
                                "stored_bytes": w["stored"][fmt], "samples_per_shard": w["samples_per_shard"],
                                "cache_limit": w["cache_limit"], "seed": r, "batch": args.batch,
                                "workers": args.threads, "epochs": 2, "litdata_pre": args.litdata_pre_download}
                        got = run_child(spec, args.timeout)
                        shutil.rmtree(cache, ignore_errors=True)
                    got["round"] = r
                    results.setdefault(shape, {}).setdefault(job, []).append(got)
                    print(f"  round {r + 1} {shape} {job}: " + _round_line(got, w) + f"  [load {loadavg()}]",
                          flush=True)
        print(f"\nload average at the end: {loadavg()}")
        for w in workloads:
            _table(w, results.get(w["shape"], {}), ceilings.get(w["shape"], {}), args)
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _round_line(got: dict, w: dict) -> str:
    if "error" in got:
        return f"FAILED: {got['error']}"
    return f"first batch {got['first_batch_s']:.2f} s; " + "; ".join(
        f"epoch {i + 1} {e['samples'] / e['seconds']:,.0f} samples/s, {e['gets']} GETs "
        f"{e['get_bytes'] / 1e6:.0f} MB" for i, e in enumerate(got["epochs"])) + \
        f"; disk peak {got['peak_disk'] / 1e6:.0f} MB (limit {w['cache_limit'] / 1e6:.0f} MB)"


# What each loader GETs its shards with: Streaming boto3's download_file, litdata 0.2.76 obstore
# (ranged GETs in parallel; its index.json by boto3).
CLIENTS = {"fastload": "obstore", "streaming": "boto3", "litdata": "obstore", "fastload-local": "local disk"}


def _table(w: dict, per_loader: dict, ceil: dict, args: argparse.Namespace) -> None:
    shape = w["shape"]
    print(f"\n{shape}: {w['samples']} samples of {w['sample_bytes']} B ({w['dataset_bytes'] / 1e9:.2f} GB), "
          f"{args.shard_mb} MiB shards, cache_limit {w['cache_limit'] / 1e6:.0f} MB ({args.cache_share:.0%}); medians of "
          f"{args.rounds} round(s), (min–max)\n")
    for c, rates in ceil.items():
        print(f"network ceiling, {c}: {spread([x / 1e6 for x in rates.values()], '{:.0f}')} MB/s (parallel GETs of "
              f"fastload's {len(w['keys'])} objects, {args.concurrency} in flight)")
    best = {}  # round -> the best client's ceiling that round
    for rates in ceil.values():
        for r, x in rates.items():
            best[r] = max(best.get(r, 0.0), x)
    print("\n| loader | client | first batch s | epoch 1 samples/s | epoch 1 MB/s x ceiling | epoch 2 samples/s | "
          "fetched / used, epoch 1 | epoch 2 | disk peak / cache_limit |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for loader, rounds in per_loader.items():
        ok = [g for g in rounds if "error" not in g]
        failed = [g for g in rounds if "error" in g]
        if not ok:
            print(f"| {loader} | | {failed[0]['error'][:200]} | | | | | | |")
            continue
        e1 = [g["epochs"][0]["samples"] / g["epochs"][0]["seconds"] for g in ok]
        e2 = [g["epochs"][1]["samples"] / g["epochs"][1]["seconds"] for g in ok]
        x_ceil = [g["epochs"][0]["samples"] * w["sample_bytes"] / g["epochs"][0]["seconds"] / best[g["round"]]
                  for g in ok if best.get(g["round"])]
        fetched = [[g["epochs"][i]["get_bytes"] / (g["epochs"][i]["samples"] * w["sample_bytes"]) for g in ok]
                   for i in (0, 1)]
        disk = [g["peak_disk"] / w["cache_limit"] for g in ok]
        remote = loader != "fastload-local"
        note = f" ({len(failed)} round(s) failed: {failed[0]['error'][:100]})" if failed else ""
        print(f"| {loader}{note} | {CLIENTS[loader]} | {spread([g['first_batch_s'] for g in ok], '{:.2f}')} | "
              f"{spread(e1, '{:,.0f}')} | {spread(x_ceil) if remote else ''} | {spread(e2, '{:,.0f}')} | "
              f"{spread(fetched[0]) if remote else ''} | {spread(fetched[1]) if remote else ''} | "
              f"{spread(disk) if remote else ''} |")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--gb", type=float, default=2.0, help="GB of data per shape (the issue's 2; 0.25 for a quick run)")
    ap.add_argument("--shape", action="append", choices=SHAPES, help="rows or tokens (repeatable; default both)")
    ap.add_argument("--loader", action="append", choices=LOADERS, help="repeatable; default all")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--cache-share", type=float, default=0.25, help="cache_limit as a share of the dataset")
    # litdata's default max_pre_download (2) with 2 workers outgrows a 25% cache: its workers then
    # wait for a chunk until its 120 s timeout (measured, with 4 and 64 MiB chunks); 1 fits.
    ap.add_argument("--litdata-pre-download", type=int, default=1,
                    help="litdata's max_pre_download (chunks each worker fetches ahead; its default is 2)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one loader's two epochs may take")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        try:
            print(json.dumps(child(json.loads(sys.argv[2]))), flush=True)
        except Exception:  # the parent shows the last line as the row's reason
            traceback.print_exc()
            sys.exit(1)
        # The peers' DataLoader workers and shared memory go with the process.
        os._exit(0)
    sys.exit("run it as: python bench/bench_remote.py --peers [--gb 2]")
