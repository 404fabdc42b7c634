"""A brute-force statement of the sampling contract (shared/DESIGN.md), for comparison with the
native sampler: builds whole index arrays, which the real sampler never does."""
from __future__ import annotations

import numpy as np


def reference_batches(perm: np.ndarray, batch_size: int, world_size: int, rank: int, even: str,
                      drop_last: bool, start: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """This rank's batches as (ids, valid) for an epoch whose order is `perm` (P), resuming at
    global position `start`."""
    n = len(perm)
    remaining = max(n - start, 0)
    if even == "drop":
        rounded = remaining // world_size * world_size
    else:
        rounded = -(-remaining // world_size) * world_size
    positions = np.arange(start, start + rounded)
    ids = perm[positions % n]  # padding wraps around: P[N+i] = P[i mod N]
    valid = positions < n
    g = batch_size * world_size
    full = rounded // g
    out = []
    for s in range(full):
        lo = s * g + rank * batch_size
        out.append((ids[lo:lo + batch_size], valid[lo:lo + batch_size]))
    tail = rounded - full * g
    if tail and not drop_last:
        share = tail // world_size
        lo = full * g + rank * share
        out.append((ids[lo:lo + share], valid[lo:lo + share]))
    return out
