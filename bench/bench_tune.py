"""Checks fl.tune's recommendation against an independent, longer measurement of its own grid.

For the 1 KiB-row and token-window workloads of bench/bench_loader.py: runs fl.tune (timed),
then measures every configuration of its grid again in interleaved rounds (a new random order
each round, 1 s each) and reports the recommendation's samples/s over the best configuration's
(medians over the rounds). The bar (issue 9): within 10% of the best, with tune taking under 60 s.
Run `python bench/bench_tune.py [--rounds N] [--seconds S]`.
"""
from __future__ import annotations

import argparse
import logging
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_loader as bl  # noqa: E402 - the shared workloads, data files and fastload runner

import fastload as fl  # noqa: E402

BAR_RATIO = 0.9
BAR_SECONDS = 60.0


def check(w: bl.Workload, rounds: int, seconds: float) -> dict:
    mm = bl.ensure_file(bl.HERE / "data" / w.file, w.shape, w.dtype)
    bl.page_in(mm)
    result = fl.tune(bl.fastload_source(w, mm), batch_size=w.batch, progress=False)
    configs = [(r.num_threads, r.prefetch) for r in result.rows]
    rates: dict[tuple[int, int], list[float]] = {c: [] for c in configs}
    rng = random.Random(0)
    for rnd in range(rounds):
        order = configs[:]
        rng.shuffle(order)
        for threads, prefetch in order:
            m = bl.run_fastload(w, mm, 0.3, seconds, num_threads=threads, prefetch=prefetch)
            rates[(threads, prefetch)].append(m.samples_per_s)
        print(f"  {w.name}: round {rnd + 1} of {rounds} done", flush=True)
    median = {c: statistics.median(v) for c, v in rates.items()}
    best = max(median, key=median.get)
    rec = (result.recommended.num_threads, result.recommended.prefetch)
    return {"workload": w.name, "tune_s": result.elapsed_s, "recommended": rec, "best": best,
            "ratio": median[rec] / median[best], "rec_rate": median[rec], "best_rate": median[best],
            "configs": len(configs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the re-measurement (default 3)")
    ap.add_argument("--seconds", type=float, default=1.0, help="seconds per configuration and round (default 1)")
    args = ap.parse_args()
    logging.getLogger("fastload").setLevel(logging.ERROR)
    print("# fl.tune's recommendation against a re-measurement of its grid\n")
    print("\n".join(bl.machine_lines()))
    print(f"- command: `{' '.join(['python', 'bench/bench_tune.py'] + sys.argv[1:])}`\n", flush=True)
    rows = [check(w, args.rounds, args.seconds) for w in bl.workloads(False)
            if w.name.startswith(("1 KiB", "uint16"))]
    print(f"\n| workload | tune took | recommended (threads, prefetch) | best re-measured | "
          f"recommended / best (median of {args.rounds} rounds) | bar |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        ok = r["ratio"] >= BAR_RATIO and r["tune_s"] < BAR_SECONDS
        print(f"| {r['workload']} | {r['tune_s']:.1f} s | {r['recommended']} | {r['best']} of {r['configs']} | "
              f"{r['ratio']:.3f} ({bl.fmt_rate(r['rec_rate'])}/s vs {bl.fmt_rate(r['best_rate'])}/s) | "
              f"{'meets' if ok else 'MISSES'} (>= {BAR_RATIO:g}, < {BAR_SECONDS:g} s) |")


if __name__ == "__main__":
    main()
