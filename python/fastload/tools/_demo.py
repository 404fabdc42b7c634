"""The main job behind ``python -m fastload``: write a dataset to disk, train a small MLP on it
through fastload.Loader, and report how much of the training time was spent waiting for data.

Steps:
1. Write memory-mapped .npy files (features + an int64 label column) to a temporary folder, or
   reuse a matching set in ``--data-dir``. Labels are the argmax of a fixed random linear map of
   the features, so the task is learnable and the loss visibly drops.
2. Train an MLP for ``--steps`` steps, cycling epochs with ``set_epoch``. Batches arrive on the
   loader's device; features stored as float16 are cast to float32 there (half the bytes moved).
3. Time every step and the part of it spent in ``next()`` on the loader, then print a summary:
   samples/s, the share of time waiting for data, the knobs used, the dataset size and the loss.
4. With ``--compare``, run the same loop for the same number of steps fed by
   ``torch.utils.data.DataLoader`` (a per-sample Dataset over the same files, default collate,
   as many workers as the loader has threads) and add a side-by-side line to the summary.

Exit status: 0 when done, 130 after Ctrl-C (the summary so far is still printed), 2 on bad
arguments.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence, TextIO

import numpy as np
import torch

import fastload as fl
from fastload.tools._cli import ProgressLine, check_device, positive_float, positive_int

_FILES = {"x": "demo_features.npy", "y": "demo_labels.npy"}
_META = "demo_meta.json"
_META_FORMAT = 1
# Rows generated at a time: bounds the memory used to write a dataset of any size.
_CHUNK_ROWS = 16_384
# Steps averaged for the "initial" and "final" loss: one batch's loss is too noisy to compare.
_LOSS_WINDOW = 10
# The progress bar redraws at most this often (seconds): each redraw reads the loss, which on a
# GPU waits for the step to finish.
_REDRAW_S = 0.1
_EXIT_INTERRUPTED = 130  # the shell convention for "ended by SIGINT"


# ---------------------------------------------------------------------------- arguments
def _count_option(group: argparse._ArgumentGroup, flag: str, default: int, metavar: str, what: str) -> None:
    """A positive whole number, its default said at the end of its help."""
    group.add_argument(flag, type=positive_int, default=default, metavar=metavar,
                       help=f"{what} (default: %(default)s)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m fastload",
        description="Train a small MLP on a generated on-disk dataset through fastload.Loader and "
                    "report throughput and the share of step time spent waiting for data.",
        epilog="Exit status: 0 when done; 130 after Ctrl-C (the summary so far is still printed); "
               "2 on bad arguments. See also: python -m fastload tune --help (measure and pick "
               "num_threads/prefetch on your own data).",
    )
    data = parser.add_argument_group("dataset")
    _count_option(data, "--samples", 200_000, "N", "rows in the dataset")
    _count_option(data, "--features", 256, "F", "features per row")
    _count_option(data, "--classes", 10, "C", "label classes, at least 2")
    data.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                      help="storage dtype of the features (float16 halves the bytes read and moved; "
                           "the batch is cast to float32 on the device; default: %(default)s)")
    data.add_argument("--data-dir", type=Path, default=None, metavar="DIR",
                      help="keep the dataset in this folder and reuse it when it matches the options "
                           "(default: a temporary folder removed at exit)")

    train = parser.add_argument_group("training")
    _count_option(train, "--steps", 400, "N", "optimizer steps; epochs are cycled with set_epoch as needed")
    _count_option(train, "--batch-size", 512, "B", "samples per step")
    _count_option(train, "--hidden", 512, "H", "width of the MLP's two hidden layers")
    train.add_argument("--lr", type=positive_float, default=1e-3, help="Adam learning rate (default: %(default)s)")
    train.add_argument("--seed", type=int, default=0,
                       help="seed of the data, the model and the shuffle order (default: %(default)s)")

    loader = parser.add_argument_group("loader")
    loader.add_argument("--threads", type=positive_int, default=None, metavar="T",
                        help="collation threads (default: the CPUs this process may use)")
    loader.add_argument("--prefetch", type=positive_int, default=None, metavar="P",
                        help="batches in flight (default: the loader's: a 16 MiB budget, at most 32, "
                             "at least one per thread)")
    loader.add_argument("--copy-streams", "--streams", dest="copy_streams", type=positive_int, default=1, metavar="S",
                        help="copy streams per GPU (default: %(default)s; no effect on the CPU; --streams is its "
                             "old name)")
    loader.add_argument("--device", default=None, metavar="DEV",
                        help="'cpu', 'cuda' or 'cuda:N' (default: cuda:LOCAL_RANK if a GPU is usable, else cpu)")

    report = parser.add_argument_group("reporting")
    report.add_argument("--sync", action=argparse.BooleanOptionalAction, default=None,
                        help="on CUDA, wait for the GPU at the end of every step, so that time in next() "
                             "is only data wait and not the previous step's queued GPU work; costs the "
                             "overlap of one step's launch with the previous step's kernels "
                             "(default: on for CUDA; on the CPU there is nothing to synchronise: every "
                             "step's work is done when it returns, and the summary shows sync=n/a)")
    report.add_argument("--compare", action="store_true",
                        help="after the fastload run, run the same loop for the same steps fed by "
                             "torch.utils.data.DataLoader (num_workers = the loader's threads, persistent "
                             "workers, a per-sample Dataset over the same files, default collate, pin_memory "
                             "on a GPU) and print both side by side")
    report.add_argument("--no-progress", action="store_true",
                        help="no progress bar; print a line every --log-every steps instead "
                             "(also the behaviour when stderr is not a terminal)")
    report.add_argument("--log-every", type=positive_int, default=None, metavar="N",
                        help="steps between progress lines without a bar (default: steps/10)")
    args = parser.parse_args(argv)
    if args.classes < 2:
        parser.error("--classes must be at least 2")
    if args.seed < 0:
        parser.error("--seed must be non-negative")
    check_device(parser, args.device)  # before time goes into writing the dataset
    return args


# ---------------------------------------------------------------------------- dataset
@dataclass(frozen=True)
class DataSpec:
    samples: int
    features: int
    classes: int
    dtype: str
    seed: int

    def meta(self) -> dict[str, object]:
        return {"format": _META_FORMAT, "samples": self.samples, "features": self.features,
                "classes": self.classes, "dtype": self.dtype, "seed": self.seed}


def _stored_meta(folder: Path) -> dict[str, object] | None:
    try:
        return json.loads((folder / _META).read_text())
    except (OSError, ValueError):
        return None


def _write_dataset(folder: Path, spec: DataSpec) -> None:
    """Writes features and labels chunk by chunk (any size fits in memory), metadata last, so an
    interrupted write is never mistaken for a complete dataset."""
    (folder / _META).unlink(missing_ok=True)
    rng = np.random.default_rng(spec.seed)
    weights = rng.standard_normal((spec.features, spec.classes), dtype=np.float32)
    x = np.lib.format.open_memmap(folder / _FILES["x"], mode="w+", dtype=spec.dtype,
                                  shape=(spec.samples, spec.features))
    y = np.lib.format.open_memmap(folder / _FILES["y"], mode="w+", dtype=np.int64, shape=(spec.samples,))
    for start in range(0, spec.samples, _CHUNK_ROWS):
        rows = min(_CHUNK_ROWS, spec.samples - start)
        # Labels come from the features as stored (after rounding to float16), so they are an
        # exact function of what the model sees.
        chunk = rng.standard_normal((rows, spec.features), dtype=np.float32).astype(spec.dtype)
        x[start:start + rows] = chunk
        y[start:start + rows] = np.argmax(chunk.astype(np.float32) @ weights, axis=1)
    x.flush()
    y.flush()
    del x, y
    (folder / _META).write_text(json.dumps(spec.meta()))


def open_dataset(folder: Path, spec: DataSpec, log: TextIO) -> dict[str, np.ndarray]:
    """The dataset's columns as read-only memory maps, writing the files unless a matching set
    is already in `folder`."""
    if _stored_meta(folder) == spec.meta() and all((folder / f).is_file() for f in _FILES.values()):
        print(f"reusing the dataset in {folder}", file=log, flush=True)
    else:
        mb = (spec.samples * (spec.features * np.dtype(spec.dtype).itemsize + 8)) / 1e6
        print(f"writing a {mb:,.1f} MB dataset to {folder} ...", file=log, flush=True)
        began = time.perf_counter()
        _write_dataset(folder, spec)
        print(f"  written in {time.perf_counter() - began:.1f} s", file=log, flush=True)
    # Read-only maps: the loader reads the files in place; nothing is loaded up front.
    return {name: np.load(folder / file, mmap_mode="r") for name, file in _FILES.items()}


# ---------------------------------------------------------------------------- training
def build_model(features: int, hidden: int, classes: int, device: torch.device) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(features, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, classes),
    ).to(device)


def endless_batches(loader: fl.Loader) -> Iterator[dict[str, torch.Tensor]]:
    """Batches of epoch 0, 1, 2, ...: set_epoch gives every epoch its own shuffle order."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


class SampleDataset(torch.utils.data.Dataset):
    """What a typical PyTorch user writes for --compare: one sample is one row of each file.

    Holds file paths and maps the files on first use in each worker, so it pickles small under any
    multiprocessing start method (a pickled np.memmap would copy the whole array)."""

    def __init__(self, files: dict[str, Path]):
        self.files = files
        self.columns: dict[str, np.ndarray] | None = None
        self.length = len(np.load(files["y"], mmap_mode="r"))

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.columns is None:
            self.columns = {name: np.load(path, mmap_mode="r") for name, path in self.files.items()}
        return {name: torch.from_numpy(np.array(column[i])) for name, column in self.columns.items()}

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "columns": None}


def dataloader_batches(loader: torch.utils.data.DataLoader, device: torch.device
                       ) -> Iterator[dict[str, torch.Tensor]]:
    """The DataLoader's batches of epoch 0, 1, 2, ..., on `device` (pinned by the DataLoader on a
    GPU, so the copy can be asynchronous). Stops the workers when closed."""
    it = None
    try:
        while True:
            it = iter(loader)
            for batch in it:
                yield {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    finally:
        # Stop persistent workers now, not at garbage collection (a private method, but the only
        # prompt way): they must not share the CPUs with what runs next.
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def make_dataloader(files: dict[str, Path], batch_size: int, workers: int, device: torch.device,
                    seed: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        SampleDataset(files), batch_size=batch_size, shuffle=True, num_workers=workers,
        persistent_workers=workers > 0, pin_memory=device.type == "cuda",
        generator=torch.Generator().manual_seed(seed))


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One optimizer step; returns the loss as a tensor (reading it as a float would wait for a GPU)."""
    # The loader already put the batch on the model's device; casting there, not on the host,
    # keeps the bytes copied at the stored (possibly float16) size.
    x = batch["x"].float()
    loss = torch.nn.functional.cross_entropy(model(x), batch["y"])
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


@dataclass
class Stats:
    """What the steps completed so far measured."""

    steps: int = 0
    samples: int = 0
    wait_s: float = 0.0        # time inside next() on the loader: the data wait
    max_wait_s: float = 0.0
    elapsed_s: float = 0.0     # wall time of the training loop, all of it (nothing left out)
    first_losses: list[torch.Tensor] = field(default_factory=list)
    last_losses: deque[torch.Tensor] = field(default_factory=lambda: deque(maxlen=_LOSS_WINDOW))

    def record(self, wait_s: float, samples: int, loss: torch.Tensor) -> None:
        self.steps += 1
        self.samples += samples
        self.wait_s += wait_s
        self.max_wait_s = max(self.max_wait_s, wait_s)
        if len(self.first_losses) < _LOSS_WINDOW:
            self.first_losses.append(loss)
        self.last_losses.append(loss)

    def wait_share(self) -> float:
        return self.wait_s / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def rate(self) -> float:
        return self.samples / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _mean(losses: Sequence[torch.Tensor]) -> float:
    return float(torch.stack(list(losses)).mean()) if losses else float("nan")


class Progress:
    """A one-line bar redrawn in place on a terminal; otherwise a plain line every `every` steps."""

    def __init__(self, total: int, stream: TextIO, bar: bool, every: int):
        self.total, self.stream, self.every = total, stream, every
        self.line = ProgressLine(stream, _REDRAW_S) if bar else None

    def update(self, stats: Stats, loss: torch.Tensor) -> None:
        done = stats.steps == self.total
        if self.line is not None:
            self.line.draw(stats.steps, self.total, f"{stats.steps}/{self.total}  {self._status(stats, float(loss))}",
                           force=done)
        elif done or stats.steps % self.every == 0:
            print(f"step {stats.steps}/{self.total}  {self._status(stats, float(loss))}", file=self.stream, flush=True)

    def close(self) -> None:
        """Ends the bar's line so that what follows starts on a fresh one."""
        if self.line is not None:
            self.line.close()

    @staticmethod
    def _status(stats: Stats, loss: float) -> str:
        return f"loss {loss:.3f}  {stats.rate():,.0f} samples/s  data wait {100 * stats.wait_share():.1f}%"


def train(batches: Iterator[dict[str, torch.Tensor]], device: torch.device, model: torch.nn.Module,
          optimizer: torch.optim.Optimizer, steps: int, sync: bool, progress: Progress, stats: Stats) -> None:
    """Runs up to `steps` steps on `batches` (closed at the end), filling `stats` as it goes (so
    Ctrl-C leaves it consistent).

    Measured: the data wait is the time in next() on `batches` (for a new epoch that includes
    starting the epoch; for the DataLoader, the copy to the device too). The elapsed time is the
    whole loop's wall time, progress output included, and on CUDA it ends only when the GPU has finished. With `sync`
    every step ends with torch.cuda.synchronize(), so the GPU is idle when next() is timed: the
    wait is then data alone, not the previous step's GPU work that a copy would queue behind.
    """
    on_cuda = device.type == "cuda"
    began = time.perf_counter()
    try:
        for _ in range(steps):
            t0 = time.perf_counter()
            batch = next(batches)
            wait = time.perf_counter() - t0
            loss = train_step(model, optimizer, batch)
            if sync and on_cuda:
                torch.cuda.synchronize(device)
            stats.record(wait, len(batch["y"]), loss)
            stats.elapsed_s = time.perf_counter() - began
            progress.update(stats, loss)
    finally:
        if on_cuda:
            torch.cuda.synchronize(device)  # work still queued is part of the run
        stats.elapsed_s = time.perf_counter() - began
        batches.close()


# ---------------------------------------------------------------------------- report
def summary(stats: Stats, loader: fl.Loader, args: argparse.Namespace, dataset_mb: float,
            sync: bool, interrupted: bool, prefetch: int, compared: Stats | None = None) -> list[str]:
    """The closing report: one labelled line per figure, the settings with their resolved values,
    and with --compare the DataLoader's figures beside fastload's."""
    def knob(value: object, given: object) -> str:
        return f"{value}" if given is not None else f"{value} (auto)"

    steps_ms = 1000 * stats.elapsed_s / stats.steps if stats.steps else 0.0
    wait_ms = 1000 * stats.wait_s / stats.steps if stats.steps else 0.0
    status = f"interrupted after {stats.steps} of {args.steps} steps" if interrupted else f"{stats.steps} steps"
    on_cuda = loader.device.type == "cuda"
    lines = [
        f"fastload summary: {status}, {stats.samples:,} samples ({stats.samples / args.samples:.2f} epochs) "
        f"in {stats.elapsed_s:.2f} s",
        f"  throughput  {stats.rate():,.0f} samples/s ({steps_ms:.2f} ms/step)",
        f"  data wait   {100 * stats.wait_share():.1f}% of step time ({wait_ms:.3f} ms/step, "
        f"slowest {1000 * stats.max_wait_s:.1f} ms)",
        f"  loss        {_mean(stats.first_losses):.4f} -> {_mean(stats.last_losses):.4f} "
        f"(mean of the first and last {_LOSS_WINDOW} steps)",
        f"  dataset     {args.samples:,} x {args.features} {args.dtype} + int64 label = {dataset_mb:,.1f} MB",
        f"  settings    threads={knob(loader.num_threads, args.threads)} prefetch={knob(prefetch, args.prefetch)} "
        f"copy_streams={args.copy_streams if on_cuda else 'n/a'} "
        f"batch-size={args.batch_size} device={knob(loader.device, args.device)} "
        f"sync={('on' if sync else 'off') if on_cuda else 'n/a'} (torch-threads={torch.get_num_threads()})",
    ]
    if not on_cuda:
        lines.append("              (n/a: on the CPU there are no copy streams, and nothing to synchronise: "
                     "a step's work is done when it returns)")
    if compared is not None:
        ratio = f"{stats.rate() / compared.rate():.2f}x" if compared.rate() > 0 else "n/a"
        cut = f", interrupted after {compared.steps} of {args.steps} steps" if compared.steps < stats.steps else ""
        lines.append(
            f"  compared    fastload {stats.rate():,.0f} samples/s, data wait {100 * stats.wait_share():.1f}% | "
            f"torch DataLoader ({loader.num_threads} workers{cut}) {compared.rate():,.0f} samples/s, "
            f"data wait {100 * compared.wait_share():.1f}% | fastload/DataLoader {ratio}")
    return lines


# ---------------------------------------------------------------------------- main
def _data_folder(args: argparse.Namespace, stack: ExitStack) -> Path:
    if args.data_dir is None:
        # Removed on exit, also after Ctrl-C or an error.
        return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fastload-demo-")))
    folder = args.data_dir.expanduser()  # "--data-dir=~/x" reaches us unexpanded: not a folder named "~" here
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _run(args: argparse.Namespace, stack: ExitStack) -> int:
    log = sys.stderr
    spec = DataSpec(args.samples, args.features, args.classes, args.dtype, args.seed)
    folder = _data_folder(args, stack)
    columns = open_dataset(folder, spec, log)
    dataset_mb = sum(c.nbytes for c in columns.values()) / 1e6
    try:
        loader = fl.Loader(fl.Dataset(columns), batch_size=args.batch_size, shuffle=True, seed=args.seed,
                           num_threads=args.threads, prefetch=args.prefetch, copy_streams=args.copy_streams,
                           device=args.device)
    except ValueError as e:  # e.g. --device cuda without a GPU: a usage error, not a crash
        print(f"python -m fastload: error: {e}", file=log)
        return 2
    stack.callback(loader.close)  # stop the loader's threads before the files go away
    prefetch = loader.stats().prefetch  # resolved (the byte-budget default when not given)

    torch.manual_seed(args.seed)
    model = build_model(args.features, args.hidden, args.classes, loader.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    sync = args.sync if args.sync is not None else loader.device.type == "cuda"
    progress = Progress(args.steps, log, bar=log.isatty() and not args.no_progress,
                        every=args.log_every or max(1, args.steps // 10))
    print(f"training {args.steps} steps of {args.batch_size} on {loader.device} "
          f"({len(loader)} batches per epoch)", file=log, flush=True)

    stats, interrupted = Stats(), False
    try:
        train(endless_batches(loader), loader.device, model, optimizer, args.steps, sync, progress, stats)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        progress.close()
    compared = None
    if args.compare and not interrupted:
        loader.close()  # its threads must not compete with the DataLoader's workers
        compared = Stats()
        try:
            interrupted = _compare(args, folder, loader.num_threads, loader.device, sync, stats.steps, compared)
        except KeyboardInterrupt:
            interrupted = True
    print("\n".join(summary(stats, loader, args, dataset_mb, sync, interrupted, prefetch, compared)), flush=True)
    return _EXIT_INTERRUPTED if interrupted else 0


def _compare(args: argparse.Namespace, folder: Path, workers: int, device: torch.device, sync: bool,
             steps: int, stats: Stats) -> bool:
    """The same training loop (same model, seed and steps) fed by torch.utils.data.DataLoader;
    fills `stats`. Returns whether Ctrl-C cut it short."""
    log = sys.stderr
    files = {name: folder / file for name, file in _FILES.items()}
    print(f"comparing: the same {steps} steps fed by torch.utils.data.DataLoader ({workers} workers, "
          f"per-sample Dataset, default collate{', pin_memory' if device.type == 'cuda' else ''})",
          file=log, flush=True)
    torch.manual_seed(args.seed)
    model = build_model(args.features, args.hidden, args.classes, device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    progress = Progress(steps, log, bar=log.isatty() and not args.no_progress,
                        every=args.log_every or max(1, steps // 10))
    batches = dataloader_batches(make_dataloader(files, args.batch_size, workers, device, args.seed), device)
    try:
        train(batches, device, model, optimizer, steps, sync, progress, stats)
    except KeyboardInterrupt:
        return True
    finally:
        progress.close()
    return False


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with ExitStack() as stack:
            return _run(args, stack)
    except KeyboardInterrupt:  # before training started (e.g. while writing the dataset)
        print("\ninterrupted", file=sys.stderr)
        return _EXIT_INTERRUPTED
