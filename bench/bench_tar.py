"""Tar shards: fastload's fl.Tar against webdataset (WebDataset + WebLoader, 2 workers), local
shards made here, one epoch per run, rounds interleaved (the order rotates each round).

Two sets: small samples (a 1 KiB .npy plus a .cls) and ~100 KB JPEGs plus a .cls. On the JPEGs
both sides do the evaluation transform to 224x224 uint8 (fastload: fl.Image(224, crop="center")
natively; webdataset: PIL decode, resize of the shorter side to 256, center crop, as an array).
Also the first batch's delay after open (the index built, and from its cache) and the cost of
indexing per GB. Prints a table: samples/s (median over rounds), the ratio fastload / webdataset
(median, min-max over rounds).

    python bench/bench_tar.py [--rounds 5] [--shards 8] [--shard-mib 16] [--jpegs 1024]
"""
from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import tarfile
import tempfile
import time

import numpy as np


def make_small(folder: str, shards: int, shard_mib: int) -> list[str]:
    per_sample = 3 * 1024  # a header and 3 blocks for the npy (128 + 1,024 bytes), a header and a block for the cls
    per_shard = shard_mib * 2**20 // per_sample
    paths, i = [], 0
    for s in range(shards):
        path = os.path.join(folder, f"small-{s:06d}.tar")
        with tarfile.open(path, "w") as t:
            for _ in range(per_shard):
                f = io.BytesIO()
                np.save(f, np.full(256, i, dtype=np.float32))
                for field, data in (("npy", f.getvalue()), ("cls", str(i % 1000).encode())):
                    info = tarfile.TarInfo(f"{i:09d}.{field}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
                i += 1
        paths.append(path)
    return paths


def make_jpegs(folder: str, count: int, shards: int) -> list[str]:
    from PIL import Image

    rng = np.random.default_rng(0)
    base = rng.normal(120, 40, size=(375, 500, 3))
    paths = []
    for s in range(shards):
        path = os.path.join(folder, f"jpg-{s:06d}.tar")
        with tarfile.open(path, "w") as t:
            for i in range(s * count // shards, (s + 1) * count // shards):
                img = np.clip(base + rng.normal(0, 25, size=base.shape), 0, 255).astype(np.uint8)
                f = io.BytesIO()
                Image.fromarray(img).save(f, format="JPEG", quality=85)
                for field, data in (("jpg", f.getvalue()), ("cls", str(i % 1000).encode())):
                    info = tarfile.TarInfo(f"{i:09d}.{field}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def run_fastload(paths: list[str], kind: str, batch: int) -> float:
    import fastload as fl

    if kind == "small":
        ds = fl.Tar(paths, fields=["npy", "cls"])
    else:
        ds = fl.Tar(paths, fields=["jpg", "cls"], decode={"jpg": fl.Image(224, crop="center")})
    loader = fl.Loader(ds, batch_size=batch, shuffle=True, seed=0, num_threads=2, device="cpu")
    t0 = time.perf_counter()
    n = sum(len(b["cls"]) for b in loader)
    return n / (time.perf_counter() - t0)


def _eval_transform(sample):
    from PIL import Image

    img, cls = sample
    w, h = img.size
    scale = 256 / min(w, h)
    img = img.resize((round(w * scale), round(h * scale)), Image.BILINEAR)
    w, h = img.size
    left, top = (w - 224) // 2, (h - 224) // 2
    return np.asarray(img.crop((left, top, left + 224, top + 224))), cls


def run_webdataset(paths: list[str], kind: str, batch: int) -> float:
    import warnings

    import webdataset as wds

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "small":
            ds = wds.WebDataset(paths, shardshuffle=True, empty_check=False).decode().to_tuple("npy", "cls")
        else:
            ds = (wds.WebDataset(paths, shardshuffle=True, empty_check=False).decode("pil").to_tuple("jpg", "cls")
                  .map(_eval_transform))
        loader = wds.WebLoader(ds.batched(batch), batch_size=None, num_workers=2)
        t0 = time.perf_counter()
        n = sum(len(b[1]) for b in loader)
        return n / (time.perf_counter() - t0)


def first_batch(paths: list[str], cache: str) -> tuple[float, float]:
    """Seconds from fl.Tar(...) to the first batch: indexes built (cold), then from their cache."""
    import fastload as fl

    out = []
    for _ in range(2):
        t0 = time.perf_counter()
        ds = fl.Tar(paths, fields=["npy", "cls"], cache_dir=cache)
        next(iter(fl.Loader(ds, batch_size=256, device="cpu", num_threads=2)))
        out.append(time.perf_counter() - t0)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mib", type=int, default=16)
    ap.add_argument("--jpegs", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="bench_tar_")
    try:
        sets = {"small": make_small(folder, args.shards, args.shard_mib),
                "jpeg": make_jpegs(folder, args.jpegs, args.shards)}
        size = {k: sum(os.path.getsize(p) for p in v) for k, v in sets.items()}
        cold, warm = first_batch(sets["small"], os.path.join(folder, "cache"))
        runners = [("fastload", run_fastload), ("webdataset", run_webdataset)]
        print(f"machine: {os.cpu_count()} CPUs; 2 threads (fastload) / 2 workers (webdataset); batch {args.batch}; "
              f"{args.rounds} rounds; shards in the page cache")
        print(f"small set: {args.shards} shards, {size['small'] / 2**20:.0f} MiB; jpeg set: {args.jpegs} JPEGs, "
              f"{size['jpeg'] / 2**20:.0f} MiB ({size['jpeg'] / args.jpegs / 1000:.0f} KB per sample)")
        print(f"first batch after open (small set): {cold:.3f} s indexing ({cold / (size['small'] / 2**30):.2f} s/GB "
              f"with the first batch), {warm:.3f} s with the indexes cached")
        print(f"{'set':<6} {'loader':<11} {'samples/s (median)':>19} {'min':>10} {'max':>10}   fastload/webdataset")
        for kind, paths in sets.items():
            runs: dict[str, list[float]] = {n: [] for n, _ in runners}
            for r in range(args.rounds):
                order = runners[r % 2:] + runners[:r % 2]
                for name, fn in order:
                    runs[name].append(fn(paths, kind, args.batch))
            ratios = [a / b for a, b in zip(runs["fastload"], runs["webdataset"])]
            for name, _ in runners:
                v = runs[name]
                extra = (f"   {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
                         if name == "fastload" else "")
                print(f"{kind:<6} {name:<11} {statistics.median(v):>19,.0f} {min(v):>10,.0f} {max(v):>10,.0f}{extra}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
