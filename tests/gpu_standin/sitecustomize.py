"""A stand-in "GPU machine" for running bench/gpu_check.sh end to end without a GPU: only
tests/test_gpu_check.py puts this directory on PYTHONPATH, with FASTLOAD_GPU_STANDIN set to the
path of the stand-in driver (tests/fake_cuda/build.py builds it).

Python imports `sitecustomize` at start-up, so every process the script starts (pytest, its
subprocesses, the benchmark) gets the same stand-in, unless CUDA_VISIBLE_DEVICES is empty: then
it does nothing at all and the process is the CPU machine CI runs on (the check's "rest of the
suite" step runs so; were that variable missing there, the stand-in would show a GPU and the
suite's stand-in driver tests would skip themselves, which tests/test_gpu_check.py catches).
When active:
- fastload's CUDA driver is the stand-in driver (FASTLOAD_LIBCUDA is set to it): the real
  transfer engine runs on it (streams are threads, "device" memory is host memory);
- torch.cuda answers as a machine with that driver's devices would (is_available, device_count,
  get_device_name, current_stream, Stream, Event, _sleep, synchronize...); the calls that
  initialise CUDA in torch make is_initialized() true here too;
- a GPU Loader hands out CPU tensors: torch cannot import the stand-in's host memory as CUDA
  tensors, so its batches come through the loader's `_raw_device_batches` hook (each part read
  back through the driver on the consumer's stream) and become CPU tensors of the same dtype and
  shape. Tensors the tests and the benchmark make themselves live on STANDIN_TENSOR_DEVICE (cpu).

What it cannot be: torch's CUDA semantics. Streams, events and _sleep are host-side stand-ins
(events time the host clock, _sleep sleeps the host at 1 GHz); reading a batch back makes it
synchronous, so GPU-side races of the consumer cannot happen here. It proves that the script, the
GPU tests and the benchmark run every line they run on a GPU against fastload's real engine; it
proves nothing about a GPU.

Only attributes that the real torch.cuda has are replaced: code that calls a function torch
lacks fails here too.
"""
from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time
import types
from typing import Any

DRIVER = os.environ.get("FASTLOAD_GPU_STANDIN", "")
ENABLED = bool(DRIVER) and os.environ.get("CUDA_VISIBLE_DEVICES") != ""  # "": no GPU, as with CUDA
DEVICE_NAME = "stand-in CUDA driver (tests/fake_cuda; host memory, no GPU)"
_CYCLES_PER_SECOND = 1e9  # torch.cuda._sleep(cycles) sleeps the host this long


# ----------------------------------------------------------------------------- after-import hooks
class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after a module's own code ran (torch, fastload._loader), so that
    processes that never import them pay nothing."""

    def __init__(self, patches: dict[str, Any]):
        self.patches = patches

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        patch = self.patches.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module: types.ModuleType) -> None:
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_then_patch  # type: ignore[method-assign]
        return spec


# ----------------------------------------------------------------------------- torch.cuda
def _driver() -> ctypes.CDLL:
    lib = ctypes.CDLL(DRIVER)
    lib.fake_cuda_stat.argtypes = [ctypes.c_char_p]
    lib.fake_cuda_stat.restype = ctypes.c_longlong
    return lib


class _Stream:
    """torch.cuda.Stream's surface: identity, cuda_stream, waits (host-ordered, so no-ops)."""

    _next_handle = 0x1000

    def __init__(self, device: Any = None, priority: int = 0, handle: int | None = None):
        if handle is None:
            handle, _Stream._next_handle = _Stream._next_handle, _Stream._next_handle + 0x10
        self.cuda_stream = handle
        self.device = device
        self.priority = priority

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> Any:
        event = event if event is not None else _Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"<stand-in torch.cuda.Stream cuda_stream={self.cuda_stream:#x}>"


class _Event:
    """torch.cuda.Event's surface; elapsed_time is host time between the two record() calls."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self.t: float | None = None

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end_event: "_Event") -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.t is None or end_event.t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event.t - self.t) * 1e3


_local = threading.local()
_DEFAULT_STREAM = _Stream(handle=0)  # the legacy default stream, as torch reports it


def _current_stream(device: Any = None) -> _Stream:
    return getattr(_local, "stream", _DEFAULT_STREAM)


@contextlib.contextmanager
def _stream_context(stream: Any):
    previous = _current_stream()
    _local.stream = stream if stream is not None else previous
    try:
        yield
    finally:
        _local.stream = previous


def _patch_torch(torch: types.ModuleType) -> None:
    lib = _driver()
    count = int(lib.fake_cuda_stat(b"device_count"))
    total = int(lib.fake_cuda_stat(b"total_memory"))
    cuda = torch.cuda
    state = {"device": 0, "initialised": False}

    def initialising(fn: Any) -> Any:
        """As in torch, these calls initialise CUDA (is_initialized() becomes True)."""
        def call(*args: Any, **kwargs: Any) -> Any:
            state["initialised"] = True
            return fn(*args, **kwargs)
        return call

    def set_device(device: Any) -> None:
        state["device"] = device if isinstance(device, int) else torch.device(device).index

    def get_device_properties(device: Any = None) -> Any:
        return types.SimpleNamespace(name=DEVICE_NAME, total_memory=total, major=0, minor=0,
                                     multi_processor_count=0)

    replacements = {
        "is_available": lambda: count > 0,
        "device_count": lambda: count,
        "is_initialized": lambda: state["initialised"],
        "current_device": initialising(lambda: state["device"]),
        "set_device": initialising(set_device),
        "get_device_name": lambda device=None: DEVICE_NAME,
        "get_device_properties": initialising(get_device_properties),
        "synchronize": initialising(lambda device=None: None),  # batches are read back synchronously
        "current_stream": initialising(_current_stream),
        "default_stream": initialising(lambda device=None: _DEFAULT_STREAM),
        "stream": _stream_context,
        "Stream": initialising(_Stream),
        "Event": initialising(_Event),
        "_sleep": initialising(lambda cycles: time.sleep(cycles / _CYCLES_PER_SECOND)),
    }
    missing = [name for name in replacements if not hasattr(cuda, name)]
    if missing:
        raise AttributeError(f"this torch.cuda has no {missing}: the stand-in replaces only what torch has")
    for name, value in replacements.items():
        setattr(cuda, name, value)
    if not hasattr(torch.Tensor, "record_stream"):
        raise AttributeError("this torch.Tensor has no record_stream")
    torch.Tensor.record_stream = lambda self, stream: None  # a CPU tensor: nothing to protect
    torch.version.cuda = "stand-in"
    cuda.is_fastload_standin = True
    cuda.STANDIN_TENSOR_DEVICE = torch.device("cpu")


# ----------------------------------------------------------------------------- fastload
# DLPack type codes (bindings/dlpack.h) to torch dtypes, by (code, bits).
_DL_TORCH = {(0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
             (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
             (2, 16): "float16", (2, 32): "float32", (2, 64): "float64", (4, 16): "bfloat16",
             (5, 64): "complex64", (5, 128): "complex128", (6, 8): "bool"}


def _to_cpu_tensor(value: Any) -> Any:
    import torch

    if isinstance(value, dict):
        return {k: _to_cpu_tensor(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_to_cpu_tensor(v) for v in value)
    if not hasattr(value, "read") or not hasattr(value, "dtype_code"):
        return value
    dtype = getattr(torch, _DL_TORCH[value.dtype_code, value.dtype_bits])
    shape = tuple(value.shape)
    data = value.read()  # through the driver, on the consumer's stream, after the copy's wait
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


class _CpuBatches:
    """A GPU iterator whose batches arrive as CPU tensors (see the module's docstring)."""

    def __init__(self, it: Any):
        self._it = it

    def __iter__(self) -> "_CpuBatches":
        return self

    def __next__(self) -> Any:
        return _to_cpu_tensor(next(self._it))

    def __len__(self) -> int:
        return len(self._it)


def _patch_fastload_loader(module: types.ModuleType) -> None:
    loader_class = module.Loader
    start = loader_class._start

    def _start(self: Any, devices: list[Any]) -> list[Any]:
        if not any(d.type == "cuda" for d in devices):
            return start(self, devices)
        self._raw_device_batches = True
        return [_CpuBatches(it) for it in start(self, devices)]

    loader_class._start = _start


if ENABLED:
    os.environ["FASTLOAD_LIBCUDA"] = DRIVER
    sys.meta_path.insert(0, _AfterImport({"torch": _patch_torch, "fastload._loader": _patch_fastload_loader}))
