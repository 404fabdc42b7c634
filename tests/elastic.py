"""Elastic resume as the tests run it: a state saved by one of four ranks, loaded by two ranks with
the same global batch."""
from __future__ import annotations

from typing import Callable

import numpy as np


def four_to_two(loader: Callable[[int, int, int], object], batch_size: int, steps: int,
                saved_rank: int) -> tuple[dict, list[list[np.ndarray]]]:
    """Four ranks of `batch_size` samples each take `steps` batches; two ranks of twice the batch
    load the state of rank `saved_rank` and run to the end. Returns that state and the two ranks'
    remaining "index" parts. `loader(batch_size, rank, world_size)` builds one rank's loader."""
    four = [loader(batch_size, r, 4) for r in range(4)]
    its = [iter(x) for x in four]
    for _ in range(steps):
        for it in its:
            next(it)
    state = four[saved_rank].state_dict()
    two = [loader(2 * batch_size, r, 2) for r in range(2)]
    for x in two:
        x.load_state_dict(state)
    return state, [[b["index"].numpy() for b in x] for x in two]
