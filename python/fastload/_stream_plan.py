"""Step-based sampling (steps=, and every Mix): the stream's sources and weights, where its
schedule is anchored, and the native StreamSampler of each replica (csrc/core/stream_plan.h).

A stream is endless: global step g holds each source's quota of the global batch G (the mixture
schedule), and every source is read in its own epochs one after another. The anchor says where
the schedule for a given G and weights starts: (origin step, each source's stream position
there). A loader keeps one anchor; another G or other weights (a resume with another batch size,
a curriculum, split() over another number of devices) re-anchor the schedule where the stream
had got to, so no sample repeats within its source epoch and none is skipped.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

from . import _C
from ._mix_quota import normalised, quotas

@dataclass(frozen=True)
class StreamSources:
    """What a stream reads: each source's name, length and shard rows, and the weights."""

    names: tuple[str, ...]
    lengths: tuple[int, ...]
    shard_rows: tuple[tuple[int, ...], ...]
    weights: tuple[Fraction, ...]  # normalised, exact

    @property
    def offsets(self) -> list[int]:
        out, at = [], 0
        for n in self.lengths:
            out.append(at)
            at += n
        return out

    @classmethod
    def single(cls, source: Any) -> "StreamSources":
        return cls(("0",), (len(source),), (tuple(source.shard_rows or ()),), (Fraction(1),))


@dataclass(frozen=True)
class Anchor:
    """Where the schedule of one global batch and one set of weights starts."""

    global_batch: int
    weights: tuple[Fraction, ...]
    origin: int
    base_positions: tuple[int, ...]


class Stream:
    """A loader's stream: its sources, order settings and current anchor."""

    def __init__(self, sources: StreamSources, *, seed: int, shuffle: bool, order: str):
        self.sources = sources
        self.seed, self.shuffle, self.order = seed, shuffle, order
        self.anchor: Anchor | None = None
        self._quotas: dict[tuple, tuple[list[int], list[int]]] = {}

    def quotas(self, global_batch: int, weights: Sequence[Fraction] | None = None) -> tuple[list[int], list[int]]:
        key = (global_batch, tuple(weights or self.sources.weights))
        if key not in self._quotas:
            self._quotas[key] = quotas(list(key[1]), global_batch)
        return self._quotas[key]

    def default_anchor(self, global_batch: int) -> Anchor:
        return Anchor(global_batch, self.sources.weights, 0, (0,) * len(self.sources.lengths))

    def anchor_for(self, global_batch: int) -> Anchor:
        """The current anchor if it is for this global batch and these weights, else the default
        one (origin 0) for it."""
        a = self.anchor
        if a is not None and a.global_batch == global_batch and a.weights == self.sources.weights:
            return a
        return self.default_anchor(global_batch)

    def sampler(self, anchor: Anchor, batch_size: int, replicas: int, rank: int) -> Any:
        """One replica's native StreamSampler; batch_size x replicas must be the anchor's global
        batch (the native schedule refuses quotas that do not add up to it)."""
        base, shares = self.quotas(anchor.global_batch, anchor.weights)
        s = self.sources
        return _C.StreamSampler(list(s.lengths), s.offsets, [list(r) for r in s.shard_rows], self.seed, self.shuffle,
                                self.order, _C.BLOCK_SIZE, _C.WINDOW_SHARDS, batch_size, replicas, rank, base, shares,
                                anchor.origin, list(anchor.base_positions))

    def positions(self, anchor: Anchor, step: int) -> list[int]:
        """Every source's stream position at the start of global step `step` of an anchor."""
        return list(self.sampler(anchor, anchor.global_batch, 1, 0).positions(step))


def weights_text(weights: Sequence[Fraction]) -> list[str]:
    """Exact weights as strings ("3/5"), for the resume state."""
    return [str(Fraction(w)) for w in weights]


def parse_weights(texts: Any, count: int) -> tuple[Fraction, ...]:
    if not isinstance(texts, (list, tuple)) or len(texts) != count:
        raise ValueError(f"state['schedule']['weights'] must be a list of {count} exact weights, got {texts!r}")
    try:
        return tuple(normalised([Fraction(str(t)) for t in texts]))
    except (ValueError, ZeroDivisionError) as e:
        raise ValueError(f"state['schedule']['weights'] are not exact weights: {texts!r} ({e})") from None


@dataclass(frozen=True)
class Resume:
    """A loaded stream state, until the next run starts from it."""

    epoch: int
    step: int
    global_batch: int
    anchor: Anchor
    positions: tuple[int, ...]
    state: dict


@dataclass(frozen=True)
class Stand:
    """Where a stream stands: the anchor, the next global step, and (if known) the positions there."""

    anchor: Anchor
    step: int
    positions: tuple[int, ...] | None = None


class StreamRuns:
    """The Loader's step-based mode: which steps each run covers, its anchor, and the resume state.

    steps=N: one run of global steps [0, N); each iter() continues from the first step no output
    has handed out yet. Without steps= (a Mix): epoch e is steps [e*spe, (e+1)*spe) of the same
    stream, spe = ceil(epoch_samples / G); epochs follow the Loader's usual rules (set_epoch,
    an untouched iter() reruns its epoch, load_state_dict resumes the saved epoch).
    """

    def __init__(self, stream: Stream, steps: int | None, epoch_samples: int):
        self.stream = stream
        self.steps = steps
        self.epoch_samples = epoch_samples
        self.resume: Resume | None = None

    def steps_per_epoch(self, global_batch: int) -> int:
        return -(-self.epoch_samples // global_batch)

    def start(self, global_batch: int, *, stand: Stand | None, pending_epoch: int | None, rerun: tuple[int, int] | None,
              next_epoch: int) -> tuple[int, int, int, Anchor]:
        """(epoch, first step, end step, anchor) of the next run at this global batch. stand: where
        the last run stopped (None before any); pending_epoch: set_epoch's; rerun: (epoch, first
        step) of a run nothing was taken from (it runs again); next_epoch: the epoch otherwise."""
        saved = self.resume
        if saved is not None:
            stand = Stand(saved.anchor, saved.step, saved.positions)
        if self.steps is not None:
            epoch, step, end = 0, (stand.step if stand is not None else 0), self.steps
        else:
            spe = self.steps_per_epoch(global_batch)
            if saved is not None:
                epoch = saved.epoch
                if saved.global_batch == global_batch:
                    step = saved.step
                else:  # the epoch's steps done so far, counted in the new global batch
                    done = saved.step - epoch * self.steps_per_epoch(saved.global_batch)
                    step = epoch * spe + min(spe, -(-done * saved.global_batch // global_batch))
            elif pending_epoch is not None:
                epoch, step = pending_epoch, pending_epoch * spe
            elif rerun is not None and stand is not None and stand.anchor.global_batch == global_batch:
                epoch, step = rerun
            else:
                epoch = rerun[0] if rerun is not None else next_epoch
                step = epoch * spe
            end = (epoch + 1) * spe
        anchor = self._anchor(global_batch, step, stand)
        if step < anchor.origin:
            raise ValueError(f"epoch {epoch} starts at global step {step}, before step {anchor.origin} where this "
                             "loader's schedule was re-anchored (another global batch size or other weights); "
                             "epochs before that cannot be run again")
        return epoch, step, max(step, end), anchor

    def begun(self, anchor: Anchor) -> None:
        """A run started with this anchor: it is the stream's from now on, and a loaded state is
        used up."""
        self.stream.anchor = anchor
        self.resume = None

    def _anchor(self, global_batch: int, step: int, stand: Stand | None) -> Anchor:
        """The anchor a run at this global batch starting at `step` uses (nothing is changed)."""
        st = self.stream
        weights = st.sources.weights
        if self.resume is not None:
            a = self.resume.anchor
            if a.global_batch == global_batch and a.weights == weights:
                return a
            return Anchor(global_batch, weights, step, self.resume.positions)
        a = st.anchor
        if a is not None and a.global_batch == global_batch and a.weights == weights:
            return a
        if stand is None:
            return st.default_anchor(global_batch)
        positions = stand.positions if stand.positions is not None else st.positions(stand.anchor, stand.step)
        return Anchor(global_batch, weights, step, tuple(int(p) for p in positions))
