"""Time from iter() to the first batch with workers="processes" (every spawned worker imports torch
and fastload and unpickles the dataset; they start all at once), against threads. Each run is a
fresh interpreter.

    python bench/bench_worker_start.py [runs]
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np


class Small:
    """A tiny picklable dataset: the time measured is the workers' start, not the samples."""

    def __len__(self) -> int:
        return 1000

    def __getitem__(self, i: int) -> dict:
        return {"x": np.full(8, i, np.float32)}


CHILD = """
import time, fastload as fl
from bench_worker_start import Small
if __name__ == "__main__":
    loader = fl.Loader(Small(), 8, device="cpu", workers="{workers}", num_workers={n})
    t0 = time.perf_counter()
    next(iter(loader))
    print(f"{{time.perf_counter() - t0:.2f}}")
    loader.close()
"""


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    here = os.path.dirname(os.path.abspath(__file__))
    print(f"{os.cpu_count()} CPUs; seconds from iter() to the first batch, {runs} fresh interpreters each")
    for workers, n in (("threads", 2), ("processes", 1), ("processes", 2), ("processes", 4)):
        times = []
        for _ in range(runs):
            done = subprocess.run([sys.executable, "-c", CHILD.format(workers=workers, n=n)], capture_output=True,
                                  text=True, cwd=here)
            times.append(done.stdout.strip() or "failed: " + done.stderr[-200:])
        print(f"{workers:9s} x{n}: {', '.join(times)}   (load average {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main()
