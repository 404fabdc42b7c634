"""fastload.Mix: several sources read as one, in set proportions of every batch.

A Mix is a source (the Source protocol) whose sample ids lay its parts end to end; a Loader over
it runs the step-based stream (_stream_plan.py): every global step holds each part's share of the
global batch to within one sample, and each part is read in its own epochs. Native parts (arrays,
windows, dataset directories) are gathered by one native MixSource; Python datasets are read
through one concatenating dataset (so sample_rng is keyed by the id in the Mix).
"""
from __future__ import annotations

import bisect
import math
import numbers
from fractions import Fraction
from typing import Any, Mapping, Sequence

from .. import _C
from .._mix_quota import normalised
from .python import PythonSource, id_offset
from .protocol import Source, check_map_style, member
from .._stream_plan import StreamSources

__all__ = ["Mix"]

_KINDS = {0: "int", 1: "uint", 2: "float", 4: "bfloat", 5: "complex", 6: "bool"}


def _dtype_text(code_bits: Sequence[int], shape: Sequence[int]) -> str:
    code, bits = code_bits
    kind = _KINDS.get(code, f"code{code}")
    return f"{kind if kind == 'bool' else f'{kind}{bits}'}{list(shape)}"


def _number(option: str, name: str, value: Any, *, positive: bool = False) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, Fraction)):
        raise TypeError(f"{option}[{name!r}] must be a number, got {value!r}")
    if isinstance(value, numbers.Rational):
        exact = Fraction(int(value.numerator), int(value.denominator))
    else:
        as_float = float(value)  # numpy floats too: exactly the binary value given
        if not math.isfinite(as_float):
            raise ValueError(f"{option}[{name!r}] must be finite, got {value!r}")
        exact = Fraction(as_float)
    if exact < 0 or (positive and exact == 0):
        raise ValueError(f"{option}[{name!r}] must be {'positive' if positive else 'non-negative'}, got {value!r}")
    return exact


class Mix:
    """Sources read together, each in set proportions of every batch.

    Every global step (batch_size x world_size samples) holds each source's share to within one
    sample; each source is read in its own epochs (every sample once per epoch of that source,
    reshuffled per epoch); a source that runs out starts its next epoch (up-sampling) while the
    others go on. The order is a pure function of the configuration: no index array, any step
    is computed directly, resume is exact (see docs/blending.md).

    Args:
        sources: a dict of name -> source, or a list (named "0", "1", ...). A source is an
            fl.Dataset, fl.Windows, a dataset directory (fl.Dataset.open), or a map-style Python
            dataset; all of one kind (native or Python), with the same columns (names, dtypes and
            row shapes).
        weights: the share of each source (by name, or a list in order), any non-negative
            numbers, normalised exactly. Default: proportional to each source's length.
        epochs: instead of weights, passes over some sources per epoch of the Mix (others 1):
            weights proportional to passes x length.
        with_source: add "source", the int64 index of each row's source, to every batch.

    len(mix) is the samples of one epoch of the Mix: sum of passes x length with epochs=, else
    the sum of the lengths. Batch "index" values (with_index) are ids in the Mix: source j's
    sample i is sum of the lengths before j, plus i.
    """

    def __init__(self, sources: Mapping[str, Any] | Sequence[Any], weights: Mapping[str, Any] | Sequence[Any] | None
                 = None, *, epochs: Mapping[str, Any] | None = None, with_source: bool = False):
        if isinstance(sources, Mapping):
            names = list(sources.keys())
            for n in names:
                if not isinstance(n, str):
                    raise TypeError(f"Mix source names must be strings, got {n!r}")
            parts = list(sources.values())
        elif isinstance(sources, (list, tuple)):
            names = [str(i) for i in range(len(sources))]
            parts = list(sources)
        else:
            raise TypeError(f"sources must be a dict of name -> source or a list of sources, got "
                            f"{type(sources).__name__}")
        if not parts:
            raise ValueError("a Mix needs at least one source, got none")
        from .arrow import Arrow, is_arrow_data  # noqa: PLC0415

        parts = [Arrow(p) if is_arrow_data(p) and not isinstance(p, Source) else p for p in parts]
        lists = [list(member(p, "string_lists") or []) for p in parts]
        for n, got in zip(names[1:], lists[1:]):
            if got != lists[0]:  # a batch's string lists are each source's rows' lists end to end
                raise ValueError(f"Mix source {n!r} gives string columns {got} as lists of values, source "
                                 f"{names[0]!r} gives {lists[0]}: every source must give the same ones (pass "
                                 "max_length={column: n} for padded UTF-8 bytes instead, or drop them with columns=[...])")
        if not isinstance(with_source, bool):
            raise TypeError(f"with_source must be a bool, got {with_source!r}")
        self._names = names
        self._parts = parts
        self._python = self._kind_of_parts()
        self._lengths = [self._length(n, p) for n, p in zip(names, parts)]
        self._with_source = with_source
        self._weights, self._passes, self._given = self._resolve_weights(weights, epochs)
        if self._python:
            self._columns: list[str] | None = None  # inferred from the samples by the Loader's PythonSource
        else:
            self._columns = self._check_native_schemas()

    # ------------------------------------------------------------------ construction checks
    def _kind_of_parts(self) -> bool:
        """True if every part is a Python dataset, False if every part is a native source."""
        kinds = []
        for name, p in zip(self._names, self._parts):
            if isinstance(p, Mix):
                raise TypeError(f"Mix source {name!r} is a Mix: a Mix of Mixes is not supported; list their sources "
                                "in one Mix (weights multiply)")
            if isinstance(p, PythonSource):
                raise TypeError(f"Mix source {name!r} is a fastload.PythonSource: pass the dataset itself")
            if member(p, "packs_rows"):
                raise TypeError(f"Mix source {name!r} is an fl.Pack: a Mix of packed sources is not supported (each "
                                "epoch's number of packed rows depends on its order of documents); pack one source, "
                                "or concatenate the datasets before packing")
            if isinstance(p, Source):
                kinds.append("native")
            else:
                check_map_style(p, f"Mix source {name!r}")  # the Loader's own check
                kinds.append("python")
        if len(set(kinds)) > 1:
            native = [n for n, k in zip(self._names, kinds) if k == "native"]
            python = [n for n, k in zip(self._names, kinds) if k == "python"]
            raise TypeError(f"a Mix reads either native sources (arrays, windows, dataset directories: {native}) or "
                            f"Python datasets ({python}), not both: wrap the arrays in a Python dataset, or write "
                            "the Python dataset's samples to a dataset directory (fl.write_dataset)")
        return kinds[0] == "python"

    @staticmethod
    def _length(name: str, part: Any) -> int:
        n = len(part)
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"Mix source {name!r} is empty: len() is {n!r}")
        return n

    def _resolve_weights(self, weights: Any, epochs: Any) -> tuple[tuple[Fraction, ...], list[Fraction], Any]:
        names = self._names
        if weights is not None and epochs is not None:
            raise ValueError("give weights= or epochs=, not both: epochs= sets each source's weight to its passes x "
                             "its length")
        passes = [Fraction(1)] * len(names)
        if epochs is not None:
            given = self._by_name("epochs", epochs, partial=True)
            for j, n in enumerate(names):
                if n in given:
                    passes[j] = _number("epochs", n, given[n], positive=True)
            raw = [p * length for p, length in zip(passes, self._lengths)]
            return tuple(normalised(raw)), passes, {"epochs": dict(given)}
        if weights is None:
            return tuple(normalised([Fraction(n) for n in self._lengths])), passes, None
        given = self._by_name("weights", weights, partial=False)
        raw = [_number("weights", n, given[n]) for n in names]
        if sum(raw) == 0:
            raise ValueError(f"weights must not all be 0, got {dict(given)}")
        return tuple(normalised(raw)), passes, {"weights": {n: given[n] for n in names}}

    def _by_name(self, option: str, values: Any, *, partial: bool) -> dict[str, Any]:
        names = self._names
        if isinstance(values, Mapping):
            unknown = [k for k in values if k not in names]
            missing = [n for n in names if n not in values]
            if unknown or (missing and not partial):
                parts = []
                if unknown:
                    parts.append(f"unknown source(s) {unknown}")
                if missing and not partial:
                    parts.append(f"no {option[:-1]} for {missing}")
                raise ValueError(f"{option} must name the Mix's sources {names}: {'; '.join(parts)}")
            return dict(values)
        if isinstance(values, (list, tuple)) and not partial:
            if len(values) != len(names):
                raise ValueError(f"{option} must give one value per source ({len(names)}: {names}), got {len(values)}")
            return dict(zip(names, values))
        raise TypeError(f"{option} must be a dict of source name -> number"
                        + ("" if partial else " or a list in source order") + f", got {values!r}")

    def _check_native_schemas(self) -> list[str]:
        schemas = [p.native_source().schema for p in self._parts]
        first = schemas[0]
        first_names = [s[0] for s in first]
        for name, schema in zip(self._names[1:], schemas[1:]):
            got = [s[0] for s in schema]
            if got != first_names:
                missing = [c for c in first_names if c not in got]
                extra = [c for c in got if c not in first_names]
                raise ValueError(f"Mix source {name!r} has columns {got}, source {self._names[0]!r} has {first_names}"
                                 + (f": {name!r} lacks {missing}" if missing else "")
                                 + (f"; {name!r} adds {extra}" if extra else "")
                                 + ("" if missing or extra else " (in another order)"))
            for a, b in zip(first, schema):
                if a[1:] != b[1:]:
                    raise ValueError(f"Mix source {name!r}: column {b[0]!r} is {_dtype_text(b[1], b[2])} "
                                     f"({b[3]} bytes a row), but source {self._names[0]!r} has "
                                     f"{_dtype_text(a[1], a[2])} ({a[3]} bytes a row)")
        if self._with_source and _C.SOURCE_PART_NAME in first_names:
            raise ValueError(f"column name {_C.SOURCE_PART_NAME!r} is reserved by a Mix with with_source=True "
                             "(it adds the source of each row)")
        return first_names

    # ------------------------------------------------------------------ the Source protocol
    def __len__(self) -> int:
        return math.ceil(sum(p * n for p, n in zip(self._passes, self._lengths)))

    @property
    def names(self) -> list[str]:
        """The batch parts of the native sources (the Loader adds "source" with with_source); for
        Python datasets, inferred from the first sample when a Loader is built."""
        if self._columns is None:
            return self._python_reader().names
        return list(self._columns)

    @property
    def shard_rows(self) -> list[int] | None:
        return None  # each source's own shards order it within its epochs (StreamSources)

    def native_source(self) -> Any:
        if self._python:
            return self._python_reader().native_source()
        return _C.MixSource([p.native_source() for p in self._parts])

    def fingerprint(self) -> Any:
        from .protocol import fingerprint  # noqa: PLC0415

        return [fingerprint(p) for p in self._parts]

    def check_fingerprint(self, fps: Any) -> None:
        from .protocol import check_fingerprint  # noqa: PLC0415

        for name, p, fp in zip(self._names, self._parts, fps):
            try:
                check_fingerprint(p, fp)
            except ValueError as e:
                raise ValueError(f"Mix source {name!r}: {e}") from e

    # ------------------------------------------------------------------ what the Loader asks
    @property
    def source_names(self) -> list[str]:
        return list(self._names)

    @property
    def parts(self) -> list[Any]:
        """The sources, in the order of source_names."""
        return list(self._parts)

    @property
    def lengths(self) -> list[int]:
        return list(self._lengths)

    @property
    def weights(self) -> dict[str, float]:
        """Each source's normalised share of every batch."""
        return {n: float(w) for n, w in zip(self._names, self._weights)}

    @property
    def with_source(self) -> bool:
        return self._with_source

    @property
    def python(self) -> bool:
        return self._python

    @property
    def given(self) -> Any:
        """weights= or epochs= as given (None: by length), for the resume state."""
        return self._given

    def stream_sources(self) -> StreamSources:
        return StreamSources(tuple(self._names), tuple(self._lengths),
                             tuple(tuple(getattr(p, "shard_rows", None) or ()) for p in self._parts),
                             self._weights)

    def reader(self, *, pad: Any = None, max_length: Any = None, collate_fn: Any = None,
               worker_init_fn: Any = None, seed: int = 0) -> Any:
        """What the Loader reads: this Mix (native parts), or one PythonSource over the
        concatenated Python datasets, each part's structure checked against the first's."""
        options = {"pad": pad, "max_length": max_length, "collate_fn": collate_fn, "worker_init_fn": worker_init_fn}
        if not self._python:
            given = [k for k, v in options.items() if v is not None]
            if given:
                raise ValueError(f"{', '.join(given)} apply to Python datasets (__getitem__), not to a Mix of native "
                                 "sources (gathered natively; Ragged columns pad natively)")
            return self
        return self._python_reader(seed=seed, **options)

    def _python_reader(self, seed: int = 0, **options: Any) -> Any:
        reader = PythonSource(_concatenation(self._parts), seed=seed, **options)
        if options.get("collate_fn") is None:
            for name, part in zip(self._names[1:], self._parts[1:]):
                other = PythonSource(part, seed=seed, **options)
                _check_python_structure(self._names[0], reader, name, other)
        if self._with_source and _C.SOURCE_PART_NAME in reader.names:
            raise ValueError(f"sample field {_C.SOURCE_PART_NAME!r} is reserved by a Mix with with_source=True (it "
                             "adds the source of each row)")
        return reader

    def __repr__(self) -> str:
        parts = ", ".join(f"{n!r}: {len_} samples x {float(w):.3g}" for n, len_, w in
                          zip(self._names, self._lengths, self._weights))
        return f"Mix({parts}{', with_source' if self._with_source else ''})"


def _check_python_structure(first_name: str, first: Any, name: str, other: Any) -> None:
    a, b = first._leaves, other._leaves
    an, bn = [x[0] for x in a], [x[0] for x in b]
    if an != bn or first._tree[0] != other._tree[0]:
        raise ValueError(f"Mix source {name!r}'s samples have fields {bn}, source {first_name!r}'s have {an}")
    for x, y in zip(a, b):
        if x[1:5] != y[1:5]:
            raise ValueError(f"Mix source {name!r}: field {y[0]!r} is a {y[1]} {_dtype_text((y[2], y[3]), y[4])}, but "
                             f"source {first_name!r}'s is a {x[1]} {_dtype_text((x[2], x[3]), x[4])}")


def _concatenation(parts: list[Any]) -> Any:
    batched = all(callable(getattr(p, "__getitems__", None)) for p in parts)
    return (_BatchedConcatenation if batched else _Concatenation)(parts)


class _Concatenation:
    """Python datasets end to end: item i of the Mix is item i - offset_j of part j."""

    def __init__(self, parts: list[Any]):
        self.parts = list(parts)
        self.offsets = [0]
        for p in self.parts:
            self.offsets.append(self.offsets[-1] + len(p))

    def __len__(self) -> int:
        return self.offsets[-1]

    def check_lengths(self) -> None:
        """Refuses a part whose len() changed since the Mix was built (see PythonSource.check_length)."""
        for k, p in enumerate(self.parts):
            if len(p) != self.offsets[k + 1] - self.offsets[k]:
                raise ValueError(f"len() of the Mix's source {k} ({type(p).__name__}) is {len(p)!r}, but it was "
                                 f"{self.offsets[k + 1] - self.offsets[k]} when the Loader was built: fastload samples, "
                                 "resumes and plans over the lengths it was built with; build a new Mix and Loader")

    def __getitem__(self, i: int) -> Any:
        j = bisect.bisect_right(self.offsets, i) - 1
        if not 0 <= i < self.offsets[-1]:
            raise IndexError(f"index {i} out of range for a Mix of {self.offsets[-1]} samples")
        return self.parts[j][i - self.offsets[j]]


class _BatchedConcatenation(_Concatenation):
    """The same, for parts that all fetch several samples at once: one __getitems__ per run of
    ids of one part (a batch's rows come grouped by source)."""

    def __getitems__(self, ids: list[int]) -> list[Any]:
        out: list[Any] = []
        k = 0
        while k < len(ids):
            j = bisect.bisect_right(self.offsets, ids[k]) - 1
            lo, hi = self.offsets[j], self.offsets[j + 1]
            end = k + 1
            while end < len(ids) and lo <= ids[end] < hi:
                end += 1
            id_offset.value = lo  # sample_rng(i) in the part: keyed by lo + i, the id in the Mix
            try:
                out.extend(self.parts[j].__getitems__([i - lo for i in ids[k:end]]))
            finally:
                id_offset.value = 0
            k = end
        return out
