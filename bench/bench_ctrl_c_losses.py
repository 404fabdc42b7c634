"""Batches lost by a `batch = next(it)` step loop under a Ctrl-C (a SIGALRM handler raising
KeyboardInterrupt) every `interval` seconds; prints, per run, the batches lost and the interrupts
that landed (the README's Resume section quotes it on a quiet and on a loaded machine).

    python bench/bench_ctrl_c_losses.py [batches=5000] [interval_s=0.001] [runs=3]
"""
import gc, os, sys
from pathlib import Path
import numpy as np
import fastload as fl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from ctrl_c import Interrupts, index_ids, step_loop  # noqa: E402  (the step loop the tests run)

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.001
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3

gc.disable()
for r in range(runs):
    ds = fl.Dataset({"x": np.arange(N * 4, dtype=np.int64).reshape(N, 4)})
    loader = fl.Loader(ds, 1, num_threads=1, prefetch=1, device="cpu", with_index=True)
    it = iter(loader)
    with Interrupts(interval) as irq:
        got = step_loop(it, irq, N + 1_000_000)
    ids = index_ids(got)
    print(f"run {r}: lost {N - len(ids)} of {N} batches, {irq.count} interrupts, duplicates {len(ids) - len(set(ids))}, load {os.getloadavg()[0]:.1f}", flush=True)
    loader.close()
