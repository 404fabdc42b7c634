"""Batches lost by a `batch = next(it)` step loop under a Ctrl-C (a SIGALRM handler raising
KeyboardInterrupt) every `interval` seconds; prints, per run, the batches lost and the interrupts
that landed (the README's Resume section quotes it on a quiet and on a loaded machine).

    python bench/bench_ctrl_c_losses.py [batches=5000] [interval_s=0.001] [runs=3]
"""
import gc, os, signal, sys
import numpy as np
import fastload as fl

N = int(sys.argv[1]) if len(sys.argv) > 1 else 5000
interval = float(sys.argv[2]) if len(sys.argv) > 2 else 0.001
runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
armed = [False]
count = [0]

def handler(signum, frame):
    if armed[0]:
        armed[0] = False
        count[0] += 1
        raise KeyboardInterrupt

gc.disable()
signal.signal(signal.SIGALRM, handler)
for r in range(runs):
    ds = fl.Dataset({"x": np.arange(N * 4, dtype=np.int64).reshape(N, 4)})
    loader = fl.Loader(ds, 1, num_threads=1, prefetch=1, device="cpu", with_index=True)
    it = iter(loader)
    count[0] = 0
    got = []
    signal.setitimer(signal.ITIMER_REAL, interval, interval)
    for _ in range(N + 1_000_000):
        try:
            armed[0] = True
            batch = next(it, None)
            if batch is None:
                armed[0] = False
                break
            got.append(batch)
            armed[0] = False
        except KeyboardInterrupt:
            pass
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    ids = [int(i) for b in got for i in b["index"]]
    print(f"run {r}: lost {N - len(ids)} of {N} batches, {count[0]} interrupts, duplicates {len(ids) - len(set(ids))}, load {os.getloadavg()[0]:.1f}", flush=True)
    loader.close()
