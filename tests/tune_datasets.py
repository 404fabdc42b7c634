"""Datasets that tests/test_tune.py names as module:Class on the command line (importable from
tests/, and by the worker processes that tune starts); some of them wrong on purpose."""
from __future__ import annotations

import threading

import numpy as np
import torch


class Points(torch.utils.data.Dataset):
    def __init__(self, n: int = 500, width: int = 8):
        self.x = np.random.default_rng(0).standard_normal((n, width)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "y": i % 3}


def make_points(n: int = 500) -> Points:
    return Points(n)


points = Points(300)  # an instance: module:points


class NotADataset:
    def __init__(self, n: int = 3):
        self.n = n


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from range(10)


class Unpicklable(Points):
    def __init__(self, n: int = 200):
        super().__init__(n)
        self.lock = threading.Lock()  # locks cannot be pickled


class Empty(Points):
    def __init__(self):
        super().__init__(0)


class Broken(Points):
    def __getitem__(self, i: int) -> dict:
        raise KeyError(f"no record {i}")


class FailsToBuild(Points):
    def __init__(self, n: int = 10):
        raise RuntimeError("cannot open the database")


class IntKeys(Points):
    def __getitem__(self, i: int) -> dict:
        return {0: self.x[i]}  # a batch's fields are named by strings


class SlowToBuild(Points):
    """Says it is being built, then takes a minute: a Ctrl-C lands while tune builds the source."""

    def __init__(self, n: int = 100):
        import sys
        import time

        print("building", file=sys.stderr, flush=True)
        time.sleep(60)
        super().__init__(n)
