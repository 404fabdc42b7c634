"""The Loader's schedules over fl.Pack, whose samples are packed rows (_sources/pack.py).

- PackEpochSchedule: epoch e deals the rows of e's packing (fastload._C.PackSampler:
  csrc/core/pack_plan.h) to ranks as EpochSchedule deals samples; even= adds empty rows.
- PackStepSchedule: steps=N over the endless stream of packed rows (epoch 0's rows, then epoch
  1's, ...): global step g is the G rows from stream position P(g) = position + (g - origin) * G
  of its anchor (origin, position, G). Another G (a resume at another world size or batch size,
  split()) re-anchors where the stream stands, so no row repeats and none is skipped.

The number of rows depends on the epoch's order of documents, so it is planned natively once per
epoch (cached by the source) and never counted here; states record positions in packed rows and
what the packing was (Pack.state_key), so a state resumes only the same packing.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from . import _C
from ._config import LoaderConfig
from ._machine import memory_limit
from ._schedules import EpochSchedule, RunOrder, Schedule, epoch_arg, step_range
from ._state import state_bool, state_int
from ._stats import PackingStats

PACK_STATE_VERSION = 1


def _no_order(source: Any) -> RunOrder:
    """Packed rows are read by no prefetcher (fl.Pack refuses remote sources)."""
    empty = (np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64))
    return RunOrder((source,), (0,), 0, 0, lambda a, b: empty, lambda: None)


def _check_packing(state: dict[str, Any], source: Any) -> None:
    saved, ours = state.get("packing"), source.state_key()
    if saved is None:
        raise ValueError("state was saved by a loader over unpacked samples; this loader reads fl.Pack's packed "
                         "rows: the order would differ")
    if saved != ours:
        diff = {k: (saved.get(k) if isinstance(saved, dict) else None, v) for k, v in ours.items()
                if not isinstance(saved, dict) or saved.get(k) != v}
        raise ValueError(f"state was saved with other packing ({', '.join(f'{k}: {a!r} there, {b!r} here' for k, (a, b) in diff.items())}): "
                         "the packed rows would differ")


def _sampler(config: LoaderConfig, source: Any, seed: int, world: int, rank: int) -> Any:
    c = config
    return _C.PackSampler(c.native, c.batch_size, world, rank, seed, c.shuffle, c.order, c.even, c.drop_last,
                          _C.BLOCK_SIZE, source.document_shard_rows, _C.WINDOW_SHARDS, c.num_threads)


def _stats(sampler: Any, epoch: int, source: Any) -> PackingStats:
    t = sampler.totals(epoch)
    return PackingStats(epoch=epoch, length=source.length, window=source.window, **t)


class PackEpochSchedule(EpochSchedule):
    """Epochs of packed rows: epoch e is each replica's PackSampler plan of (seed, e)."""

    def samplers(self, devices: int) -> list[Any]:
        world = self.config.replicas(devices)
        return [_sampler(self.config, self.source, self.seed, world, self.config.rank * devices + d)
                for d in range(devices)]

    def _epoch_now(self) -> int:
        """The running epoch while it has batches left, else the one the next iter() runs."""
        run = self.run
        if run is not None and not run.superseded and not self.finished():
            return run.epoch
        if self.pending is not None:
            return self.pending[0]
        return self.last_epoch + 1

    def length(self) -> int:
        return self.samplers(self.outputs)[0].num_batches(self._epoch_now(), 0)

    def plan(self, epoch: Any, steps: Any) -> np.ndarray:
        if steps is not None:
            raise ValueError("plan(steps=...) is for a loader with steps=; this one runs epochs: plan(epoch)")
        return self.samplers(1)[0].plan(epoch_arg(epoch), 0, memory_limit())

    def start(self, engine: Any, prepared: tuple[int, int], devices: int, fail_at: int, indices: list[int]) -> Any:
        epoch, start = prepared
        run = engine.start_plans([s.make_plan(epoch, start) for s in self.samplers(devices)], fail_at, indices)
        self._begun(run, devices, epoch, start)
        return run

    def run_order(self) -> RunOrder:
        return _no_order(self.source)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["packing"] = self.source.state_key()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if isinstance(state, dict) and state.get("mode") == "pack_stream":
            raise ValueError("state was saved by a loader with steps= over fl.Pack; this loader runs epochs: the "
                             "order would differ")
        if isinstance(state, dict) and "position" in state:
            _check_packing(state, self.source)
            # Positions count packed rows, which split="split" can make more than documents.
            position = state_int(state, "position", 0, 2**62, "2**62")
            super().load_state_dict({**{k: v for k, v in state.items() if k != "packing"}, "position": 0})
            self.pending = (self.pending[0], position)
            return
        super().load_state_dict(state)  # its own errors for what is not a state

    def packing_stats(self) -> PackingStats:
        """The packing of the epoch whose counters stats() reports (the last run's, else the next)."""
        epoch = self.run.epoch if self.run is not None else self._epoch_now()
        return _stats(self.samplers(1)[0], epoch, self.source)


class PackStepSchedule(Schedule):
    """steps=N over the stream of packed rows: one run of global steps [0, N); each iter()
    continues from the first step no output has handed out yet."""

    def __init__(self, config: LoaderConfig, source: Any, lock: threading.RLock):
        super().__init__(config, source, lock)
        self.anchor = (config.global_batch(), 0, 0)  # (G, origin step, stream position there)
        self.base = (0, 0)  # the first epoch PackEpochs plans from, and where it starts
        self._epochs: Any = None
        self.resume_step: int | None = None  # a loaded state's step, until a run starts

    def epochs(self) -> Any:
        if self._epochs is None:
            self._epochs = self._sampler().stream(*self.base)
        return self._epochs

    def _sampler(self) -> Any:
        return _sampler(self.config, self.source, self.seed, 1, 0)

    def length(self) -> int:
        return self.config.steps

    def set_epoch(self, epoch: Any) -> None:
        raise ValueError(f"a loader with steps={self.config.steps} has no epochs: each iter() continues with the next "
                         "step not handed out yet (state_dict()/load_state_dict() resume anywhere)")

    def next_step(self) -> int:
        if self.run is not None and not self.run.superseded:
            return self.position()
        return self.resume_step or 0

    def position_of(self, step: int, anchor: tuple[int, int, int] | None = None) -> int:
        g, origin, position = anchor or self.anchor
        return position + (step - origin) * g

    def anchor_for(self, global_batch: int, step: int) -> tuple[int, int, int]:
        if self.anchor[0] == global_batch:
            return self.anchor
        return (global_batch, step, self.position_of(step))

    def plan(self, epoch: Any, steps: Any) -> np.ndarray:
        if epoch is not None:
            raise ValueError(f"a loader with steps= has no epochs: plan() gives all {self.config.steps} steps, "
                             f"plan(steps=(first, end)) a range; got epoch={epoch!r}")
        first, end = (0, self.config.steps) if steps is None else step_range(steps)
        c = self.config
        with self.lock:
            g, origin, position = self.anchor_for(c.global_batch(), self.next_step())
            if first < origin:
                raise ValueError(f"steps before {origin} were scheduled with another global batch size (the schedule "
                                 f"was re-anchored there); got steps from {first}")
            if (end - first) * c.batch_size * 8 > memory_limit():
                raise MemoryError(f"plan of {end - first} steps holds more packed-row ids than this machine's memory")
            return self.epochs().ids(origin, position, c.batch_size, c.world_size, c.rank, first, end)

    def prepare(self, devices: int) -> tuple[int, tuple[int, int, int]]:
        first = self.next_step()
        return first, self.anchor_for(self.config.global_batch(devices), first)

    def start(self, engine: Any, prepared: tuple[int, tuple[int, int, int]], devices: int, fail_at: int,
              indices: list[int]) -> Any:
        first, anchor = prepared
        c = self.config
        end = max(first, c.steps)
        replicas = c.replicas(devices)
        epochs = self.epochs()
        plans = [epochs.make_plan(anchor[1], anchor[2], c.batch_size, replicas, c.rank * devices + d, first, end, 0,
                                  self.seed)
                 for d in range(devices)]
        run = engine.start_plans(plans, fail_at, indices)
        self.anchor = anchor
        self.resume_step = None
        self._begun(run, devices, 0, first)
        return run

    def run_order(self) -> RunOrder:
        return _no_order(self.source)

    def state_dict(self) -> dict[str, Any]:
        c = self.config
        step = self.next_step()
        g, origin, position = self.anchor
        at = self.position_of(step)
        epoch, epoch_start = self.epochs().epoch_at(at)
        return {"version": PACK_STATE_VERSION, "mode": "pack_stream", "num_samples": len(self.source),
                "packing": self.source.state_key(), "seed": self.seed, "shuffle": c.shuffle, "order": c.order,
                "steps": c.steps, "step": step, "position": at, "epoch": epoch, "epoch_start": epoch_start,
                "batch_size": c.batch_size, "world_size": self.replicas, "global_batch_size": g}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
        if state.get("mode") != "pack_stream":
            raise ValueError("state was not saved by a loader with steps= over fl.Pack: the order would differ")
        missing = [k for k in ("version", "num_samples", "packing", "seed", "shuffle", "order", "step", "position",
                               "epoch", "epoch_start", "global_batch_size") if k not in state]
        if missing:
            raise ValueError(f"state is missing {missing}; was it made by Loader.state_dict()?")
        if state["version"] != PACK_STATE_VERSION or isinstance(state["version"], bool):
            raise ValueError(f"state version {state['version']!r} is not supported (this fastload reads version "
                             f"{PACK_STATE_VERSION})")
        if state["num_samples"] != len(self.source):
            raise ValueError(f"state was saved for {state['num_samples']!r} documents; this loader's Pack has "
                             f"{len(self.source)}: refusing to resume on other data")
        _check_packing(state, self.source)
        c = self.config
        if state_bool(state, "shuffle") != c.shuffle or (c.shuffle and state["order"] != c.order):
            raise ValueError(f"state was saved with shuffle={state['shuffle']}, order={state['order']!r}; this loader "
                             f"has shuffle={c.shuffle}, order={c.order!r}: the order would differ")
        step = state_int(state, "step", 0, 2**62, "2**62")
        position = state_int(state, "position", 0, 2**62, "2**62")
        epoch = state_int(state, "epoch", 0, 2**62, "2**62")
        epoch_start = state_int(state, "epoch_start", 0, position, "the state's position")
        g = state_int(state, "global_batch_size", 1, _C.MAX_GLOBAL_BATCH, "2**40")
        self.seed = state_int(state, "seed", 0, 2**64 - 1, "2**64 - 1")
        self.supersede()
        self.anchor = (g, step, position)
        self.base = (epoch, epoch_start)
        self._epochs = None
        self.resume_step = step

    def packing_stats(self) -> PackingStats:
        epoch, _ = self.epochs().epoch_at(self.position_of(self.next_step()))
        return _stats(self._sampler(), epoch, self.source)


def make_pack_schedule(config: LoaderConfig, source: Any, lock: threading.RLock) -> Schedule:
    if config.steps is not None:
        return PackStepSchedule(config, source, lock)
    return PackEpochSchedule(config, source, lock)

