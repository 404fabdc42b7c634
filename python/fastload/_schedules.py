"""The Loader's three modes as objects with one interface: which batches each iter()/split() runs,
from where, and the resume state.

- EpochSchedule: epochs of one source (the native Sampler of each replica, csrc/core/sampler.h).
- StepSchedule: steps=N, one run of N global steps over an endless stream of the source(s).
- MixEpochSchedule: a Mix without steps=, epochs of ceil(len(mix) / global batch) steps of its stream.

Each keeps where the loader stands (the running epoch, the pending start, the last epoch) and
answers: length(), plan(), set_epoch(), prepare(devices) then start() (the next run's start
position, checked before anything changes, then the run), state_dict()/load_state_dict(), and
source_stats(). The Loader holds one and calls it under its lock (plan() takes it itself).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from . import _C
from ._arguments import as_int
from ._config import MAX_STEPS, LoaderConfig
from ._machine import memory_limit
from ._state import check_state, check_stream_state, make_state, make_stream_state
from ._stats import SourceStats
from ._stream_plan import Anchor, Resume, Stand, Stream, StreamRuns, StreamSources, weights_text


def epoch_arg(epoch: Any) -> int:
    if epoch is None:
        raise TypeError("plan() needs the epoch: plan(epoch)")
    epoch = as_int("epoch", epoch)
    if epoch < 0:
        raise ValueError(f"epoch must be non-negative, got {epoch}")
    return epoch


def step_range(steps: Any) -> tuple[int, int]:
    if not isinstance(steps, (tuple, list)) or len(steps) != 2:
        raise ValueError(f"steps must be (first, end), a range of global steps, got {steps!r}")
    first, end = as_int("steps[0]", steps[0]), as_int("steps[1]", steps[1])
    if not 0 <= first <= end <= MAX_STEPS:
        raise ValueError(f"steps must be (first, end) with 0 <= first <= end, got {steps!r}")
    return first, end


class RunOrder:
    """What a prefetcher needs of a run (Schedule.run_order()): this rank's sample ids step by
    step, from the step the consumer stood at when it was made, then the next epoch's; and how
    many of those steps the consumer has taken since. A step is one global step: every device's
    batch of it, in device order (one batch without split()). Ids index the sources end to end
    (a Mix's parts; `offsets` says where each one's start). Nothing is computed ahead: ids(first,
    end) computes just those steps (a prefetcher asks for a window at a time)."""

    def __init__(self, sources: tuple[Any, ...], offsets: tuple[int, ...], steps: int, boundary: int,
                 step_ids: Callable[[int, int], tuple[np.ndarray, np.ndarray]], position: Callable[[], int | None]):
        self.sources = sources  # the sources the ids index, in order (the Loader's source, or a Mix's parts)
        self.offsets = offsets  # where each source's ids start
        self.steps = steps  # steps in this order: the rest of the run, then the next epoch's (if any)
        self.boundary = boundary  # the first step of the next epoch (== steps when none follows)
        self._step_ids = step_ids
        self._position = position

    def ids(self, first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """(sample ids of steps [first, end), in order; the number of ids of each step)."""
        first, end = max(0, first), min(end, self.steps)
        if end <= first:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        return self._step_ids(first, end)

    def position(self) -> int | None:
        """Steps of this order handed out on every device; None once the run is over, abandoned
        or replaced (or for the order of a run not started yet)."""
        return self._position()


def _interleave(per_device: list[list[np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Per device, per step, its batch's ids -> one array in step order (devices in order within a
    step) and the ids per step."""
    steps = len(per_device[0])
    parts = [per_device[d][k] for k in range(steps) for d in range(len(per_device))]
    counts = np.array([sum(len(per_device[d][k]) for d in range(len(per_device))) for k in range(steps)],
                      dtype=np.int64)
    return (np.concatenate(parts).astype(np.int64, copy=False) if parts else np.empty(0, dtype=np.int64)), counts


class Schedule:
    """What every mode keeps: the running epoch (a _C.Epoch) and its outputs, the start position
    the next iter() takes (pending), and the last epoch run. Subclasses say which batches run."""

    def __init__(self, config: LoaderConfig, source: Any, lock: threading.RLock):
        self.config = config
        self.source = source
        self.seed = config.seed  # load_state_dict() may restore another
        self.lock = lock
        self.run: Any = None  # the running epoch (_C.Epoch)
        self.outputs = 1  # iterators of the running epoch (devices after split)
        self.run_start = 0  # the running epoch's start position (non-zero after a resume)
        self.pending: tuple[int, int] | None = None  # (epoch, start position) for the next iter()
        self.last_epoch = -1
        # set_epoch(the live run's epoch): (that run, its batches handed out then). If the next
        # iter() comes before another batch is taken from it, that iter() runs the epoch again
        # (a peek, then the usual `set_epoch(e); for batch in loader`); once batches were taken
        # after the call (Lightning: iter(), then set_epoch in on_train_epoch_start, then the
        # epoch's batches), the call was about the live iterator and the next iter() moves on.
        self.rerun_mark: tuple[Any, int] | None = None

    # ---------------------------------------------------------------- the interface
    def length(self) -> int:
        """Batches one iterator of the next run yields (after split(), each device's)."""
        raise NotImplementedError

    def plan(self, epoch: Any, steps: Any) -> np.ndarray:
        """This rank's sample ids for an epoch (or a range of steps), in batch order."""
        raise NotImplementedError

    def set_epoch(self, epoch: Any) -> None:
        raise NotImplementedError

    def prepare(self, devices: int) -> Any:
        """Where the next run over `devices` outputs starts; changes nothing (raises first)."""
        raise NotImplementedError

    def start(self, engine: Any, prepared: Any, devices: int, fail_at: int, indices: list[int]) -> Any:
        """Starts the prepared run on the engine and records it; returns the run."""
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def load_state_dict(self, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def source_stats(self, run_stats: dict[str, Any]) -> dict[str, SourceStats] | None:
        """Per source counts of a step-based mode; None for epochs."""
        return None

    def run_order(self) -> RunOrder:
        """For a prefetcher (object storage): the running run's order from the step the consumer
        stands at, then the next epoch's; with no run started (or the last one over), the order of
        the run the next iter() starts (its position() is None; prepare() may raise)."""
        raise NotImplementedError

    def _position_of(self, run: Any) -> Callable[[], int | None]:
        """Steps of `run` handed out on every device since now; None once it is no longer live."""
        if run is None:
            return lambda: None
        outputs, at = self.outputs, min(run.handed(d) for d in range(self.outputs))

        def position() -> int | None:
            if self.run is not run or run.superseded:
                return None
            return min(run.handed(d) for d in range(outputs)) - at

        return position

    # ---------------------------------------------------------------- shared bookkeeping
    @property
    def replicas(self) -> int:
        """Data-parallel consumers of the last run: world_size x its devices."""
        return self.config.replicas(self.outputs)

    def handed(self) -> int:
        """Batches of the running epoch handed out on every output."""
        return min(self.run.handed(d) for d in range(self.outputs))

    def untouched(self) -> bool:
        """The running epoch exists and nothing was taken from it."""
        return self.run is not None and all(self.run.handed(d) == 0 for d in range(self.outputs))

    def reruns(self) -> bool:
        """Whether the next iter() runs the running epoch again from where it began: nothing was
        taken from it (Lightning makes an iterator once before training), or set_epoch named its
        epoch and nothing was taken since (a peek, then `set_epoch(e); for batch in loader`)."""
        if self.untouched():
            return True
        mark = self.rerun_mark
        return (mark is not None and mark[0] is self.run and not self.run.superseded and not self.finished()
                and self.handed() == mark[1])

    def mark_rerun(self) -> None:
        """set_epoch with the live run's epoch: nothing changes for the live iterator (state_dict
        keeps counting it); the next iter() reruns the epoch if no batch is taken before it."""
        self.pending = None  # the last call wins over an earlier one naming another epoch
        self.rerun_mark = (self.run, self.handed())

    def finished(self) -> bool:
        return self.handed() >= self.run.num_batches(0)

    def position(self) -> int:
        """Global position after the steps handed out on every output."""
        return self.run.position_after(0, self.handed())

    def live(self) -> bool:
        """Whether the running epoch is mid-way (batches handed out, more to come, not superseded):
        its iterator may still give the next batch, so state_dict() counts it even when set_epoch
        has chosen another epoch for the next iter()."""
        run = self.run
        return run is not None and not run.superseded and not self.finished() and self.handed() > 0

    def mark_superseded(self) -> None:
        if self.run is not None:
            self.run.superseded = True

    def supersede(self) -> None:
        """Cancels the running epoch (a state was loaded)."""
        self.rerun_mark = None
        if self.run is not None:
            self.run.superseded = True
            self.run.cancel()
            self.run = None

    def _begun(self, run: Any, devices: int, epoch: int, start: int) -> None:
        self.run, self.outputs = run, devices
        self.run_start, self.last_epoch = start, epoch
        self.pending = None
        self.rerun_mark = None


class EpochSchedule(Schedule):
    """Epochs of one source: epoch e is the native Sampler's plan of (seed, e) for each replica."""

    def __init__(self, config: LoaderConfig, source: Any, lock: threading.RLock):
        super().__init__(config, source, lock)
        self.shard_rows: list[int] = source.shard_rows or []
        self.resume_replicas: int | None = None  # partition="shards": the world size a state needs

    def samplers(self, devices: int) -> list[Any]:
        c = self.config
        world = c.replicas(devices)
        return [_C.Sampler(len(self.source), c.batch_size, world, c.rank * devices + d, self.seed, c.shuffle,
                           c.order, c.even, c.drop_last, _C.BLOCK_SIZE, c.partition, self.shard_rows,
                           _C.WINDOW_SHARDS)
                for d in range(devices)]

    def length(self) -> int:
        return self.samplers(self.outputs)[0].num_batches(0)

    def plan(self, epoch: Any, steps: Any) -> np.ndarray:
        if steps is not None:
            raise ValueError("plan(steps=...) is for a loader with steps= (or a Mix); this one runs epochs: plan(epoch)")
        return self.samplers(1)[0].plan(epoch_arg(epoch), 0, memory_limit())

    def set_epoch(self, epoch: Any) -> None:
        epoch = as_int("epoch", epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        with self.lock:
            if self.live() and self.run.epoch == epoch:
                self.mark_rerun()
                return
            self.rerun_mark = None
            if self.pending is not None and self.pending[0] == epoch:
                return
            self.pending = (epoch, 0)

    def prepare(self, devices: int) -> tuple[int, int]:
        if self.pending is not None:
            epoch, start = self.pending
            replicas = self.config.replicas(devices)
            if start and self.resume_replicas not in (None, replicas):
                raise ValueError(f"the state was saved with partition='shards' at world size {self.resume_replicas} "
                                 f"(ranks x devices); resuming at {replicas} is not supported: whole shards per "
                                 "rank depend on the world size")
            return epoch, start
        if self.reruns():
            # An iter() nothing was taken from (Lightning calls one before training), or whose
            # epoch set_epoch named before this iter(), does not use up its epoch: the next iter()
            # runs it again, from where it began.
            return self.run.epoch, self.run_start
        return self.last_epoch + 1, 0

    def start(self, engine: Any, prepared: tuple[int, int], devices: int, fail_at: int, indices: list[int]) -> Any:
        epoch, start = prepared
        run = engine.start(self.samplers(devices), epoch, start, fail_at, indices)
        self._begun(run, devices, epoch, start)
        return run

    def run_order(self) -> RunOrder:
        run = self.run if self.run is not None and not self.run.superseded else None
        if run is not None:
            devices, epoch, start, done = self.outputs, run.epoch, self.run_start, self.handed()
        else:
            devices, (epoch, start), done = 1, self.prepare(1), 0
        samplers = self.samplers(devices)
        steps = samplers[0].num_batches(epoch, start) - done
        following = samplers[0].num_batches(epoch + 1, 0)

        b = self.config.batch_size

        def epoch_ids(s: Any, e: int, at: int, first: int, end: int) -> list[np.ndarray]:
            """Batches [first, end) of epoch e's plan from position `at`: natively in one call (the
            GIL released) when they are most of what remains of the epoch, else one call per
            batch (a window of a long epoch, never its whole ids)."""
            left = s.num_batches(e, at)
            if 2 * (end - first) >= left - first:
                ids = s.plan(e, at)[first * b:end * b]
                return [ids[k * b:(k + 1) * b] for k in range(end - first)]
            return [s.batch_ids(e, at, k)[0] for k in range(first, end)]

        def step_ids(first: int, end: int) -> tuple[np.ndarray, np.ndarray]:
            per_device = []
            for s in samplers:
                batches = epoch_ids(s, epoch, start, done + first, done + min(end, steps)) if first < steps else []
                if end > steps:
                    batches += epoch_ids(s, epoch + 1, 0, max(first, steps) - steps, end - steps)
                per_device.append(batches)
            return _interleave(per_device)

        return RunOrder((self.source,), (0,), steps + following, steps, step_ids, self._position_of(run))

    def state_dict(self) -> dict[str, Any]:
        if self.pending is not None and not self.live():
            epoch, position = self.pending
        elif self.run is None:
            epoch, position = self.last_epoch + 1, 0
        elif self.finished():
            epoch, position = self.run.epoch + 1, 0
        else:
            epoch, position = self.run.epoch, self.position()
        c = self.config
        return make_state(num_samples=len(self.source), seed=self.seed, shuffle=c.shuffle, order=c.order,
                          even=c.even, drop_last=c.drop_last, epoch=epoch, position=position,
                          batch_size=c.batch_size, replicas=self.replicas, global_batch=c.global_batch(self.outputs),
                          partition=c.partition)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        c = self.config
        state = check_state(state, num_samples=len(self.source), shuffle=c.shuffle, order=c.order,
                            partition=c.partition)
        # Whole shards per rank depend on the world size: a mid-epoch state resumes only at the
        # world size (ranks x devices) it was saved at; checked again when the epoch starts.
        saved = state.get("world_size")
        saved = int(saved) if isinstance(saved, (int, np.integer)) and not isinstance(saved, bool) else None
        if c.partition == "shards" and state["position"] and (saved is None or saved % c.world_size):
            raise ValueError(f"the state was saved mid-epoch with partition='shards' at world size {saved!r}; this "
                             f"loader has world_size={c.world_size}: partition='shards' resumes mid-epoch only "
                             "at the same world size")
        self.resume_replicas = saved if c.partition == "shards" else None
        self.seed = int(state["seed"])
        self.supersede()
        self.pending = (int(state["epoch"]), int(state["position"]))
        self.last_epoch = self.pending[0] - 1


class StreamSchedule(Schedule):
    """What the step-based modes share: the stream over the sources (see _stream_plan.py), its anchor
    and its runs."""

    def __init__(self, config: LoaderConfig, source: Any, lock: threading.RLock, *, sources: StreamSources,
                 epoch_samples: int, weights_given: Any = None):
        super().__init__(config, source, lock)
        self.runs = StreamRuns(Stream(sources, seed=self.seed, shuffle=config.shuffle, order=config.order),
                               config.steps, epoch_samples)
        self.run_anchor: Anchor | None = None  # the schedule the running stream run uses
        self.run_samplers: list[Any] = []  # and its samplers (one per device), and its end step
        self.run_end = 0
        self.weights_given = weights_given
        self.parts: tuple[Any, ...] = (source,)  # the sources the stream's ids index (a Mix's parts)

    def run_order(self) -> RunOrder:
        run = self.run if self.run is not None and not self.run.superseded else None
        if run is not None:
            samplers, first, end = self.run_samplers, self.run_start + self.handed(), self.run_end
        else:
            _, first, end, _, samplers = self.prepare(1)
        # A Mix's next epoch is the next steps of the same stream; steps= has none.
        devices = len(samplers)
        following = 0 if self.config.steps is not None else self.runs.steps_per_epoch(self.config.global_batch(devices))

        def step_ids(a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
            per_device = [np.asarray(s.plan(first + a, first + b), dtype=np.int64).reshape(b - a, -1) for s in samplers]
            ids = np.stack(per_device, axis=1).reshape(-1)
            return ids, np.full(b - a, len(ids) // (b - a), dtype=np.int64)

        sources = self.stream.sources
        return RunOrder(self.parts, tuple(sources.offsets), end - first + following, end - first, step_ids,
                        self._position_of(run))

    @property
    def stream(self) -> Stream:
        return self.runs.stream

    # What differs between steps= and epochs of a stream.
    def _plan_range(self, epoch: Any, steps: Any) -> tuple[int, int]:
        raise NotImplementedError

    def _standing(self, anchor: Anchor) -> tuple[int, int, int | None]:
        """(epoch, step, steps_per_epoch) in the state of a loader with no run going on: the
        pending or next epoch's start, at the anchor's global batch."""
        raise NotImplementedError

    def _after_run(self, epoch: int) -> int:
        """The state's epoch while a run of `epoch` is running or done."""
        return epoch

    def plan(self, epoch: Any, steps: Any) -> np.ndarray:
        c = self.config
        first, end = self._plan_range(epoch, steps)
        g = c.global_batch()
        with self.lock:
            anchor = self.stream.anchor_for(g)
            if first < anchor.origin:
                raise ValueError(f"steps before {anchor.origin} were scheduled with another global batch size or other "
                                 f"weights (the schedule was re-anchored there); got steps from {first}")
            sampler = self.stream.sampler(anchor, c.batch_size, c.world_size, c.rank)
        return sampler.plan(first, end, memory_limit())

    def prepare(self, devices: int) -> tuple[int, int, int, Anchor, list[Any]]:
        """(epoch, first step, end step, anchor, one sampler per device) of the next run."""
        c = self.config
        replicas = c.replicas(devices)
        stand, rerun = None, None
        if self.run is not None:
            stand = Stand(self.run_anchor, self.position())
            if self.reruns():
                rerun = (self.run.epoch, self.run_start)
        epoch, first, end, anchor = self.runs.start(c.global_batch(devices), stand=stand,
                                                    pending_epoch=self.pending[0] if self.pending else None,
                                                    rerun=rerun, next_epoch=self.last_epoch + 1)
        samplers = [self.stream.sampler(anchor, c.batch_size, replicas, c.rank * devices + d)
                    for d in range(devices)]
        return epoch, first, end, anchor, samplers

    def start(self, engine: Any, prepared: tuple[int, int, int, Anchor, list[Any]], devices: int, fail_at: int,
              indices: list[int]) -> Any:
        epoch, first, end, anchor, samplers = prepared
        run = engine.start_stream(samplers, first, end, epoch, fail_at, indices)
        self.runs.begun(anchor)
        self.run_anchor = anchor
        self.run_samplers, self.run_end = samplers, end
        self._begun(run, devices, epoch, first)
        return run

    def state_dict(self) -> dict[str, Any]:
        runs, st, c = self.runs, self.stream, self.config
        if runs.resume is not None:  # loaded, not started yet: the same state back
            return dict(runs.resume.state)
        g = c.global_batch(self.outputs)
        if self.run is None or (self.pending is not None and not self.live()):
            anchor = st.anchor_for(g) if self.run is None else self.run_anchor
            epoch, step, steps_per_epoch = self._standing(anchor)
            if step < anchor.origin:
                step = anchor.origin
        else:
            anchor = self.run_anchor
            step = self.position()
            epoch = self._after_run(self.run.epoch)
            steps_per_epoch = self._steps_per_epoch(g)
        base, shares = st.quotas(anchor.global_batch, anchor.weights)
        schedule = {"global_batch_size": anchor.global_batch, "weights": weights_text(anchor.weights),
                    "origin": anchor.origin, "base_positions": list(anchor.base_positions), "base": base,
                    "shares": shares, "phase": _C.mix_phase(self.seed)}
        src = st.sources
        return make_stream_state(names=list(src.names), num_samples=list(src.lengths), seed=self.seed,
                                 shuffle=c.shuffle, order=c.order, steps=c.steps, epoch=epoch, step=step,
                                 batch_size=c.batch_size, replicas=self.replicas, global_batch=g,
                                 steps_per_epoch=steps_per_epoch,
                                 schedule=schedule, positions=st.positions(anchor, step),
                                 weights_given=self.weights_given)

    def _steps_per_epoch(self, g: int) -> int | None:
        return self.runs.steps_per_epoch(g)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        src = self.stream.sources
        parsed = check_stream_state(state, names=list(src.names), num_samples=list(src.lengths),
                                    shuffle=self.config.shuffle, order=self.config.order)
        self.seed = self.stream.seed = parsed["seed"]
        anchor = Anchor(parsed["anchor_batch"], parsed["weights"], parsed["origin"], tuple(parsed["base_positions"]))
        self.runs.resume = Resume(parsed["epoch"], parsed["step"], parsed["global_batch"], anchor,
                                  tuple(parsed["positions"]), dict(state))
        self.supersede()
        self.pending = None
        self.last_epoch = parsed["epoch"] - 1

    def source_stats(self, run_stats: dict[str, Any]) -> dict[str, SourceStats]:
        """Per source: samples handed out this run (counted natively at each hand-out, from the
        plan), and the stream's position in it at the next step."""
        src = self.stream.sources
        if self.run is None:
            samples = [0] * len(src.names)
            positions = self.state_dict()["positions"]
        else:
            samples = list(run_stats.get("source_samples") or [run_stats["samples"]])
            positions = self.run.stream_positions(0, self.handed())
        return {name: SourceStats(samples=k, epochs=p // n, position=p)
                for name, k, p, n in zip(src.names, samples, positions, src.lengths)}


class StepSchedule(StreamSchedule):
    """steps=N: one run of global steps [0, N) over the stream; each iter() continues from the
    first step no output has handed out yet; no epochs."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._check_steps_fit()

    def _check_steps_fit(self) -> None:
        """steps= must fit the stream at this global batch: each source's stream position (its
        samples so far, up to its quota + 1 per step) stays below 2**62. Checked at construction
        rather than at the first iter()."""
        steps, g = self.config.steps, self.config.global_batch()
        base, _ = self.stream.quotas(g)
        most = (MAX_STEPS - 1) // (max(base) + 1)
        if steps > most:
            raise ValueError(f"steps={steps} is more than a stream at global batch {g} (batch_size x world_size) "
                             f"can run: at most {most} steps (2**62 // {max(base) + 1}, every source's stream position "
                             "staying below 2**62)")

    def length(self) -> int:
        return self.config.steps

    def set_epoch(self, epoch: Any) -> None:
        raise ValueError(f"a loader with steps={self.config.steps} has no epochs: each iter() continues with the next "
                         "step not handed out yet (state_dict()/load_state_dict() resume anywhere)")

    def _plan_range(self, epoch: Any, steps: Any) -> tuple[int, int]:
        if epoch is not None:
            raise ValueError(f"a loader with steps= has no epochs: plan() gives all {self.config.steps} steps, "
                             f"plan(steps=(first, end)) a range; got epoch={epoch!r}")
        return (0, self.config.steps) if steps is None else step_range(steps)

    def _standing(self, anchor: Anchor) -> tuple[int, int, int | None]:
        return 0, 0, None

    def _steps_per_epoch(self, g: int) -> int | None:
        return None


class MixEpochSchedule(StreamSchedule):
    """A Mix without steps=: epoch e is steps [e*spe, (e+1)*spe) of the stream, spe = ceil(len(mix)
    / global batch); epochs follow the usual rules (set_epoch, an untouched iter() reruns its
    epoch, load_state_dict resumes the saved epoch)."""

    def length(self) -> int:
        return self.runs.steps_per_epoch(self.config.global_batch(self.outputs))

    def set_epoch(self, epoch: Any) -> None:
        epoch = as_int("epoch", epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        with self.lock:
            if self.runs.resume is not None and self.runs.resume.epoch == epoch:
                return
            if self.live() and self.run.epoch == epoch:
                self.mark_rerun()
                return
            self.rerun_mark = None
            if self.pending is not None and self.pending[0] == epoch:
                return
            self.runs.resume = None
            self.pending = (epoch, 0)

    def _plan_range(self, epoch: Any, steps: Any) -> tuple[int, int]:
        if steps is not None:
            return step_range(steps)
        epoch = epoch_arg(epoch)
        spe = self.runs.steps_per_epoch(self.config.global_batch())
        return epoch * spe, (epoch + 1) * spe

    def _standing(self, anchor: Anchor) -> tuple[int, int, int | None]:
        epoch = self.pending[0] if self.pending else self.last_epoch + 1
        spe = self.runs.steps_per_epoch(anchor.global_batch)
        return epoch, epoch * spe, spe

    def _after_run(self, epoch: int) -> int:
        return epoch + 1 if self.finished() else epoch


def make_schedule(config: LoaderConfig, source: Any, lock: threading.RLock, mix: Any = None) -> Schedule:
    """The mode of a Loader: steps= (over one source or a Mix), a Mix's epochs, or plain epochs
    (fl.Pack's packed rows have their own: _pack_schedule.make_pack_schedule)."""
    if not config.stepped:
        return EpochSchedule(config, source, lock)
    sources = mix.stream_sources() if mix is not None else StreamSources.single(source)
    kind = StepSchedule if config.steps is not None else MixEpochSchedule
    schedule = kind(config, source, lock, sources=sources, epoch_samples=len(mix if mix is not None else source),
                    weights_given=mix.given if mix is not None else None)
    if mix is not None:
        schedule.parts = tuple(mix.parts)
    return schedule
