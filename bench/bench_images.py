"""Images at the decoder's speed: fastload's native decode stage (fl.ImageFolder + fl.Image)
against torchvision's ImageFolder + DataLoader (PIL and transforms.v2; and torchvision.io.decode_jpeg),
SPDL and DALI's CPU pipeline where they install and run without a GPU, and a C ceiling
(libjpeg-turbo decoding the same crops at the same DCT scale, no resize: bench/images_ceiling.cpp).

Two data sets made here: ImageNet-like JPEGs (about 500x375, quality 90) and large photos (about
1600x1200, quality 90), photograph-like content (1/f noise, edges, grain: every 8x8 block has
detail). The training transform (RandomResizedCrop 224 + horizontal flip) and the evaluation one
(Resize 256 + CenterCrop 224), uint8 out of every loader (normalising is the GPU's job). Each
loader runs in a process of its own with 2 threads or workers and batch 256, one epoch timed
(files in the page cache; the loader built before the clock starts, its workers started after); rounds are interleaved (the order rotates), and each round's ratio
fastload / other is kept: the table gives the median and the min-max of those ratios, the rates,
and each loader's peak memory (PSS of its process tree, workers included).

    python bench/bench_images.py --tv-python /path/to/venv-with-torchvision/bin/python [--rounds 5]

torchvision cannot be imported beside the CPU torch the project's venv holds: give the python of
a venv with `pip install torch==2.14.1 torchvision==0.29.1` (SPDL and DALI are tried there too).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETS = {"imagenet": dict(count=1024, sizes=[(375, 500), (333, 500), (400, 500), (500, 375), (281, 500)]),
        "large": dict(count=512, sizes=[(1200, 1600), (1200, 1600), (1600, 1200), (1080, 1620)])}


# ------------------------------------------------------------------------------------------ data
def _bases(rng, count, height, width):
    """Photograph-like base pictures: 1/f noise (natural images' spectrum) per channel, correlated
    across channels, with discs (edges) and grain."""
    import numpy as np

    out = []
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    f = np.sqrt(fx ** 2 + fy ** 2)
    f[0, 0] = 1.0
    for _ in range(count):
        common = np.fft.irfft2((rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f, s=(height, width))
        img = np.empty((height, width, 3), np.float32)
        for c in range(3):
            own = np.fft.irfft2((rng.normal(size=f.shape) + 1j * rng.normal(size=f.shape)) / f, s=(height, width))
            img[..., c] = 0.7 * common + 0.3 * own
        img = (img - img.mean()) / img.std() * 45 + 120
        y, x = np.ogrid[:height, :width]
        for _ in range(25):
            cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(20, min(height, width) / 5)
            img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] += rng.uniform(-50, 50, 3)
        out.append(np.clip(img, 0, 255))
    return out


def make_set(root: Path, name: str, count: int | None = None) -> Path:
    """The data set `name` under root/name (made once): class folders of JPEGs, quality 90."""
    import numpy as np
    from PIL import Image

    spec = SETS[name]
    count = count or spec["count"]
    folder = root / f"{name}-{count}"
    if (folder / "done").exists():
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    rng = np.random.default_rng(2026)
    big = max(max(s) for s in spec["sizes"]) + 64
    bases = _bases(rng, 6, big, big)
    t0 = time.perf_counter()
    for k in range(count):
        h, w = spec["sizes"][k % len(spec["sizes"])]
        base = bases[k % len(bases)]
        y, x = rng.integers(0, big - h), rng.integers(0, big - w)
        img = base[y:y + h, x:x + w] * rng.uniform(0.8, 1.2, 3) + rng.normal(0, 3, (h, w, 3))
        if k % 2:
            img = img[:, ::-1]
        d = folder / f"class{k % 8}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(d / f"{k:05d}.jpg", quality=90)
    (folder / "done").write_text("ok")
    size = sum(f.stat().st_size for f in folder.rglob("*.jpg"))
    print(f"made {count} {name} JPEGs ({size / count / 1024:.0f} KiB each) in {time.perf_counter() - t0:.0f} s",
          flush=True)
    return folder


# ------------------------------------------------------------------------------------------ loaders (worker side)
def _fastload(root, transform, threads, batch):
    import fastload as fl

    spec = fl.Image(224, flip=0.5) if transform == "train" else fl.Image(224, crop="center")
    loader = fl.Loader(fl.ImageFolder(root, image=spec), batch_size=batch, shuffle=True, seed=0,
                       num_threads=threads, device="cpu")

    def epoch():
        n = 0
        for b in loader:
            n += b["image"].shape[0]
        return n
    return epoch


def _torchvision(root, transform, threads, batch, decoder):
    import torch
    import torchvision
    from torchvision.transforms import v2

    if transform == "train":
        ops = [v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()]
    else:
        ops = [v2.Resize(256, antialias=True), v2.CenterCrop(224)]
    if decoder == "pil":
        tf = v2.Compose(ops + [v2.PILToTensor()])  # PIL crops and resizes; uint8 CHW out
        ds = torchvision.datasets.ImageFolder(root, transform=tf)
    else:
        from torchvision.io import ImageReadMode, decode_jpeg, read_file

        tf = v2.Compose(ops)

        def load(path):
            return decode_jpeg(read_file(path), mode=ImageReadMode.RGB)
        ds = torchvision.datasets.ImageFolder(root, loader=load, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=threads)

    def epoch():
        n = 0
        for x, _ in loader:
            n += x.shape[0]
        return n
    return epoch


def _dali(root, transform, threads, batch):
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def(batch_size=batch, num_threads=threads, device_id=None)
    def pipe():
        jpegs, labels = fn.readers.file(file_root=root, random_shuffle=True, name="r")
        if transform == "train":
            images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_x=224, resize_y=224)
            images = fn.flip(images, horizontal=fn.random.coin_flip())
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=256)
            images = fn.crop(images, crop=(224, 224))
        return images, labels
    p = pipe()
    p.build()
    size = p.epoch_size("r")

    def epoch():
        n = 0
        while n < size:
            out = p.run()
            n += len(out[0])
        return n
    return epoch


def _spdl(root, transform, threads, batch):
    import math
    import random

    import numpy as np
    import spdl.io
    from spdl.pipeline import PipelineBuilder

    files = sorted(str(p) for p in Path(root).rglob("*.jpg"))
    rnd = random.Random(0)

    def crop_filter(w, h):
        # RandomResizedCrop's rule (torchvision's get_params), then FFmpeg's crop, scale, flip.
        for _ in range(10):
            area = w * h * rnd.uniform(0.08, 1.0)
            aspect = math.exp(rnd.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(area * aspect))), int(round(math.sqrt(area / aspect)))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = rnd.randint(0, w - cw), rnd.randint(0, h - ch)
                break
        else:
            cw, ch, x, y = w, h, 0, 0
        flip = ",hflip" if rnd.random() < 0.5 else ""
        return f"crop={cw}:{ch}:{x}:{y},scale=224:224:flags=bilinear{flip},format=rgb24"

    def load(path):
        # SPDL's image path: FFmpeg demux + decode + filter graph on SPDL's threads (GIL released).
        packets = spdl.io.demux_image(path)
        w, h = packets.width, packets.height
        if transform == "train":
            desc = crop_filter(w, h)
        else:
            sw, sh = (256, -2) if w <= h else (-2, 256)
            desc = f"scale={sw}:{sh}:flags=bilinear,crop=224:224,format=rgb24"
        frames = spdl.io.decode_packets(packets, filter_desc=desc)
        return spdl.io.to_numpy(spdl.io.convert_frames(frames))

    def epoch():
        order = list(range(len(files)))
        rnd.shuffle(order)
        pipeline = (PipelineBuilder().add_source([files[i] for i in order]).pipe(load, concurrency=threads)
                    .aggregate(batch).pipe(np.stack).add_sink(4).build(num_threads=threads))
        n = 0
        with pipeline.auto_stop():
            for b in pipeline:
                n += len(b)
        return n
    return epoch


def worker(args) -> None:
    make = {"fastload": _fastload, "tv-pil": lambda *a: _torchvision(*a, decoder="pil"),
            "tv-decode_jpeg": lambda *a: _torchvision(*a, decoder="io"), "dali-cpu": _dali, "spdl": _spdl}[args.worker]
    epoch = make(args.root, args.transform, args.threads, args.batch)  # built, not timed
    c0, t0 = time.process_time(), time.perf_counter()  # one epoch, its start (worker processes, threads) included
    n = epoch()
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    # CPU of this process's threads (fastload's collation threads and the loop): worker processes
    # of the other loaders are not in it, so their rows leave it out.
    print(json.dumps({"images": n, "seconds": seconds, "cpu": cpu}), flush=True)


# ------------------------------------------------------------------------------------------ orchestrator
def _tree_pss(pid: int) -> int:
    """PSS (bytes) of a process and its descendants: shared pages counted once between them."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    return total


def run_one(python: str, kind: str, root: Path, transform: str, threads: int, batch: int, timeout: float):
    cmd = [python, str(Path(__file__).resolve()), "--worker", kind, "--root", str(root), "--transform", transform,
           "--threads", str(threads), "--batch", str(batch)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    peak = [0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_pss(proc.pid))
            stop.wait(0.05)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    stop.set()
    t.join()
    if proc.returncode != 0:
        return None, err.strip().splitlines()[-1] if err.strip() else f"exit status {proc.returncode}"
    r = json.loads(out.strip().splitlines()[-1])
    cpu_rate = r["images"] / r["cpu"] if kind.startswith("fastload") and r.get("cpu") else None
    return {"rate": r["images"] / r["seconds"], "pss": peak[0], "cpu_rate": cpu_rate}, None


def ceiling_plan(root: Path, transform: str, path: Path) -> None:
    """The regions fastload decodes in the timed epoch (a fresh loader's first: epoch 0, seed 0),
    one line per file. (Until 2026-11-28 this planned epoch 1, whose crops are others of the same
    distribution: 1.5% more decoded pixels on the ImageNet-like set.)"""
    import fastload as fl
    from fastload import _C

    spec = fl.Image(224, flip=0.5) if transform == "train" else fl.Image(224, crop="center")
    ds = fl.ImageFolder(root, image=spec)
    with open(path, "w") as out:
        for i, (p, _) in enumerate(ds.samples):
            with open(p, "rb") as f:
                _, info = _C._decode_image(f.read(), spec.native(), 0, 0, i, None)
            x, y, w, h = info["decoded"]
            out.write(f"{p} {info['scale'][0]} {x} {y} {w} {h}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--root", help=argparse.SUPPRESS)
    ap.add_argument("--transform", default="train", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sets", default="imagenet,large")
    ap.add_argument("--transforms", default="train,eval")
    ap.add_argument("--count", type=int, default=None, help="images per set (default: 1024 and 512)")
    ap.add_argument("--data", default=str(HERE / "data" / "images"))
    ap.add_argument("--tv-python", default=os.environ.get("FASTLOAD_BENCH_TV_PYTHON"),
                    help="a python with torchvision (and SPDL / DALI if installed)")
    ap.add_argument("--peers", default="tv-pil,tv-decode_jpeg,spdl,dali-cpu",
                    help="peer rows: tv-pil, tv-decode_jpeg, spdl, dali-cpu (run in --tv-python)")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="bench_images_"))
    ceiling = build / "images_ceiling"
    subprocess.run(["g++", "-O2", str(HERE / "images_ceiling.cpp"), "-ljpeg", "-lpthread", "-o", str(ceiling)],
                   check=True)
    kinds = [("fastload", sys.executable)]
    if args.tv_python:
        kinds += [(k, args.tv_python) for k in args.peers.split(",") if k]
    else:
        print("no --tv-python: torchvision, SPDL and DALI rows left out", flush=True)
    results = {}
    for name in args.sets.split(","):
        root = make_set(data, name, args.count)
        for transform in args.transforms.split(","):
            plan = build / f"{name}-{transform}.plan"
            ceiling_plan(root, transform, plan)
            rows = {k: [] for k, _ in kinds + [("ceiling", "")]}
            notes = {}
            for r in range(args.rounds):
                order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
                for kind, python in order:
                    if kind in notes:
                        continue  # failed before: not retried every round
                    res, err = run_one(python, kind, root, transform, args.threads, args.batch, timeout=900)
                    if res is None:
                        notes[kind] = err
                        print(f"  {name}/{transform}: {kind} did not run: {err}", flush=True)
                        continue
                    rows[kind].append(res)
                out = subprocess.run([str(ceiling), str(plan), str(args.threads), "2"], capture_output=True, text=True,
                                     check=True).stdout.split("\n")
                n, s, cpu = out[1].split()  # the second pass: files cached, threads warm
                rows["ceiling"].append({"rate": int(n) / float(s), "pss": 0, "cpu_rate": int(n) / float(cpu)})
                print(f"  {name}/{transform} round {r + 1}: " + ", ".join(
                    f"{k} {v[-1]['rate']:.0f}/s" + (f" (per CPU s {v[-1]['cpu_rate']:.0f})" if v[-1].get("cpu_rate") else "")
                    for k, v in rows.items() if v and len(v) == r + 1), flush=True)
            results[f"{name}/{transform}"] = {"rows": rows, "notes": notes}
            _table(name, transform, rows, notes)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    shutil.rmtree(build, ignore_errors=True)


def _table(name, transform, rows, notes) -> None:
    fast = rows["fastload"]
    print(f"\n{name}, {transform} transform (images/s, median of {len(fast)} interleaved rounds; ratio = "
          "fastload / row, median (min-max) of the per-round ratios; peak PSS of the loader's processes)")
    print("CPU columns: images per CPU second of the loader's own process (fastload rows and the ceiling only: "
          "other loaders' worker processes are not counted); on a shared machine the wall rate is mostly the CPU "
          "share a process got, the CPU rate is not")
    print("| loader | images/s | fastload / loader | peak memory | images per CPU s | fastload / loader, CPU |")
    print("| --- | --- | --- | --- | --- | --- |")

    def ratio_text(ratios):
        return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
    for kind, v in rows.items():
        if not v:
            print(f"| {kind} | did not run: {notes.get(kind, '')[:120]} | | | | |")
            continue
        rate = statistics.median(x["rate"] for x in v)
        ratio = "1" if kind == "fastload" else ratio_text([f["rate"] / x["rate"] for f, x in zip(fast, v)])
        mem = f"{max(x['pss'] for x in v) / 2**20:.0f} MiB" if kind != "ceiling" else "-"
        cpu_rate = cpu_ratio = "-"
        if all(x.get("cpu_rate") for x in v) and all(f.get("cpu_rate") for f in fast):
            cpu_rate = f"{statistics.median(x['cpu_rate'] for x in v):.0f}"
            cpu_ratio = "1" if kind == "fastload" else ratio_text([f["cpu_rate"] / x["cpu_rate"] for f, x in zip(fast, v)])
        print(f"| {kind} | {rate:.0f} | {ratio} | {mem} | {cpu_rate} | {cpu_ratio} |")
    print(flush=True)


if __name__ == "__main__":
    main()
