"""What fastload's two commands (python -m fastload and python -m fastload tune) share: argparse
argument types, the --device check and the in-place progress line, defined once."""
from __future__ import annotations

import argparse
import math
import shutil
import time
from typing import TextIO

import torch

from .._machine import torch_sees_gpu

__all__ = ["positive_int", "positive_float", "int_list", "check_device", "ProgressLine"]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def int_list(text: str) -> list[int]:
    """Positive integers separated by commas, sorted, without repeats."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return sorted(set(values))


def check_device(parser: argparse.ArgumentParser, device: str | None) -> None:
    """--device: 'cpu', 'cuda' or 'cuda:N', and a GPU one only where torch sees a GPU; checked
    before any time goes into the work (the Loader checks the rest)."""
    if device is None:
        return
    try:
        kind = torch.device(device).type
    except (RuntimeError, ValueError):
        kind = None
    if kind not in ("cpu", "cuda"):
        parser.error(f"--device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if kind == "cuda" and not torch_sees_gpu():
        parser.error(f"--device {device}: no usable CUDA GPU is present")


class ProgressLine:
    """A bar on one terminal line, redrawn in place with \\r at most every `redraw_s` seconds (a
    redraw per step would cost more than a fast step), never wider than the terminal."""

    def __init__(self, stream: TextIO, redraw_s: float = 0.1):
        self.stream, self.redraw_s = stream, redraw_s
        self._drawn = False
        self._last = 0.0

    def draw(self, done: int, total: int, text: str, *, force: bool = False) -> None:
        """[####....] followed by `text`; skipped if drawn less than redraw_s ago, unless `force`
        (the last update, so the final state always shows)."""
        now = time.perf_counter()
        if not force and now - self._last < self.redraw_s:
            return
        self._last = now
        width = shutil.get_terminal_size((80, 20)).columns - 1  # one short: never wrap the line
        cells = max(10, min(40, width - len(text) - 3))
        filled = cells * min(done, total) // max(1, total)
        line = f"[{'#' * filled}{'.' * (cells - filled)}] {text}"
        self.stream.write("\r" + line[:width].ljust(width))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Ends the bar's line so that what follows starts on a fresh one."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
