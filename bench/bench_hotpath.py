"""The array hot path against two C ceilings, for one build of fastload or two side by side.

    python bench/bench_hotpath.py [--rounds 5] [--seconds 1] [--workload "1 KiB"] [--before DIR]

Each round runs, per build (in an order that rotates round to round), one child process that
measures fastload at default arguments and two ceilings (bench/ceiling.cpp), in an order that
also rotates:
  - "ceiling": the one bench/bench_loader.py shows (16 rows ahead, 4 lines a row, one buffer);
  - "ceiling 8/16/4": issue 22's (rows prefetched 8 rows ahead, up to 16 cache lines of each:
    a whole 1 KiB row; 4 batch buffers per thread in rotation, as a loader must rotate the buffers
    it hands out). Whole 150 KiB rows 8 ahead cost 2.6x the 16-line prefetch here, so 16 caps it.
Figures are medians over rounds of each round's ratio (fastload / ceiling, both measured in the
same child), with the min-max; CPU time per row (all threads) is shown too, as it moves far less
than throughput when the machine is shared. --before DIR names a directory holding another build's
`fastload` package (an unpacked wheel, or python/fastload with its _C module copied in): it runs
instead of the installed fastload in its own children, interleaved with the installed one.
"""
from __future__ import annotations

import argparse
import json
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(args: argparse.Namespace) -> None:
    """One round for one build: prints a JSON object of measurements."""
    if args.pkg:
        # The editable install's finder would win over sys.path: drop it, then import from pkg.
        sys.meta_path[:] = [f for f in sys.meta_path if "ScikitBuild" not in type(f).__name__]
        sys.path.insert(0, args.pkg)
    sys.path.insert(0, str(HERE))
    import bench_loader as bl  # noqa: E402 - imports fastload, after the path is set

    logging.getLogger("fastload").setLevel(logging.ERROR)  # the stall hint: this measures the waiting
    bl.ceiling_lib(Path(args.ceiling_lib))
    w = next(w for w in bl.workloads(False) if args.workload in w.name)
    mm = bl.ensure_file(args.data_dir / w.file, w.shape, w.dtype)
    bl.page_in(mm)
    lines = min(16, (w.row_bytes + 63) // 64)
    fns = {
        "fastload": bl.run_fastload,
        "ceiling": bl.run_ceiling,
        "ceiling 8/16/4": lambda w, mm, warmup, seconds: bl.run_ceiling(w, mm, warmup, seconds, ahead=8,
                                                                        lines=lines, buffers=4),
    }
    keys = list(fns)
    shift = args.shift % len(keys)
    out = {"fastload_file": bl.fl.__file__, "rounds": {}}
    for key in keys[shift:] + keys[:shift]:
        m = fns[key](w, mm, 0.3, args.seconds)
        out["rounds"][key] = dict(m.__dict__)
    print(json.dumps(out))


def loadavg() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per measurement")
    ap.add_argument("--workload", action="append", default=None,
                    help='a workload name fragment of bench_loader.py ("1 KiB", "64 B", "150 KiB", "uint16"); '
                         "repeatable; default the three row workloads")
    ap.add_argument("--before", type=Path, default=None,
                    help="a directory holding another build's fastload package, measured beside the installed one")
    ap.add_argument("--data-dir", type=Path, default=HERE / "data")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pkg", default="", help=argparse.SUPPRESS)
    ap.add_argument("--shift", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--ceiling-lib", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.workload = args.workload[0]
        return child(args)

    builds = {"installed": ""}
    if args.before is not None:
        builds = {"before": str(args.before.resolve()), "after (installed)": ""}
    workloads = args.workload or ["1 KiB", "64 B", "150 KiB"]
    sys.path.insert(0, str(HERE))
    import bench_loader as bl  # noqa: E402 - only to compile the ceiling once for every child

    lib_dir = Path(tempfile.mkdtemp(prefix="fastload_ceiling_"))
    try:
        run_rounds(args, builds, workloads, bl.compile_ceiling(lib_dir))
    finally:
        shutil.rmtree(lib_dir, ignore_errors=True)


def run_rounds(args: argparse.Namespace, builds: dict, workloads: list[str], lib: Path) -> None:
    print(f"# bench_hotpath: {args.rounds} round(s), {args.seconds:g} s per measurement; load average at start {loadavg()}")
    results: dict = {}
    for wname in workloads:
        for rnd in range(args.rounds):
            names = list(builds)
            order = names[rnd % len(names):] + names[:rnd % len(names)]
            for b in order:
                cmd = [sys.executable, __file__, "--child", "--workload", wname, "--seconds", str(args.seconds),
                       "--shift", str(rnd), "--pkg", builds[b], "--data-dir", str(args.data_dir),
                       "--ceiling-lib", str(lib)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0 or not proc.stdout.strip():
                    print(f"  {wname} round {rnd + 1} {b}: failed\n{proc.stderr[-2000:]}", flush=True)
                    continue
                got = json.loads(proc.stdout.strip().splitlines()[-1])
                results.setdefault(wname, {}).setdefault(b, []).append(got["rounds"])
                r = got["rounds"]
                print(f"  {wname} round {rnd + 1} {b:18s} " + "; ".join(
                    f"{k} {m['samples_per_s'] / 1e6:.3g} M/s {m['cpu_ns_per_sample']:.0f} ns/row "
                    f"(others {m['other_cores']:.1f} cores)" for k, m in r.items()) +
                    f" [{Path(got['fastload_file']).parent}] load {loadavg()}", flush=True)

    def spread(xs: list[float]) -> str:
        return f"{statistics.median(xs):.2f}x ({min(xs):.2f}–{max(xs):.2f})" if xs else "n/a"

    print(f"\nload average at the end: {loadavg()}\n")
    print("Throughput ratios, and CPU time per row of the ceiling over fastload's (all threads; less "
          "sensitive to other load)\n")
    print("| workload | build | fastload / ceiling | fastload / ceiling 8/16/4 | CPU: ceiling / fastload | "
          "CPU: ceiling 8/16/4 / fastload | fastload M rows/s (median) | others' load (cores, mean) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for wname, per_build in results.items():
        for b, rounds in per_build.items():
            def ratios(key: str, field: str = "samples_per_s", inverse: bool = False) -> list[float]:
                xs = [r["fastload"][field] / r[key][field] for r in rounds if r[key][field]]
                return [1 / x for x in xs] if inverse else xs
            others = statistics.mean(m["other_cores"] + m["steal_cores"] for r in rounds for m in r.values())
            print(f"| {wname} | {b} | {spread(ratios('ceiling'))} | {spread(ratios('ceiling 8/16/4'))} | "
                  f"{spread(ratios('ceiling', 'cpu_ns_per_sample', inverse=True))} | "
                  f"{spread(ratios('ceiling 8/16/4', 'cpu_ns_per_sample', inverse=True))} | "
                  f"{statistics.median(r['fastload']['samples_per_s'] for r in rounds) / 1e6:.3g} | {others:.2f} |")


if __name__ == "__main__":
    main()
