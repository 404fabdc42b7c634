"""Blending datasets: what a Mix costs.

1. Throughput: a 3-source blend of token windows (fl.Mix, weights 0.6/0.3/0.1, steps=) against
   one source holding the same tokens (steps=, and without steps= as the epoch-based baseline),
   in-memory uint16 tokens, windows of 1025 with stride 1024, batch 64 (--batch), shuffled. The
   Mix reads views of the one source's array (the cost of mixing alone) or three separate arrays,
   sized as the weights (60/30/10% of the tokens); a third Mix reads views of 1/2, 1/4 and 1/4 of
   the array. A shuffled source of n samples computes between n and 2n permutation values
   (cycle-walking up to the next power of two), so parts sized as the weights walk more or less
   than the one source depending on the sizes (2^28 tokens: the one source hardly walks, its
   parts do), while parts a power of two apart walk as the one source does: that Mix is the fair
   comparison of what mixing costs. Rounds interleave the loaders; the table shows medians, and
   the median of the per-round ratios with their min-max, of samples/s and of the process's CPU
   time per sample.
2. Start-up at scale: a Mix of 10^12 samples (three sources whose rows are one repeated row, so no
   memory is needed): Loader construction and the first batch, median and min over repeats.
3. The schedule's long-run exactness: for several weight sets, the largest gap over 10^6 steps
   between the samples a source got and its exact share (steps x G x w_j), checked against the
   native schedule at a few points.
4. Against a hand-made concatenation with a Megatron-style blend index (a dataset id and a sample
   id per blended sample, built up front with numpy, per-source shuffles included): its build time
   and peak memory (tracemalloc) at several sizes, beside fastload's (no index: nothing to build).

Prints tables and exits 0. Run `python bench/bench_mix.py [--quick] [--batch B] [--tokens T]
[--only throughput]`.
"""
from __future__ import annotations

import argparse
import datetime
import logging
import os
import platform
import statistics
import time
import tracemalloc

import numpy as np

import fastload as fl

WEIGHTS = {"web": 0.6, "code": 0.3, "math": 0.1}


def tokens(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 50257, n, dtype=np.uint16)


def rate(loader: fl.Loader, batches: int, warmup: int) -> tuple[float, float]:
    """(samples/s, CPU seconds of the whole process per sample) over `batches` batches. The CPU
    time (every thread's) is the steadier figure on a machine shared with other work."""
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(batches):
        next(it)
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    samples = batches * loader.batch_size
    return samples / dt, dc / samples


def throughput(args) -> list[str]:
    # Three sources sized 60/30/10% of the tokens, and the same tokens in one array. A Mix over
    # views of that one array reads the same memory as one source does (the cost of mixing
    # alone); a Mix over the three arrays adds the page-table cost of a footprint spread over
    # separate allocations (as three memory-mapped files would be).
    total = args.tokens
    sizes = [int(total * w) for w in WEIGHTS.values()]
    parts = [tokens(n, k) for k, n in enumerate(sizes)]
    whole = np.concatenate(parts)
    windows = lambda t: fl.Windows(t, length=1025, stride=1024)  # noqa: E731

    def views_of(fractions: list[float]) -> fl.Mix:
        cuts = np.cumsum([0] + [int(total * f) for f in fractions])
        return fl.Mix({name: windows(whole[cuts[k]:cuts[k + 1]]) for k, name in enumerate(WEIGHTS)}, WEIGHTS)

    one = windows(whole)
    views = views_of(list(WEIGHTS.values()))
    halves = views_of([0.5, 0.25, 0.25])
    separate = fl.Mix({name: windows(parts[k]) for k, name in enumerate(WEIGHTS)}, WEIGHTS)
    b, threads = args.batch, args.threads
    total_batches = args.batches + args.warmup
    # steps is larger than needed so the run never ends inside a measurement; every loader is
    # built once (threads and buffers) and restarted per round.
    kinds = {
        "one source, epochs": lambda: fl.Loader(one, b, shuffle=True, num_threads=threads),
        "one source, steps=": lambda: fl.Loader(one, b, shuffle=True, num_threads=threads, steps=10**12),
        "Mix of 3 (views of that array), steps=": lambda: fl.Loader(views, b, shuffle=True, num_threads=threads,
                                                                  steps=10**12),
        "Mix of 3 (views of 1/2, 1/4, 1/4: walks as one source), steps=": lambda: fl.Loader(
            halves, b, shuffle=True, num_threads=threads, steps=10**12),
        "Mix of 3 (separate arrays), steps=": lambda: fl.Loader(separate, b, shuffle=True, num_threads=threads,
                                                              steps=10**12),
    }
    loaders = {k: make() for k, make in kinds.items()}
    per_epoch = len(loaders["one source, epochs"])
    if per_epoch < total_batches:
        raise SystemExit(f"--tokens too small: an epoch of one source has {per_epoch} batches, a round needs "
                         f"{total_batches}")
    results: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        order = list(kinds) if r % 2 == 0 else list(reversed(kinds))
        for k in order:
            speed, cost = rate(loaders[k], args.batches, args.warmup)
            results[k].append(speed)
            cpu[k].append(cost)
    for loader in loaders.values():
        loader.close()

    def ratio(a: list[float], b: list[float]) -> str:
        r = [x / y for x, y in zip(a, b)]
        return f"{statistics.median(r):.3f}x ({min(r):.3f}–{max(r):.3f})"

    base, base_cpu = results["one source, steps="], cpu["one source, steps="]
    lines = [f"### Throughput: {total:,} uint16 tokens, windows 1025/1024, batch {b}, shuffled, {threads} threads, "
             f"{args.rounds} interleaved rounds of {args.batches} batches",
             "",
             "| loader | samples/s (median) | samples/s / one source with steps= (median of rounds, min–max) | "
             "CPU per sample (median) | CPU per sample / one source with steps= |",
             "| --- | --- | --- | --- | --- |"]
    for k in kinds:
        lines.append(f"| {k} | {statistics.median(results[k]) / 1e6:.2f} M/s | {ratio(results[k], base)} | "
                     f"{statistics.median(cpu[k]) * 1e9:.0f} ns | {ratio(cpu[k], base_cpu)} |")
    return lines


def huge_mix() -> fl.Mix:
    def repeated(n: int, value: int) -> fl.Dataset:
        row = np.full((1, 1025), value, np.uint16)
        return fl.Dataset({"tokens": np.lib.stride_tricks.as_strided(row, shape=(n, 1025), strides=(0, 2))})

    return fl.Mix({"web": repeated(6 * 10**11, 0), "code": repeated(3 * 10**11, 1), "math": repeated(10**11, 2)},
                  WEIGHTS)


def startup(args) -> list[str]:
    mix = huge_mix()
    build, first = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        loader = fl.Loader(mix, 64, shuffle=True, steps=10**10, num_threads=args.threads)
        t1 = time.perf_counter()
        batch = next(iter(loader))
        t2 = time.perf_counter()
        loader.close()
        build.append(t1 - t0)
        first.append(t2 - t1)
        counts = np.bincount(batch["tokens"][:, 0].numpy(), minlength=3).tolist()
    t0 = time.perf_counter()
    loader = fl.Loader(mix, 64, shuffle=True, steps=10**10, num_threads=args.threads)
    far = loader.plan(steps=(10**10 - 1, 10**10))
    far_s = time.perf_counter() - t0
    loader.close()
    ms = lambda v: f"{statistics.median(v) * 1e3:.2f} ms (min {min(v) * 1e3:.2f})"  # noqa: E731
    return [f"### Start-up: a Mix of {len(mix):,} samples (3 sources, weights 0.6/0.3/0.1), batch 64, "
            f"{args.repeats} repeats",
            "",
            "| what | time |",
            "| --- | --- |",
            f"| Loader(...) construction | {ms(build)} |",
            f"| iter() and the first batch | {ms(first)} |",
            f"| plan() of step 10^10 - 1 (a new loader) | {far_s * 1e3:.2f} ms |",
            f"| first batch's rows per source | {counts} (0.6/0.3/0.1 of 64 = 38.4/19.2/6.4) |"]


DISCREPANCY_SETS = [
    ("0.6/0.3/0.1, G=64", [0.6, 0.3, 0.1], 64),
    ("1/1/1, G=10", [1, 1, 1], 10),
    ("1/2/3/4/5/6/7, G=1000", [1, 2, 3, 4, 5, 6, 7], 1000),
    ("0.001/0.999, G=8", [0.001, 0.999], 8),
    ("sizes 10^6/3*10^5/5*10^4 (by length), G=512", [10**6, 3 * 10**5, 5 * 10**4], 512),
    ("pi/e/sqrt(2), G=37", [3.141592653589793, 2.718281828459045, 1.4142135623730951], 37),
]


def discrepancy(args) -> list[str]:
    from fractions import Fraction

    from fastload import _C
    from fastload._mix_quota import SCALE, quotas

    steps = args.discrepancy_steps
    lines = [f"### Schedule: largest gap over the first {steps:,} steps between a source's samples and its exact share",
             "",
             "| weights, global batch | per source: max over S of abs(samples(S) - S x G x w_j) | per step |",
             "| --- | --- | --- |"]
    s = np.arange(steps, dtype=np.uint64)
    for label, weights, g in DISCREPANCY_SETS:
        w = [Fraction(x) for x in weights]
        base, shares = quotas(w, g)
        phase = _C.mix_phase(0)
        native = _C.MixSchedule(g, base, shares, phase)
        total = sum(w)
        u = (s * np.uint64(_C.MIX_ROTATION) + np.uint64(phase)) & np.uint64(SCALE - 1)
        gaps, start = [], 0
        for j, a in enumerate(shares):
            v = (u - np.uint64(start)) & np.uint64(SCALE - 1)
            got = np.concatenate([[0], np.cumsum((v < np.uint64(a)).astype(np.int64))]) + base[j] * np.arange(steps + 1)
            for check in (0, steps // 3, steps):
                assert got[check] == native.taken(j, check)
            exact = np.arange(steps + 1) * float(g * w[j] / total)
            gaps.append(float(np.max(np.abs(got - exact))))
            start += a
        lines.append(f"| {label} | {', '.join(f'{x:.2f}' for x in gaps)} | every step within one sample of each "
                     "share (tested) |")
    return lines


def megatron_style_index(lengths: list[int], weights: list[float], total: int, seed: int = 0):
    """A blend index as Megatron-style loaders build it before training: for every blended sample a
    dataset id (uint8) and a sample id in that dataset (int64). Each dataset's share is spread
    evenly (merge by fractional position); a dataset read past its end is read again in a new
    shuffle (a permutation array per pass)."""
    w = np.asarray(weights, np.float64) / sum(weights)
    counts = np.floor(w * total).astype(np.int64)
    counts[np.argsort(-(w * total - counts))[: total - counts.sum()]] += 1
    keys = np.concatenate([(np.arange(c) + 0.5) / c for c in counts])
    owner = np.repeat(np.arange(len(lengths), dtype=np.uint8), counts)
    order = np.argsort(keys, kind="stable")
    dataset_index = owner[order]
    del keys, owner
    del order
    rank_in_dataset = np.empty(total, np.int64)  # the stable sort keeps each dataset's own order
    for j, c in enumerate(counts):
        rank_in_dataset[dataset_index == j] = np.arange(c)
    rng = np.random.default_rng(seed)
    sample_index = np.empty(total, np.int64)
    for j, (n, c) in enumerate(zip(lengths, counts)):
        passes = -(-int(c) // n)
        shuffled = np.concatenate([rng.permutation(n) for _ in range(passes)])
        mask = dataset_index == j
        sample_index[mask] = shuffled[rank_in_dataset[mask]]
        del shuffled, mask
    return dataset_index, sample_index


def index_cost(args) -> list[str]:
    lengths = [600_000, 300_000, 50_000]  # windows per source (~0.6/0.3/0.05 G tokens of 1024)
    weights = list(WEIGHTS.values())
    lines = ["### A Megatron-style blend index (built with numpy) vs fastload's schedule",
             "",
             "| blended samples | index build time | index peak memory | index bytes kept | fastload: build, memory |",
             "| --- | --- | --- | --- | --- |"]
    for total in args.index_sizes:
        tracemalloc.start()
        t0 = time.perf_counter()
        dataset_index, sample_index = megatron_style_index(lengths, weights, total)
        dt = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        kept = dataset_index.nbytes + sample_index.nbytes
        del dataset_index, sample_index
        lines.append(f"| {total:,} | {dt:.2f} s | {peak / 2**20:,.0f} MiB | {kept / 2**20:,.0f} MiB | "
                     "none (each step computed from its number) |")
    per = kept / args.index_sizes[-1]
    lines.append("")
    lines.append(f"At {per:.0f} bytes kept per blended sample, an index for 10^12 samples would hold "
                 f"{per * 1e12 / 2**40:,.1f} TiB; fastload's first batch of such a Mix is in the start-up table.")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a short run (smaller rounds and index sizes)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--batches", type=int, default=3000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--tokens", type=int, default=2**28, help="tokens of the three sources together (uint16)")
    p.add_argument("--batch", type=int, default=64, help="batch size of the throughput table")
    p.add_argument("--only", choices=["throughput", "startup", "discrepancy", "index"],
                   help="run one section only")
    args = p.parse_args()
    logging.getLogger("fastload").setLevel(logging.ERROR)  # the stall hint: this loop takes batches as fast as it can
    args.index_sizes = [10**6, 10**7, 10**8]
    args.discrepancy_steps = 10**6
    if args.quick:
        args.rounds, args.batches, args.warmup, args.repeats, args.tokens = 3, 500, 50, 5, 2**20 * 48
        args.index_sizes = [10**5, 10**6]
        args.discrepancy_steps = 10**5
    print(f"# bench_mix: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"{os.cpu_count()} CPUs, {platform.python_version()}, fastload {fl.__version__}")
    sections = {"throughput": throughput, "startup": startup, "discrepancy": discrepancy, "index": index_cost}
    for name, section in sections.items():
        if args.only and name != args.only:
            continue
        print()
        print("\n".join(section(args)), flush=True)


if __name__ == "__main__":
    main()
