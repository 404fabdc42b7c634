"""fastload.record_stream: a batch used on a stream other than the one next() made it ready on.

A batch's device memory is rewritten by a later copy once the work queued on the stream it was
handed out on (torch.cuda.current_stream() at next()) has run, when the last reference to it
dies. Work on another stream (a side stream of the training step, DDP's bucket streams) is not
covered: it must be recorded here. torch's own tensor.record_stream(stream) does nothing for this
memory (it protects only memory torch's caching allocator made), silently.
"""
from __future__ import annotations

from typing import Any

import torch

from . import _C


def _stream_handle(stream: Any) -> tuple[int, int | None]:
    """(raw handle, device index or None) of a torch.cuda.Stream, ExternalStream or raw handle."""
    if isinstance(stream, bool):
        raise TypeError(f"stream must be a torch.cuda.Stream or a raw CUDA stream handle (int), got {stream!r}")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"stream must be a non-negative CUDA stream handle, got {stream}")
        return stream, None
    handle = getattr(stream, "cuda_stream", None)
    if not isinstance(handle, int):
        raise TypeError(f"stream must be a torch.cuda.Stream or a raw CUDA stream handle (int), got {stream!r}")
    device = getattr(stream, "device", None)
    return handle, getattr(device, "index", None)


def _device_leaves(obj: Any, path: str, out: list[tuple[str, int, int]]) -> None:
    """(where, device, data address) of every batch part in obj that lives on a GPU."""
    if isinstance(obj, torch.Tensor):
        if obj.device.type == "cuda":
            out.append((path, int(obj.device.index), int(obj.data_ptr())))
    elif isinstance(obj, _C.RawDevicePart):  # the tests' stand-in device parts
        out.append((path, int(obj.device), int(obj.ptr)))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _device_leaves(v, f"{path}[{k!r}]", out)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _device_leaves(v, f"{path}[{i}]", out)


def record_stream(batch: Any, stream: Any) -> None:
    """Makes the loader wait for the work queued on `stream` before it rewrites the memory of
    `batch`: call it when you use a batch (a dict of tensors, a tensor, or any nest of dicts,
    lists and tuples of them) on a stream other than the one that was current at next().

    When the last reference to a column dies, fastload records an event on the stream the batch
    was handed out on and one on every stream recorded here; the next copy into that memory waits
    for all of them (on the GPU, never the host). CPU tensors and non-tensor values are skipped.
    Raises ValueError for a CUDA tensor that is not (a view of) a fastload batch column you
    hold: a tensor torch allocated (a batch's .float(), say) takes torch's own
    tensor.record_stream(stream) instead.
    """
    handle, stream_device = _stream_handle(stream)
    leaves: list[tuple[str, int, int]] = []
    _device_leaves(batch, "batch", leaves)
    for where, device, ptr in leaves:
        if stream_device is not None and stream_device != device:
            raise ValueError(f"{where} is on cuda:{device} but the stream is on cuda:{stream_device}")
        if not _C._record_stream(device, ptr, handle):
            raise ValueError(
                f"{where} (cuda:{device}, address {ptr:#x}) is not memory of a fastload batch you hold: "
                "fastload.record_stream protects batch columns and views of them; for a tensor torch "
                "allocated (the result of .float() or .clone() on a batch, say) use tensor.record_stream(stream)")
