"""The Loader: argument checking and the per-batch hand-off from the native pipeline to torch.

Everything per sample happens in C++ on native threads; per batch, Python makes one call into
the core and wraps each column's memory as a tensor (DLPack, no copy).
"""
from __future__ import annotations

import threading
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from . import _C, _lifecycle
from ._arguments import _as_int, check_batch_limits, check_loader_limits, memory_limit
from ._environment import default_num_threads, resolve_device, resolve_rank
from ._dataloader_args import refuse_dataloader_args
from ._mix import Mix
from ._python_source import PythonSource
from ._workers import WorkerProcesses
from ._source import Source, as_source, batch_layout, check_fingerprint, fingerprint
from ._state import check_state, check_stream_state, make_state, make_stream_state
from ._stats import LoaderStats, SourceStats
from ._stream import Anchor, Resume, Stand, Stream, StreamRuns, StreamSources, weights_text

_EVEN: tuple[str, ...] = tuple(_C.EVEN_POLICIES)
_ORDER: tuple[str, ...] = tuple(_C.ORDERS)
_PARTITION: tuple[str, ...] = tuple(_C.PARTITIONS)
_WORKERS = ("threads", "processes")
_MAX_SEED = 2**64 - 1
_MAX_STEPS = 2**62
# prefetch=None: as many batches as fit in this budget, at most PREFETCH_MAX, and never fewer
# than keep every stage busy (see default_prefetch). Small batches come every few µs, and a deeper
# window lets the consumer take several per wake-up. Large ones want few: batches that fit in
# about half the last-level cache are written and reused there, and every batch beyond that
# costs a trip through DRAM (on the benchmark's 32 MiB L3, 150 KiB-row batches of 9.8 MB reach
# 0.88x of the copy ceiling with 2 in flight against 0.69x with 4; bench/RESULTS.md).
PREFETCH_BUDGET_BYTES = 16 << 20
PREFETCH_MIN = 2
PREFETCH_MAX = 32


def default_prefetch(batch_bytes: int, num_threads: int, copy_streams: int = 0) -> int:
    """Batches in flight per device when prefetch is not given: as many as fit in
    PREFETCH_BUDGET_BYTES (at most PREFETCH_MAX), but at least one per collation thread plus one per
    copy stream on a GPU (each thread builds a whole batch, and a batch being copied keeps its
    place), and at least PREFETCH_MIN. The per-thread floor stops at a quarter of the machine's
    memory: with huge batches, idle threads are better than a default that cannot be allocated.
    `batch_bytes`: one full batch over every part (fastload._C.BatchLayout.batch_bytes)."""
    batch = max(1, batch_bytes)
    fits = memory_limit() // (4 * batch)
    busy = max(PREFETCH_MIN, min(num_threads + copy_streams, fits))
    return max(busy, min(PREFETCH_MAX, PREFETCH_BUDGET_BYTES // batch))


# Samples per block for order="block": large enough that a block is a long sequential read.
_BLOCK_SIZE = 4096
# order="block" over shards: samples are shuffled within windows of this many consecutive shards
# (more small ones until a window holds _BLOCK_SIZE samples).
_WINDOW_SHARDS = 4


# One output's batches of one epoch, in order, as dict[str, torch.Tensor]; next() is native (see
# csrc/bindings/loader_binding.h): a Ctrl-C can never fall between taking a batch and handing it
# over. On a GPU each batch is ready on the stream that was current when next() was called.
LoaderIterator = _C.Iterator


def _finished(run: Any, outputs: int) -> bool:
    return min(run.handed(d) for d in range(outputs)) >= run.num_batches(0)


def _position(run: Any, outputs: int) -> int:
    """Global position after the steps handed out on every output."""
    return run.position_after(0, min(run.handed(d) for d in range(outputs)))


class Loader:
    """Batches from a Dataset or Windows source, sampled and collated by native threads and, for a
    GPU, copied to the device ahead of time on the loader's own CUDA streams.

    Iterate it for one epoch of ``dict[str, torch.Tensor]`` batches (one entry per column, plus
    "index" with ``with_index`` and "valid" with ``even="mask"``). The sample order is a pure
    function of (len(source), seed, epoch, batch_size, world_size, rank, shuffle, order, even,
    drop_last) and the resume position; threads, prefetch and timing never change it.

    Args:
        source: a ``fastload.Dataset``, ``fastload.Windows``, dataset directory, map-style Python
            dataset, or a ``fastload.Mix`` of several (each in a set share of every batch).
        batch_size: samples per batch on each device (the global batch is batch_size x
            world_size, x devices after split()).
        shuffle: a seeded permutation per epoch (O(1) memory); else the source's order.
        seed: the permutation's seed, an integer in [0, 2**64).
        drop_last: drop the epoch's final, shorter step instead of splitting it evenly.
        order: with shuffle, "random" (any sample next to any) or "block" (blocks of 4096
            consecutive samples shuffled, then shuffled within: locality when data > RAM).
        rank, world_size: this process's data-parallel rank and their number; both or neither.
            None: process_group, else torch.distributed if initialised, else RANK/WORLD_SIZE,
            else 0 and 1 (resolved once, here).
        process_group: a torch.distributed group to take rank and world size from.
        even: how every rank gets the same number of batches when the dataset does not divide:
            "pad" (repeat a few samples), "drop" (cut the remainder), "mask" (pad, and a bool
            "valid" column that is False on the padding).
        device: None (cuda:LOCAL_RANK if PyTorch sees a GPU, else "cpu"), "cpu", "cuda",
            "cuda:N" or a torch.device. "cuda" gets its index here, without initialising CUDA:
            PyTorch's current device if CUDA is initialised, else LOCAL_RANK if set, else 0 (so
            `.device` is always "cpu" or "cuda:N"). A GPU loader touches the CUDA driver only at
            its first iter(); batches are ready on torch.cuda.current_stream() at next().
        num_threads: collation threads. None: the CPUs this process may use, divided among this
            job's processes on the node (LOCAL_WORLD_SIZE and what other launchers tell).
        prefetch: batches per device being built, copied or waiting for you. None: as many as fit
            in 16 MiB, at most 32, but at least one per thread (plus one per copy stream on a
            GPU) and at least 2. Loader-held memory is bounded by it.
        streams: host-to-device copy streams per GPU (no effect on the CPU).
        with_index: add "index", the int64 sample ids of each batch.
        partition: "samples" (any sample to any rank; elastic) or "shards" (whole shards of a
            sharded source per rank, balanced by rows: reads stay local; resumes mid-epoch only
            at the same world size).
        steps: train for exactly this many full batches, across as many epochs of each source as
            it takes (len(loader) == steps; each iter() continues with the next step; no
            set_epoch). A Mix without steps= has epochs of ceil(len(mix) / global batch) steps.

    Methods: ``set_epoch(e)``, ``len()``, ``plan(epoch)``, ``split(devices)``, ``state_dict()``,
    ``load_state_dict(sd)``, ``stats()``, ``close()``; see each one's help and docs/api.md.
    """

    def __init__(self, source: Any, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, order: str = "random", rank: int | None = None,
                 world_size: int | None = None, process_group: Any = None, even: str = "pad",
                 device: Any = None, num_threads: int | None = None, prefetch: int | None = None,
                 streams: int = 1, with_index: bool = False, partition: str = "samples",
                 num_workers: int | None = None, workers: str = "threads", pad: Any = None, max_length: Any = None,
                 collate_fn: Any = None, worker_init_fn: Any = None, timeout: float | None = None,
                 pin_memory: bool | None = None, persistent_workers: bool | None = None, steps: int | None = None,
                 **dataloader_args: Any):
        refuse_dataloader_args(dataloader_args)
        self._batch_size = _as_int("batch_size", batch_size)
        if self._batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {self._batch_size}")
        self._seed = _as_int("seed", seed)
        if not 0 <= self._seed <= _MAX_SEED:
            raise ValueError(f"seed must be in [0, 2**64), got {self._seed}")
        for name, flag in (("shuffle", shuffle), ("drop_last", drop_last), ("with_index", with_index)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{name} must be a bool, got {flag!r}")
        if order not in _ORDER:
            raise ValueError(f"order must be one of {_ORDER}, got {order!r}")
        if even not in _EVEN:
            raise ValueError(f"even must be one of {_EVEN}, got {even!r}")
        self._steps = None if steps is None else _as_int("steps", steps)
        if self._steps is not None and not 0 < self._steps <= _MAX_STEPS:
            raise ValueError(f"steps must be a positive number of batches (at most 2**62), got {self._steps}")
        if prefetch is not None:
            prefetch = _as_int("prefetch", prefetch)
            if prefetch <= 0:
                raise ValueError(f"prefetch must be positive, got {prefetch}")
        self._streams = _as_int("streams", streams)
        if self._streams <= 0:
            raise ValueError(f"streams must be positive, got {self._streams}")
        if num_threads is not None and num_workers is not None:
            raise ValueError(f"num_threads and num_workers name the same thing (the threads or processes that build "
                             f"batches); give one, got num_threads={num_threads!r} and num_workers={num_workers!r}")
        threads_given = num_workers if num_threads is None else num_threads
        threads_name = "num_threads" if num_workers is None else "num_workers"
        threads = default_num_threads() if threads_given is None else _as_int(threads_name, threads_given)
        if threads <= 0:
            raise ValueError(f"{threads_name} must be positive, got {threads}"
                             + (" (fastload has no main-process mode: 1 runs one worker thread)" if threads == 0 else ""))
        if workers not in _WORKERS:
            raise ValueError(f"workers must be one of {_WORKERS}, got {workers!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        # A Mix is read through one native MixSource, or one PythonSource over its Python datasets.
        self._mix = source if isinstance(source, Mix) else None
        if self._mix is not None:
            source = self._mix.reader(pad=pad, max_length=max_length, collate_fn=collate_fn,
                                      worker_init_fn=worker_init_fn, seed=self._seed)
        else:
            source = as_source(source, pad=pad, max_length=max_length, collate_fn=collate_fn,
                               worker_init_fn=worker_init_fn, seed=self._seed)
        with_source = self._mix is not None and self._mix.with_source
        self._check_python_options(source, workers, bool(with_index), even, with_source)
        self._rank, self._world_size = resolve_rank(rank, world_size, process_group)
        if partition not in _PARTITION:
            raise ValueError(f"partition must be one of {_PARTITION}, got {partition!r}")
        self._shard_rows: list[int] = source.shard_rows or []
        if partition == "shards":
            if source.shard_rows is None:
                raise ValueError("partition='shards' needs a source with shard boundaries (shard_rows); "
                                 f"{source!r} has none")
            shards = sum(1 for r in self._shard_rows if r > 0)
            if shards < self._world_size:
                raise ValueError(f"partition='shards' needs at least world_size={self._world_size} non-empty "
                                 f"shards, got {shards}")
        stream = self._steps is not None or self._mix is not None
        if stream:
            self._check_stream_options(even, partition)
        self._partition = partition
        self._resume_replicas: int | None = None  # partition="shards": the world size a state needs
        self._device = resolve_device(device)
        check_batch_limits(source, batch_size=self._batch_size, world_size=self._world_size)
        # No batch holds more than min(batch_size, len(source)) rows (the contract's padding never
        # makes a rank's batch exceed the dataset), so buffers are sized for that. A stream's steps
        # are always full: a source that runs out starts its next epoch within the batch.
        max_rows = self._batch_size if stream else min(self._batch_size, len(source))
        native = source.native_source()
        layout = batch_layout(native, max_rows, bool(with_index), even == "mask", with_source)
        prefetch_origin = ""
        if prefetch is None:
            copy_streams = self._streams if self._device.type == "cuda" else 0
            prefetch = default_prefetch(layout.batch_bytes(max_rows), threads, copy_streams)
            prefetch_origin = f" (the default: at least one batch per thread, num_threads={threads})"
        self._prefetch = prefetch
        check_loader_limits(source, batch_size=self._batch_size, world_size=self._world_size, prefetch=self._prefetch,
                            num_threads=threads, streams=self._streams, batch_bytes=layout.batch_bytes(max_rows),
                            prefetch_origin=prefetch_origin)
        self._fingerprint = fingerprint(source)  # where the bytes are: checked at every iter()/split()
        self._source = source
        self._shuffle, self._drop_last, self._with_index = bool(shuffle), bool(drop_last), bool(with_index)
        self._order, self._even = order, even
        self._num_threads = threads
        self._names = list(layout.names)
        self._native = native
        self._workers: WorkerProcesses | None = None
        if workers == "processes":
            self._workers = WorkerProcesses(source, threads)  # pickles the dataset now: errors come early
        self._engine = _C.Engine(native, max_rows, threads, self._prefetch, self._with_index, even == "mask",
                                 self._streams, self._workers.memory if self._workers else None, with_source)
        if timeout:
            self._engine.set_timeout(float(timeout))
        # Step-based mode (steps=): the stream, its anchor and its runs (see _stream.py).
        self._runs: StreamRuns | None = None
        if stream:
            sources = self._mix.stream_sources() if self._mix is not None else StreamSources.single(source)
            self._runs = StreamRuns(Stream(sources, seed=self._seed, shuffle=self._shuffle, order=order),
                                    self._steps, len(self._mix if self._mix is not None else source))
        self._run_anchor: Anchor | None = None  # the schedule the running stream run uses
        self._run: Any = None  # the running epoch (_C.Epoch)
        self._outputs = 1  # iterators of the running epoch (devices after split)
        self._run_start = 0  # the running epoch's start position (non-zero after a resume)
        # Loader methods may be called from several threads: epochs and state change under it.
        self._lock = threading.RLock()
        self._pending: tuple[int, int] | None = None  # (epoch, start position) for the next iter()
        self._last_epoch = -1
        self._replicas = self._world_size  # data-parallel consumers: world_size x devices per rank
        self._fail_at_batch = -1  # test hook: a collation thread raises on this batch
        # Test hook: GPU batches as raw device parts read back through the driver (the stand-in
        # driver's "device" memory is host memory that torch cannot import as CUDA).
        self._raw_device_batches = False
        # Test hook: GPU batches as CPU tensors over the stand-in driver's "device" memory, made by
        # torch's own DLPack import (so torch's deleter runs the release path in CI).
        self._standin_tensors = False
        # Test hook: with raw device batches or stand-in tensors, the consumer stream next() makes
        # a batch ready on (a stream handle of the stand-in driver; 0: the legacy default stream).
        self._test_stream = 0
        _lifecycle.register(self)

    @staticmethod
    def _check_python_options(source: Any, workers: str, with_index: bool, even: str, with_source: bool = False) -> None:
        python = isinstance(source, PythonSource)
        if workers == "processes" and not python:
            raise ValueError("workers='processes' runs a Python dataset's __getitem__ in worker processes; "
                             f"{type(source).__name__} is gathered natively by threads")
        if python and (with_index or even == "mask" or with_source) and (source.collates or not source.dict_samples):
            what = "with_index=True" if with_index else "even='mask'" if even == "mask" else "Mix(with_source=True)"
            how = "with collate_fn" if source.collates else "with samples that are not dicts"
            raise ValueError(f"{what} adds 'index'/'valid' to each batch dict; that is not possible {how}: "
                             "return a dict from __getitem__")

    @staticmethod
    def _check_stream_options(even: str, partition: str) -> None:
        what = "steps= or a Mix (step-based sampling)"
        if even == "mask":
            raise ValueError(f"even='mask' has nothing to mask with {what}: every step is full, a source that runs "
                             "out starts its next epoch within the batch; use even='pad' (the default)")
        if partition == "shards":
            raise ValueError(f"partition='shards' is not available with {what}: a stream deals every step's samples "
                             "to all ranks; use partition='samples'")

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def num_threads(self) -> int:
        return self._num_threads

    @property
    def dataset(self) -> Any:
        """The source as given (a Mix too)."""
        return self._mix if self._mix is not None else self._source

    # ------------------------------------------------------------------ sampling
    def _samplers(self, devices: int) -> list[Any]:
        world = self._world_size * devices
        return [_C.Sampler(len(self._source), self._batch_size, world, self._rank * devices + d, self._seed,
                           self._shuffle, self._order, self._even, self._drop_last, _BLOCK_SIZE,
                           self._partition, self._shard_rows, _WINDOW_SHARDS)
                for d in range(devices)]

    def __len__(self) -> int:
        """Batches per epoch that one iterator yields: this rank's batches with iter(); after
        split(devices), each device's batches (the same for every device), until an iter()
        without split() again. len() of an iterator gives its remaining batches. With steps=N: N."""
        if self._runs is not None:
            if self._steps is not None:
                return self._steps
            return self._runs.steps_per_epoch(self._batch_size * self._world_size * self._outputs)
        return self._samplers(self._outputs)[0].num_batches(0)

    def plan(self, epoch: int | None = None, *, steps: tuple[int, int] | None = None) -> np.ndarray:
        """This rank's sample ids for an epoch, in the order its batches hold them (int64). With
        steps=N: plan() gives the whole run's, plan(steps=(a, b)) those of global steps [a, b)."""
        if self._runs is not None:
            return self._stream_plan(epoch, steps)
        if steps is not None:
            raise ValueError("plan(steps=...) is for a loader with steps= (or a Mix); this one runs epochs: plan(epoch)")
        if epoch is None:
            raise TypeError("plan() needs the epoch: plan(epoch)")
        epoch = _as_int("epoch", epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        return self._samplers(1)[0].plan(epoch, 0, memory_limit())

    def _stream_plan(self, epoch: int | None, steps: tuple[int, int] | None) -> np.ndarray:
        runs = self._runs
        assert runs is not None
        g = self._batch_size * self._world_size
        if self._steps is not None:
            if epoch is not None:
                raise ValueError(f"a loader with steps= has no epochs: plan() gives all {self._steps} steps, "
                                 f"plan(steps=(first, end)) a range; got epoch={epoch!r}")
            first, end = (0, self._steps) if steps is None else self._step_range(steps)
        else:
            if steps is not None:
                first, end = self._step_range(steps)
            else:
                if epoch is None:
                    raise TypeError("plan() needs the epoch: plan(epoch)")
                epoch = _as_int("epoch", epoch)
                if epoch < 0:
                    raise ValueError(f"epoch must be non-negative, got {epoch}")
                spe = runs.steps_per_epoch(g)
                first, end = epoch * spe, (epoch + 1) * spe
        with self._lock:
            anchor = runs.stream.anchor_for(g)
            if first < anchor.origin:
                raise ValueError(f"steps before {anchor.origin} were scheduled with another global batch size or other "
                                 f"weights (the schedule was re-anchored there); got steps from {first}")
            sampler = runs.stream.sampler(anchor, self._batch_size, self._world_size, self._rank)
        return sampler.plan(first, end, memory_limit())

    @staticmethod
    def _step_range(steps: Any) -> tuple[int, int]:
        if not isinstance(steps, (tuple, list)) or len(steps) != 2:
            raise ValueError(f"steps must be (first, end), a range of global steps, got {steps!r}")
        first, end = _as_int("steps[0]", steps[0]), _as_int("steps[1]", steps[1])
        if not 0 <= first <= end <= _MAX_STEPS:
            raise ValueError(f"steps must be (first, end) with 0 <= first <= end, got {steps!r}")
        return first, end

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iter() run this epoch (from the resumed position, if it is the one
        load_state_dict restored)."""
        if self._steps is not None:
            raise ValueError(f"a loader with steps={self._steps} has no epochs: each iter() continues with the next "
                             "step not handed out yet (state_dict()/load_state_dict() resume anywhere)")
        epoch = _as_int("epoch", epoch)
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        with self._lock:
            if self._runs is not None and self._runs.resume is not None and self._runs.resume.epoch == epoch:
                return
            if self._pending is not None and self._pending[0] == epoch:
                return
            if self._runs is not None:
                self._runs.resume = None
            self._pending = (epoch, 0)

    # ------------------------------------------------------------------ iteration
    def _check_usable(self) -> None:
        if self._engine is None:
            raise RuntimeError("this Loader is closed")

    def _start(self, devices: list[torch.device]) -> list[LoaderIterator]:
        _C._park_if_exiting()  # a daemon thread starting an epoch at interpreter exit stops here
        with self._lock:
            self._check_usable()
            check_fingerprint(self._source, self._fingerprint)
            indices = [self._gpu_index(dev) for dev in devices]
            if self._runs is not None:
                stream_run = self._next_stream_run(len(devices))  # raises before anything changes
            elif self._pending is not None:
                epoch, start = self._pending
                replicas = self._world_size * len(devices)
                if start and self._resume_replicas not in (None, replicas):
                    raise ValueError(f"the state was saved with partition='shards' at world size {self._resume_replicas} "
                                     f"(ranks x devices); resuming at {replicas} is not supported: whole shards per "
                                     "rank depend on the world size")
            elif self._run is not None and all(self._run.handed(d) == 0 for d in range(self._outputs)):
                # An iter() nothing was taken from (Lightning calls one before training) does not
                # use up its epoch: the next iter() runs it again, from where it would have begun.
                epoch, start = self._run.epoch, self._run_start
            else:
                epoch, start = self._last_epoch + 1, 0
            if self._run is not None:
                self._run.superseded = True
            if self._workers is not None and not self._workers.started:
                fds, pids = self._workers.start()
                _C._attach_workers(self._native, fds, pids, self._workers.memory)
            if self._runs is not None:
                run = self._start_stream(stream_run, indices)
            else:
                run = self._engine.start(self._samplers(len(devices)), epoch, start, self._fail_at_batch, indices)
                self._run_start = start
                self._last_epoch = epoch
            self._pending = None
            self._run, self._outputs = run, len(devices)
            self._replicas = self._world_size * len(devices)
            return [LoaderIterator(self, self._engine, run, d, i, self._raw_device_batches, self._test_stream,
                                   self._standin_tensors)
                    for d, i in enumerate(indices)]

    def _next_stream_run(self, devices: int) -> tuple[int, int, int, Anchor, list[Any]]:
        """(epoch, first step, end step, anchor, one sampler per device) of a step-based loader's
        next run (under self._lock); changes nothing."""
        runs = self._runs
        assert runs is not None
        replicas = self._world_size * devices
        stand, rerun = None, None
        if self._run is not None:
            stand = Stand(self._run_anchor, _position(self._run, self._outputs))
            if all(self._run.handed(d) == 0 for d in range(self._outputs)):
                rerun = (self._run.epoch, self._run_start)
        epoch, first, end, anchor = runs.start(self._batch_size * replicas, stand=stand,
                                               pending_epoch=self._pending[0] if self._pending else None,
                                               rerun=rerun, next_epoch=self._last_epoch + 1)
        samplers = [runs.stream.sampler(anchor, self._batch_size, replicas, self._rank * devices + d)
                    for d in range(devices)]
        return epoch, first, end, anchor, samplers

    def _start_stream(self, stream_run: tuple[int, int, int, Anchor, list[Any]], indices: list[int]) -> Any:
        epoch, first, end, anchor, samplers = stream_run
        run = self._engine.start_stream(samplers, first, end, epoch, self._fail_at_batch, indices)
        self._runs.begun(anchor)
        self._run_start, self._run_anchor, self._last_epoch = first, anchor, epoch
        return run

    def _gpu_index(self, device: torch.device) -> int:
        """-1 for the CPU; else the GPU's index, after checking (at the first GPU iter(), never
        at construction) that fastload's driver and PyTorch can both use it."""
        if device.type != "cuda":
            return -1
        index = device.index  # resolve_device always gives one
        count = _C.cuda_device_count()  # loads the driver; RuntimeError says why it cannot
        if not 0 <= index < count:
            raise ValueError(f"device {device} does not exist: the CUDA driver sees {count} device(s)")
        if not (self._raw_device_batches or self._standin_tensors) and not torch.cuda.is_available():
            raise RuntimeError(
                f"fastload's CUDA driver sees {count} device(s) but PyTorch sees none, so batches could "
                "not become torch tensors; is this PyTorch a CPU-only build?")
        return index

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self._start([self._device])[0]

    def split(self, devices: Sequence[Any]) -> list[LoaderIterator]:
        """Starts the next epoch as one iterator per device, sharing this loader's threads.

        Each device gets batch_size samples of every global step (a step is batch_size x
        len(devices) x world_size samples), disjoint from the other devices and ranks. Iterate
        each from its own thread, or round-robin from one.
        """
        if isinstance(devices, (str, torch.device)) or not isinstance(devices, Sequence) or not devices:
            raise ValueError(f"devices must be a non-empty list of devices, got {devices!r}")
        return self._start([resolve_device(d) for d in devices])

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """Where the next batch comes from: counts batches handed out (on every device after
        split), not batches built ahead."""
        with self._lock:
            if self._runs is not None:
                return self._stream_state()
            if self._pending is not None:
                epoch, position = self._pending
            elif self._run is None:
                epoch, position = self._last_epoch + 1, 0
            elif _finished(self._run, self._outputs):
                epoch, position = self._run.epoch + 1, 0
            else:
                epoch, position = self._run.epoch, _position(self._run, self._outputs)
            return make_state(num_samples=len(self._source), seed=self._seed, shuffle=self._shuffle,
                              order=self._order, even=self._even, drop_last=self._drop_last, epoch=epoch,
                              position=position, batch_size=self._batch_size, replicas=self._replicas,
                              partition=self._partition)

    def _stream_state(self) -> dict[str, Any]:
        runs = self._runs
        assert runs is not None
        st = runs.stream
        if runs.resume is not None:  # loaded, not started yet: the same state back
            return dict(runs.resume.state)
        replicas = self._replicas
        g = self._batch_size * replicas
        if self._run is None or self._pending is not None:
            anchor = st.anchor_for(g) if self._run is None else self._run_anchor
            epoch = 0 if self._steps is not None else (self._pending[0] if self._pending else self._last_epoch + 1)
            g = anchor.global_batch
            step = 0 if self._steps is not None else epoch * runs.steps_per_epoch(g)
            if step < anchor.origin:
                step = anchor.origin
        else:
            anchor = self._run_anchor
            step = _position(self._run, self._outputs)
            epoch = self._run.epoch
            if self._steps is None and _finished(self._run, self._outputs):
                epoch += 1
        base, shares = st.quotas(anchor.global_batch, anchor.weights)
        schedule = {"global_batch_size": anchor.global_batch, "weights": weights_text(anchor.weights),
                    "origin": anchor.origin, "base_positions": list(anchor.base_positions), "base": base,
                    "shares": shares, "phase": _C.mix_phase(self._seed)}
        src = st.sources
        return make_stream_state(names=list(src.names), num_samples=list(src.lengths), seed=self._seed,
                                 shuffle=self._shuffle, order=self._order, steps=self._steps, epoch=epoch, step=step,
                                 batch_size=self._batch_size, replicas=replicas,
                                 steps_per_epoch=None if self._steps is not None else runs.steps_per_epoch(g),
                                 schedule=schedule, positions=st.positions(anchor, step),
                                 weights_given=self._weights_given())

    def _weights_given(self) -> Any:
        return self._mix.given if self._mix is not None else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a state_dict(): the next iter() continues exactly where it stopped, also with
        another world size or batch size (from the same global sample position)."""
        with self._lock:
            self._check_usable()
            if self._runs is not None:
                self._load_stream_state(state)
                return
            state = check_state(state, num_samples=len(self._source), shuffle=self._shuffle, order=self._order,
                                partition=self._partition)
            # Whole shards per rank depend on the world size: a mid-epoch state resumes only at the
            # world size (ranks x devices) it was saved at; checked again when the epoch starts.
            saved = state.get("world_size")
            saved = int(saved) if isinstance(saved, (int, np.integer)) and not isinstance(saved, bool) else None
            if self._partition == "shards" and state["position"] and (saved is None or saved % self._world_size):
                raise ValueError(f"the state was saved mid-epoch with partition='shards' at world size {saved!r}; this "
                                 f"loader has world_size={self._world_size}: partition='shards' resumes mid-epoch only "
                                 "at the same world size")
            self._resume_replicas = saved if self._partition == "shards" else None
            self._seed = int(state["seed"])
            self._supersede()
            self._pending = (int(state["epoch"]), int(state["position"]))
            self._last_epoch = self._pending[0] - 1

    def _supersede(self) -> None:
        if self._run is not None:
            self._run.superseded = True
            self._run.cancel()
            self._run = None

    def _load_stream_state(self, state: dict[str, Any]) -> None:
        runs = self._runs
        assert runs is not None
        src = runs.stream.sources
        parsed = check_stream_state(state, names=list(src.names), num_samples=list(src.lengths),
                                    shuffle=self._shuffle, order=self._order)
        self._seed = runs.stream.seed = parsed["seed"]
        anchor = Anchor(parsed["anchor_batch"], parsed["weights"], parsed["origin"], tuple(parsed["base_positions"]))
        runs.resume = Resume(parsed["epoch"], parsed["step"], parsed["global_batch"], anchor,
                             tuple(parsed["positions"]), dict(state))
        self._supersede()
        self._pending = None
        self._last_epoch = parsed["epoch"] - 1

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Stops and joins the collation threads and the transfer engines. Batches already
        handed out stay valid (on the GPU too)."""
        with self._lock:
            engine, self._engine = self._engine, None
            if engine is None:
                return
            if self._run is not None:
                self._run.superseded = True
        workers, self._workers = getattr(self, "_workers", None), None
        if workers is not None:
            workers.shutdown_sockets()  # threads waiting on a worker wake up now
        engine.close()  # in a forked child this leaves the parent's threads alone
        if workers is not None:
            workers.stop()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def stats(self) -> LoaderStats:
        """Counters of the current epoch (since its iter()/split()) and the memory the loader
        holds; print it for a table. See LoaderStats for what each field means."""
        with self._lock:
            self._check_usable()
            memory = self._engine.memory()
            if self._run is None:
                zero = {"count": 0, "busy_s": 0.0, "p50_s": 0.0, "p99_s": 0.0}
                run = {"epoch": self._last_epoch + 1, "batches": 0, "samples": 0, "bytes": 0, "wait_s": 0.0,
                       "wall_s": 0.0, "ready_mean": 0.0, "collation": zero, "copy": {},
                       "num_threads": self._num_threads, "prefetch": self._prefetch, "streams": self._streams}
            else:
                run = self._engine.stats(self._run)
            return LoaderStats._from_native(run, memory, self._source_stats(run) if self._runs is not None else None)

    def _source_stats(self, run: dict[str, Any]) -> dict[str, SourceStats]:
        """Per source: samples handed out this run (counted natively at each hand-out, from the
        plan), and the stream's position in it at the next step (under self._lock)."""
        src = self._runs.stream.sources
        if self._run is None:
            samples = [0] * len(src.names)
            positions = self._stream_state()["positions"]
        else:
            samples = list(run.get("source_samples") or [run["samples"]])
            positions = self._run.stream_positions(0, min(self._run.handed(d) for d in range(self._outputs)))
        return {name: SourceStats(samples=k, epochs=p // n, position=p)
                for name, k, p, n in zip(src.names, samples, positions, src.lengths)}

    def _memory(self) -> dict[str, int]:
        """Bytes and buffers the loader's pools have allocated and not freed (batches users still
        hold included): host_bytes (pageable), pinned_bytes, device_bytes, and their counts."""
        self._check_usable()
        return self._engine.memory()

    def __repr__(self) -> str:
        return (f"Loader({self._source!r}, batch_size={self._batch_size}, shuffle={self._shuffle}, "
                f"rank={self._rank}/{self._world_size}, device={self._device}, num_threads={self._num_threads}, "
                f"prefetch={self._prefetch})")
