"""The Loader: the per-batch hand-off from the native pipeline to torch.

Everything per sample happens in C++ on native threads; per batch, Python makes one call into
the core and wraps each column's memory as a tensor (DLPack, no copy). The arguments are resolved
once into a LoaderConfig (_config.py); which batches each iter() runs, and the resume state, are
the Loader's schedule's (_schedules.py: epochs, steps= or a Mix).
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from . import _C, _lifecycle
from ._config import LoaderConfig, check_arguments, default_prefetch, python_options, resolve  # noqa: F401
from ._dataloader_args import describe as describe_dataloader_args, refuse_dataloader_args
from ._environment import resolve_device
from ._machine import torch_sees_gpu
from ._sources.mix import Mix
from ._sources.python import PythonSource
from ._pack_schedule import make_pack_schedule
from ._schedules import Schedule, make_schedule
from ._workers.pool import WorkerProcesses
from ._sources.protocol import as_source, attach_storage, check_fingerprint, fingerprint, follow_run, member
from ._stats import LoaderStats

# One output's batches of one epoch, in order, as dict[str, torch.Tensor]; next() is native (see
# csrc/bindings/loader.cpp): a Ctrl-C can never fall between taking a batch and handing it
# over. On a GPU each batch is ready on the stream that was current when next() was called.
LoaderIterator = _C.Iterator


def _on_service_thread() -> bool:
    """Whether this thread serves some loader's collation: fastload's download and prefetch
    threads (named "fastload-..."), or a native thread calling into Python (a collation thread
    in __getitem__ or a decode thread: Python knows it only as a dummy thread)."""
    t = threading.current_thread()
    return t.name.startswith("fastload-") or isinstance(t, threading._DummyThread)


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
        order: with shuffle, "random" (any sample next to any; the default except for
            fl.Parquet, whose default is "block") or "block" (blocks of 4096
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
        num_threads: collation threads (worker threads or processes for a Python dataset). None:
            the CPUs this process may use, divided among this job's processes on the node
            (LOCAL_WORLD_SIZE and what other launchers tell). ``num_workers`` is accepted as an
            alias, for code written for torch's DataLoader; give one of the two.
        prefetch: batches per device being built, copied or waiting for you. None: as many as fit
            in 16 MiB, at most 32, but at least one per thread (plus one per copy stream on a
            GPU) and at least 2. Loader-held memory is bounded by it.
        copy_streams: host-to-device copy streams per GPU (no effect on the CPU). The old name
            ``streams=`` is still accepted, with a FutureWarning.
        with_index: add "index", the int64 sample ids of each batch.
        partition: "samples" (any sample to any rank; elastic) or "shards" (whole shards of a
            sharded source per rank, balanced by rows: reads stay local; resumes mid-epoch only
            at the same world size).
        steps: train for exactly this many full batches, across as many epochs of each source as
            it takes (len(loader) == steps; each iter() continues with the next step; no
            set_epoch). A Mix without steps= has epochs of ceil(len(mix) / global batch) steps.

    Python datasets only (``fastload.PythonSource`` takes them too; accepted here for code written
    for torch's DataLoader; see docs/python-datasets.md):
        workers: "threads" (default: the collation threads call __getitem__; for code that
            releases the GIL) or "processes" (spawned worker processes, started at the first
            iter() and kept; for pure-Python __getitem__; the dataset must be picklable).
        pad, max_length: {"field": pad value}, {"field": slot length}: a field whose first axis
            varies is padded to max_length (longer rows cut), plus "<field>_lengths"; give both.
        collate_fn: f(list of samples) -> the batch, instead of fastload's collation.
        worker_init_fn: f(worker_index), once in each worker thread or process.
        timeout: seconds a __getitem__ (a process worker's batch) may take before next() raises
            TimeoutError naming the sample (it also bounds each next() over any source). A thread
            stuck in your code is never waited for: a new iter(), close() and interpreter exit
            leave it behind (stats().left_behind_threads, one warning) and go on; a stuck worker
            process is replaced at the next iter().
        pin_memory, persistent_workers: accepted and ignored (always so: batches for a GPU are
            built in page-locked memory; workers live as long as the loader).

    Other torch DataLoader arguments (``**dataloader_args``): none is taken. Each one named below
    raises a TypeError that says what to use instead, so code written for the DataLoader gets a
    pointer rather than a bare "unexpected keyword"; any other name is an unexpected keyword:

    {dataloader_args}

    Random augmentations: fl.sample_rng() inside __getitem__ is seeded from (seed, epoch, sample
    index), the same for any workers and after a resume. With workers="processes", torch's global
    generator and Python's `random` are also seeded from (seed, epoch, index) before each
    __getitem__, so unmodified torchvision random transforms are reproducible. With threads they
    are not (the threads share those generators): use fl.sample_rng(), or processes.

    Methods: ``set_epoch(e)``, ``len()``, ``plan(epoch)``, ``split(devices)``, ``state_dict()``,
    ``load_state_dict(sd)``, ``stats()``, ``close()``; see each one's help and docs/api.md.
    ``loader.config`` holds every setting as resolved at construction (see docs/configuration.md).
    """

    def __init__(self, source: Any, batch_size: int, *, shuffle: bool = False, seed: int = 0,
                 drop_last: bool = False, order: str | None = None, rank: int | None = None,
                 world_size: int | None = None, process_group: Any = None, even: str = "pad",
                 device: Any = None, num_threads: int | None = None, prefetch: int | None = None,
                 copy_streams: int = 1, with_index: bool = False, partition: str = "samples",
                 num_workers: int | None = None, workers: str | None = None, pad: Any = None, max_length: Any = None,
                 collate_fn: Any = None, worker_init_fn: Any = None, timeout: float | None = None,
                 pin_memory: bool | None = None, persistent_workers: bool | None = None, steps: int | None = None,
                 streams: int | None = None, **dataloader_args: Any):
        refuse_dataloader_args(dataloader_args)
        args = check_arguments(batch_size=batch_size, seed=seed, shuffle=shuffle, drop_last=drop_last,
                               with_index=with_index, order=order, even=even, steps=steps, prefetch=prefetch,
                               copy_streams=copy_streams, streams=streams, num_threads=num_threads,
                               num_workers=num_workers, workers=workers, timeout=timeout)
        # A Mix is read through one native MixSource, or one PythonSource over its Python datasets.
        self._mix = source if isinstance(source, Mix) else None
        if self._mix is not None:
            source = self._mix.reader(pad=pad, max_length=max_length, collate_fn=collate_fn,
                                      worker_init_fn=worker_init_fn, seed=args.seed)
        else:
            source = as_source(source, pad=pad, max_length=max_length, collate_fn=collate_fn,
                               worker_init_fn=worker_init_fn, seed=args.seed)
        args = python_options(args, source if isinstance(source, PythonSource) else None)
        with_source = self._mix is not None and self._mix.with_source
        self._check_python_options(source, args.workers, args.with_index, args.even, with_source)
        self._config: LoaderConfig = resolve(args, source, rank=rank, world_size=world_size,
                                             process_group=process_group, partition=partition, device=device,
                                             stepped=args.steps is not None or self._mix is not None,
                                             with_source=with_source)
        config = self._config
        self._fingerprint = fingerprint(source)  # where the bytes are: checked at every iter()/split()
        self._source = source
        self._native = config.native
        self._workers: WorkerProcesses | None = None
        if config.workers == "processes":
            self._workers = WorkerProcesses(source, config.num_threads)  # pickles the dataset now: errors come early
        self._engine = _C.Engine(self._native, config.layout, config.num_threads, config.prefetch,
                                 config.copy_streams, self._workers.memory if self._workers else None)
        if config.timeout:
            self._engine.set_timeout(float(config.timeout))
        # Loader methods may be called from several threads: epochs and state change under it.
        self._lock = threading.RLock()
        # Which batches each iter() runs, where the loader stands, and the resume state.
        self._schedule: Schedule = (make_pack_schedule(config, source, self._lock) if member(source, "packs_rows")
                                    else make_schedule(config, source, self._lock, self._mix))
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
        # Object storage: a cache_limit below the shards one step reads is an error now, and the
        # fetchers' threads start.
        self._storage = attach_storage(self._schedule.run_order(), self.config.order, self.config.num_threads)
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

    # ------------------------------------------------------------------ properties
    @property
    def batch_size(self) -> int:
        return self._config.batch_size

    @property
    def rank(self) -> int:
        return self._config.rank

    @property
    def world_size(self) -> int:
        return self._config.world_size

    @property
    def device(self) -> torch.device:
        return self._config.device

    @property
    def num_threads(self) -> int:
        return self._config.num_threads

    @property
    def config(self) -> LoaderConfig:
        """Everything this loader was configured with, resolved (immutable)."""
        return self._config

    @property
    def dataset(self) -> Any:
        """The source as given (a Mix too)."""
        return self._mix if self._mix is not None else self._source

    # ------------------------------------------------------------------ sampling
    def __len__(self) -> int:
        """Batches per epoch that one iterator yields: this rank's batches with iter(); after
        split(devices), each device's batches (the same for every device), until an iter()
        without split() again. len() of an iterator gives its remaining batches. With steps=N: N."""
        return self._schedule.length()

    def plan(self, epoch: int | None = None, *, steps: tuple[int, int] | None = None) -> np.ndarray:
        """This rank's sample ids for an epoch, in the order its batches hold them (int64). With
        steps=N: plan() gives the whole run's, plan(steps=(a, b)) those of global steps [a, b)."""
        return self._schedule.plan(epoch, steps)

    def set_epoch(self, epoch: int) -> None:
        """Makes the next iter() run this epoch (from the resumed position, if it is the one
        load_state_dict restored)."""
        self._schedule.set_epoch(epoch)

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
            schedule = self._schedule
            prepared = schedule.prepare(len(devices))  # raises before anything changes
            schedule.mark_superseded()
            if self._workers is not None:
                self._start_workers()
            self._storage.begin()  # object storage: the run's counters start before its threads
            run = schedule.start(self._engine, prepared, len(devices), self._fail_at_batch, indices)
            self._warn_left_behind(self._engine)
            follow_run(schedule.run_order())  # object storage: fetchers prefetch along this run's order
            return [LoaderIterator(self, self._engine, run, d, i, self._raw_device_batches, self._test_stream,
                                   self._standin_tensors)
                    for d, i in enumerate(indices)]

    def _start_workers(self) -> None:
        """Starts the worker processes at the first iter() (again after a start was interrupted),
        and replaces them when one is stuck in the dataset (a call past timeout=, which the last
        epoch raised): its collation thread would otherwise wait for it forever (under self._lock)."""
        workers = self._workers
        if workers.started and self._engine.overdue():
            logging.getLogger("fastload").warning(
                "fastload is replacing its worker processes: %s; the new epoch starts with fresh ones",
                self._engine.overdue())
            workers.shutdown_sockets()  # the collation thread waiting on the stuck worker sees end of file
            self._engine.stop_epoch()  # and returns: nothing uses the old sockets after this
            fds, pids = workers.restart()
        elif not workers.started:
            fds, pids = workers.start()
        else:
            return
        _C._attach_workers(self._native, fds, pids, workers.memory)

    def _warn_left_behind(self, engine: Any) -> None:
        """Logs once per loader that collation threads were left behind, stuck in the dataset."""
        if getattr(self, "_left_behind_warned", False) or not engine.left_behind():
            return
        self._left_behind_warned = True
        logging.getLogger("fastload").warning(
            "fastload left %d collation thread(s) behind, stuck in the dataset's code (%s): they could not be "
            "stopped, so they were not waited for and end when their call returns; the loader goes on with fresh "
            "threads (see stats().left_behind_threads)", engine.left_behind(), engine.left_behind_in() or "a call")

    def _gpu_index(self, device: torch.device) -> int:
        """-1 for the CPU; else the GPU's index, after checking (at the first GPU iter(), never
        at construction) that fastload's driver and PyTorch can both use it."""
        if device.type != "cuda":
            return -1
        index = device.index  # resolve_device always gives one
        count = _C.cuda_device_count()  # loads the driver; RuntimeError says why it cannot
        if not 0 <= index < count:
            raise ValueError(f"device {device} does not exist: the CUDA driver sees {count} device(s)")
        if not (self._raw_device_batches or self._standin_tensors) and not torch_sees_gpu():
            raise RuntimeError(
                f"fastload's CUDA driver sees {count} device(s) but PyTorch sees none, so batches could "
                "not become torch tensors; is this PyTorch a CPU-only build?")
        return index

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        return self._start([self.device])[0]

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
            return self._schedule.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores a state_dict(): the next iter() continues exactly where it stopped, also with
        another world size or batch size (from the same global sample position)."""
        with self._lock:
            self._check_usable()
            self._schedule.load_state_dict(state)

    # ------------------------------------------------------------------ shutdown
    def close(self) -> None:
        """Stops and joins the collation threads and the transfer engines. Batches already
        handed out stay valid (on the GPU too)."""
        with self._lock:
            engine, self._engine = self._engine, None
            if engine is None:
                return
            self._schedule.mark_superseded()
        workers, self._workers = getattr(self, "_workers", None), None
        if workers is not None:
            workers.shutdown_sockets()  # threads waiting on a worker wake up now
        engine.close()  # in a forked child this leaves the parent's threads alone
        if workers is not None:
            workers.stop()
        self._warn_left_behind(engine)

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            if _on_service_thread():
                # Garbage collection ran this finaliser on one of fastload's own threads (a
                # download thread, or a native collation or decode thread inside Python): close()
                # waits for the collation threads, which may be waiting for this very thread.
                # Close from a thread of its own instead (PEP 442: self lives until it is done).
                threading.Thread(target=self.close, daemon=True, name="fastload-close").start()
            else:
                self.close()
        except Exception:  # noqa: BLE001 - never raise from a finaliser
            pass

    def stats(self) -> LoaderStats:
        """Counters of the current epoch (since its iter()/split()) and the memory the loader
        holds; print it for a table. See LoaderStats for what each field means."""
        with self._lock:
            self._check_usable()
            memory = self._engine.memory()
            schedule = self._schedule
            if schedule.run is None:
                c = self._config
                zero = {"count": 0, "busy_s": 0.0, "p50_s": 0.0, "p99_s": 0.0}
                run = {"epoch": schedule.last_epoch + 1, "batches": 0, "samples": 0, "bytes": 0, "wait_s": 0.0,
                       "wall_s": 0.0, "ready_mean": 0.0, "collation": zero, "copy": {},
                       "num_threads": c.num_threads, "prefetch": c.prefetch, "copy_streams": c.copy_streams}
            else:
                run = self._engine.stats(schedule.run)
            run["left_behind_threads"] = self._engine.left_behind()
            packing = schedule.packing_stats() if hasattr(schedule, "packing_stats") else None
            return LoaderStats._from_native(run, memory, schedule.source_stats(run), self._storage.stats(), packing)

    def _memory(self) -> dict[str, int]:
        """Bytes and buffers the loader's pools have allocated and not freed (batches users still
        hold included): host_bytes (pageable), pinned_bytes, device_bytes, and their counts."""
        self._check_usable()
        return self._engine.memory()

    def __repr__(self) -> str:
        c = self._config
        return (f"Loader({self._source!r}, batch_size={c.batch_size}, shuffle={c.shuffle}, "
                f"rank={c.rank}/{c.world_size}, device={c.device}, num_threads={c.num_threads}, "
                f"prefetch={c.prefetch})")


# The refused DataLoader arguments in help(fl.Loader), from the one table that refuses them.
if Loader.__doc__:  # None under python -OO
    Loader.__doc__ = Loader.__doc__.replace("{dataloader_args}", describe_dataloader_args())
