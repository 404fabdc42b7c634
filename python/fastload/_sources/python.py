"""Map-style Python datasets as fastload sources: any object with __len__ and __getitem__(i) (a
torch.utils.data.Dataset included; __getitems__(indices) is used when defined).

The first sample fixes the batch's structure: dicts, tuples, lists and namedtuples (nested too)
whose leaves are numpy arrays, CPU tensors, numpy or Python scalars (each a part of the batch, a
tensor with the batch as its first axis) or anything else (strings, bytes, None...: a list per
batch). The collation threads call the dataset and write every leaf straight into its part of
the batch's buffers (csrc/bindings/py_source.cpp): no torch.stack, no intermediate batch, no
Python of fastload's own per sample.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .. import _C
from .._columns.spec import numpy_dl_code
from .._columns.ragged import pad_bytes

__all__ = ["PythonSource", "SampleError", "sample_rng"]

_DL_INT, _DL_UINT, _DL_FLOAT, _DL_BFLOAT, _DL_COMPLEX, _DL_BOOL = 0, 1, 2, 4, 5, 6
_TORCH_DL = {torch.bool: (_DL_BOOL, 8), torch.uint8: (_DL_UINT, 8), torch.int8: (_DL_INT, 8),
             torch.int16: (_DL_INT, 16), torch.int32: (_DL_INT, 32), torch.int64: (_DL_INT, 64),
             torch.float16: (_DL_FLOAT, 16), torch.float32: (_DL_FLOAT, 32), torch.float64: (_DL_FLOAT, 64),
             torch.bfloat16: (_DL_BFLOAT, 16), torch.complex64: (_DL_COMPLEX, 64),
             torch.complex128: (_DL_COMPLEX, 128)}
for _name in ("uint16", "uint32", "uint64"):
    if hasattr(torch, _name):
        _TORCH_DL[getattr(torch, _name)] = (_DL_UINT, int(_name[4:]))


class SampleError(RuntimeError):
    """A sample could not be fetched or collated: the dataset's __getitem__ (or __getitems__, or
    collate_fn) raised, or a sample's field disagrees with the first sample's. The message names
    the sample index, the field and the batch; when the dataset raised, its own exception (with
    its traceback) is the __cause__."""


# ---------------------------------------------------------------------------- sample_rng
_probe = threading.local()  # the sample being read at construction (inferring the structure)
# Inside a Mix part's __getitems__: the part's first id in the Mix, so that sample_rng(i) with the
# part's own index i is keyed by the id in the Mix, as sample_rng() is in __getitem__.
id_offset = threading.local()


def sample_rng(index: int | None = None) -> np.random.Generator:
    """A numpy Generator for the sample being fetched, seeded from (the loader's seed, the epoch,
    the sample index): call it inside __getitem__ for augmentations. The same sample in the same
    epoch gets the same random stream for any number or kind of workers and after a resume.
    Inside __getitems__ (several samples per call), pass the sample's index. With steps= or a
    Mix, "epoch" is the global step (a sample read again in a later epoch of its source is in
    another step) and a Mix's sample index is its id in the Mix."""
    context = _C._sample_context()
    if context is None:
        context = getattr(_probe, "context", None)
    if context is None:
        raise RuntimeError("fastload.sample_rng() is for a dataset's __getitem__ while a fastload Loader fetches "
                           "samples; outside one there is no (seed, epoch, sample) to derive it from")
    seed, epoch, current = context
    if index is None:
        if current < 0:
            raise RuntimeError("inside __getitems__ fastload.sample_rng(i) needs the sample's index i")
        index = current
    else:
        index = int(index) + getattr(id_offset, "value", 0)
    # SeedSequence mixes all three words: nearby seeds, epochs and indices give unrelated streams.
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, int(index), 0x5EED])))


@contextmanager
def _probing(seed: int) -> Iterator[None]:
    _probe.context = (seed, 0, 0)
    try:
        yield
    finally:
        _probe.context = None


# ---------------------------------------------------------------------------- structure
class _Inference:
    """Walks the first sample: the tree for the native side and a description of every leaf."""

    def __init__(self, pad: dict[str, Any], max_length: dict[str, int]):
        self.pad, self.max_length = pad, max_length
        self.leaves: list[tuple] = []
        self.names: list[str] = []
        self.used: set[str] = set()
        self.has_ragged_outside_dict = False

    def node(self, value: Any, path: str, in_dict: bool) -> tuple:
        if isinstance(value, Mapping):
            keys = list(value.keys())
            for k in keys:
                if not isinstance(k, str):
                    raise TypeError(f"sample field {path or '<sample>'!r}: dict keys must be strings, got {k!r}")
            return ("dict", keys, [self.node(value[k], f"{path}.{k}" if path else k, True) for k in keys])
        if isinstance(value, tuple) and hasattr(type(value), "_fields"):
            return ("namedtuple", type(value), [self.node(v, f"{path}.{i}" if path else str(i), False)
                                                for i, v in enumerate(value)])
        if isinstance(value, (tuple, list)):
            kind = "tuple" if isinstance(value, tuple) else "list"
            return (kind, [self.node(v, f"{path}.{i}" if path else str(i), False) for i, v in enumerate(value)])
        return ("leaf", self.leaf(value, path or "sample", in_dict))

    def leaf(self, value: Any, name: str, in_dict: bool) -> int:
        self.used.add(name)
        index = len(self.leaves)
        numeric = not isinstance(value, (np.ndarray, np.generic)) or np.asarray(value).dtype.kind in "biufc" or (
            np.asarray(value).dtype.name == "bfloat16")
        if isinstance(value, (np.ndarray, np.generic, torch.Tensor)) and numeric:  # first: np.float64 is a float too
            self.leaves.append(self.array(value, name, in_dict))
        elif isinstance(value, bool):
            self.leaves.append((name, "bool", _DL_BOOL, 8, [], 1, 0, 0, b""))
        elif isinstance(value, int):
            self.leaves.append((name, "int", _DL_INT, 64, [], 8, 0, 0, b""))
        elif isinstance(value, float):
            self.leaves.append((name, "float", _DL_FLOAT, 32, [], 4, 0, 0, b""))
        else:
            self.leaves.append((name, "object", 0, 8, [], 0, 0, 0, b""))
            if name in self.pad:
                raise TypeError(f"pad names field {name!r}, which is a {type(value).__name__}, not an array")
        return index

    def array(self, value: Any, name: str, in_dict: bool) -> tuple:
        if isinstance(value, torch.Tensor):
            if value.device.type != "cpu":
                raise ValueError(f"sample field {name!r} is a tensor on {value.device}; a dataset must return CPU "
                                 "data (the loader copies batches to the device)")
            if value.is_sparse or value.layout != torch.strided or value.is_nested:
                raise TypeError(f"sample field {name!r} must be a dense tensor, got layout {value.layout}")
            if value.dtype not in _TORCH_DL:
                raise TypeError(f"sample field {name!r} has unsupported dtype {value.dtype}")
            code, bits = _TORCH_DL[value.dtype]
            shape = [int(s) for s in value.shape]
        else:
            a = np.asarray(value)
            code = numpy_dl_code(a.dtype)
            if code is None or code == _DL_BFLOAT:
                raise TypeError(f"sample field {name!r} has unsupported dtype {a.dtype}; fastload takes bool and "
                                "numeric dtypes (strings and objects only as Python values)")
            bits = a.dtype.itemsize * 8
            shape = [int(s) for s in a.shape]
        itemsize = bits // 8
        if name not in self.pad:
            return (name, "array", code, bits, shape, math.prod(shape) * itemsize, 0, 0, b"")
        if not shape:
            raise ValueError(f"pad names field {name!r}, a scalar: only arrays with a first axis can be padded")
        if not in_dict:
            raise ValueError(f"pad names field {name!r}, which is not in a dict: a padded field and its "
                             f"{name}_lengths need dict samples")
        if name not in self.max_length:
            raise ValueError(f"pad names field {name!r} without max_length={{{name!r}: N}}: batches hold every row "
                             "padded to a fixed length (longer rows are cut)")
        length = self.max_length[name]
        item = math.prod(shape[1:]) * itemsize
        probe = value if isinstance(value, torch.Tensor) else np.asarray(value)
        pad = pad_bytes(f"pad for field {name!r}", self.pad[name], probe)
        return (name, "ragged", code, bits, shape[1:], length * item, item, length, pad)


def _check_options(option: str, value: Any, kind: type) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{option} must be a dict of field name -> value, got {value!r}")
    for k, v in value.items():
        if not isinstance(k, str):
            raise TypeError(f"{option} keys must be field names (str), got {k!r}")
        if kind is int and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0):
            raise ValueError(f"{option}[{k!r}] must be a positive integer, got {v!r}")
    return dict(value)


class PythonSource:
    """A map-style dataset as a fastload source (see fastload.Source). The Loader makes one for
    any object with __len__ and __getitem__; build one yourself to inspect `names`, or to keep a
    Python dataset's options with it.

    The options that apply to Python datasets only live here (fl.Loader takes them too, for code
    written for torch's DataLoader): pad and max_length (padding of variable-length fields),
    collate_fn, worker_init_fn, workers ("threads" or "processes": where __getitem__ runs; None:
    the Loader's choice, threads by default) and timeout (seconds a next() may wait; None: the
    Loader's). seed seeds the probe of the first sample."""

    def __init__(self, dataset: Any, *, pad: Mapping[str, Any] | None = None,
                 max_length: Mapping[str, int] | None = None, collate_fn: Callable[[list], Any] | None = None,
                 worker_init_fn: Callable[[int], Any] | None = None, workers: str | None = None,
                 timeout: float | None = None, seed: int = 0):
        if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
            raise TypeError(f"a map-style dataset needs __len__ and __getitem__, got {type(dataset).__name__}")
        for option, fn in (("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(f"{option} must be callable, got {fn!r}")
        if workers not in (None, "threads", "processes"):
            raise ValueError(f"workers must be one of ('threads', 'processes'), got {workers!r}")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0):
            raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
        self.workers, self.timeout = workers, timeout
        self._worker_init = worker_init_fn
        size = len(dataset)
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"dataset is empty: len(dataset) is {size!r}")
        self._dataset = dataset
        self._size = size
        self._collate = collate_fn
        getitems = getattr(dataset, "__getitems__", None)
        self._getitems = getitems if callable(getitems) else None
        pads = _check_options("pad", pad, object)
        lengths = _check_options("max_length", max_length, int)
        unpadded = sorted(set(lengths) - set(pads))
        if unpadded:  # as pad= without max_length= is refused: the field would fail at its first batch
            raise ValueError(f"max_length names field(s) {unpadded} without pad=: a field is padded to its max_length "
                             f"only with a pad value; give pad={{{unpadded[0]!r}: 0}} (or the value to pad with) too")
        if collate_fn is not None:
            if pads or lengths:
                raise ValueError("pad and max_length apply to the loader's own collation, not with collate_fn")
            self._leaves: list[tuple] = []
            self._tree: tuple = ("leaf", -1)
            self._dict = False
            self._names: list[str] = []
            return
        with _probing(seed):
            first = self._first_of_getitems() if self._getitems else dataset[0]
        inference = _Inference(pads, lengths)
        self._tree = inference.node(first, "", False)
        unknown = (set(pads) | set(lengths)) - inference.used
        if unknown:
            raise ValueError(f"pad/max_length name fields the samples do not have: {sorted(unknown)} "
                             f"(fields: {sorted(inference.used)})")
        self._leaves = inference.leaves
        self._dict = self._tree[0] == "dict"
        self._names = [n for leaf in self._leaves if leaf[1] != "object"
                       for n in ((leaf[0], _C.ragged_lengths_name(leaf[0])) if leaf[1] == "ragged" else (leaf[0],))]

    def _first_of_getitems(self) -> Any:
        """__getitems__([0])[0], read as the collation threads read every batch's: any iterable of
        samples (a generator too) is taken whole; anything else is a TypeError naming __getitems__."""
        samples = self._getitems([0])
        if isinstance(samples, (str, bytes, Mapping)) or not hasattr(samples, "__iter__"):
            raise TypeError(f"dataset.__getitems__ must return the samples (a list, one per index); "
                            f"{type(self._dataset).__name__}.__getitems__([0]) returned {type(samples).__name__}")
        if not isinstance(samples, (list, tuple)):
            samples = list(samples)
        if len(samples) != 1:
            raise ValueError(f"dataset.__getitems__ returned {len(samples)} samples for 1 index "
                             f"({type(self._dataset).__name__}.__getitems__([0]))")
        return samples[0]

    def check_length(self) -> None:
        """Refuses a dataset whose len() changed since the Loader was built: the sampler, state_dict()
        and plan() are over the length read then (DataLoader would read the new one)."""
        parts = getattr(self._dataset, "check_lengths", None)  # a Mix's datasets, end to end
        if parts is not None:
            return parts()
        size = len(self._dataset)
        if size != self._size:
            raise ValueError(f"len(dataset) is {size!r}, but it was {self._size} when the Loader was built: fastload "
                             "samples, resumes and plans over the length it was built with; build a new Loader over "
                             "the dataset as it is now")

    def fingerprint(self) -> int:
        return self._size

    def check_fingerprint(self, fp: Any) -> None:
        """At every iter(): the length has not changed (see check_length)."""
        self.check_length()

    def __len__(self) -> int:
        return self._size

    @property
    def names(self) -> list[str]:
        """The batch parts the loader fills natively (a padded field adds <name>_lengths); fields
        that are not arrays or scalars travel as lists and have no part."""
        return list(self._names)

    @property
    def shard_rows(self) -> list[int] | None:
        return None

    @property
    def dataset(self) -> Any:
        return self._dataset

    @property
    def dict_samples(self) -> bool:
        """Whether batches are dicts (the loader can add "index" and "valid" to them)."""
        return self._dict

    @property
    def collates(self) -> bool:
        return self._collate is not None

    def worker_payload(self) -> tuple:
        """What a worker process needs to build batches as this source does (pickled once)."""
        return (self._dataset, self._getitems is not None, self._collate, self._worker_init, self._leaves, self._tree,
                self._size)

    def native_source(self) -> Any:
        return _C.PythonSource(self._dataset, self._getitems, self._collate, self._worker_init, self._leaves,
                               self._tree, self._size)

    def __repr__(self) -> str:
        return f"PythonSource({type(self._dataset).__name__}, {self._size} samples; parts {self._names})"
