"""The one seam between the Loader and what it reads: the `Source` protocol. Arrays (`Dataset`,
`Windows`), dataset directories (`Dataset.open`) and Python datasets implement it as peers; the
Loader takes any of them and asks nothing else.

A source is a length, the names of the batch parts it fills, its shard boundaries, and
`native_source()`: the native object (fastload._C.BatchSource) the collation threads fill batches
from, made from the source as it is now. The native side owns the batch layout (fastload._C.
BatchLayout): part sizes, types and names are asked of it, never recomputed here.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from .._arguments import _as_int

__all__ = ["Source", "declare_shards", "redeclare"]


@runtime_checkable
class Source(Protocol):
    """What a Loader reads.

    - ``len(source)``: samples; sample ids are ``range(len(source))``.
    - ``names``: the batch parts it fills, in order (the Loader adds "index" and "valid").
    - ``shard_rows``: samples per shard in id order, or None without shard structure (used by
      ``order="block"`` and ``partition="shards"``).
    - ``native_source()``: the native source the collation threads fill batches from.
    - optional ``default_order``: the order a shuffling Loader reads it in when ``order=`` is not
      given ("random" without it; fl.Parquet: "block", over its row groups). See default_order().
    - optional ``fingerprint()`` / ``check_fingerprint(fp)``: a cheap record, taken when a Loader
      is built, of where the source's bytes are, and a check at every ``iter()`` that raises a
      ValueError naming what changed (arrays resized or moved, files truncated or replaced).
    """

    def __len__(self) -> int: ...

    @property
    def names(self) -> list[str]: ...

    @property
    def shard_rows(self) -> list[int] | None: ...

    def native_source(self) -> Any: ...


def fingerprint(source: Any) -> Any:
    take = getattr(source, "fingerprint", None)
    return take() if take is not None else None


def check_fingerprint(source: Any, fp: Any) -> None:
    check = getattr(source, "check_fingerprint", None)
    if check is not None:
        check(fp)


def default_order(source: Any) -> str:
    """The order a Loader over `source` uses when order= is not given, decided here once (the
    Loader's configuration, tune's baseline and fl.Pack over an inner source all ask this)."""
    return getattr(source, "default_order", "random")


def declare_shards(source: Any, rows: Any) -> Any:
    """Declares shard boundaries on a source of one in-memory array per column (tests, benchmarks):
    `rows` samples per shard, in order, adding up to len(source). Returns the source. A source
    made of several arrays (or files) has its real shards, which cannot be redeclared."""
    rows = [_as_int("shard_rows", r) for r in rows]
    if any(r < 0 for r in rows) or sum(rows) != len(source):
        raise ValueError(f"shard_rows must be non-negative and add up to {len(source)}, got {rows}")
    if getattr(source, "_real_shards", False):
        raise ValueError("the source already has shard boundaries (its columns are lists of arrays or files); "
                         "_declare_shards is for sources of one array per column")
    source._shard_rows = rows
    return source


def redeclare(source: Any, shard_rows: list[int] | None) -> Any:
    """After a copy or unpickle: shard boundaries that were declared come back with the source."""
    if shard_rows is not None and source.shard_rows is None:
        declare_shards(source, shard_rows)
    return source


def as_source(obj: Any, *, pad: Any = None, max_length: Any = None, collate_fn: Any = None,
              worker_init_fn: Any = None, seed: int = 0) -> Source:
    """What the Loader reads from `obj`: a source as it is; a map-style dataset (__len__ and
    __getitem__) as a PythonSource with these options; anything else is refused with what to pass
    instead."""
    options = {"pad": pad, "max_length": max_length, "collate_fn": collate_fn, "worker_init_fn": worker_init_fn}
    if isinstance(obj, Source):
        given = [k for k, v in options.items() if v is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to Python datasets (__getitem__), not to {type(obj).__name__}: "
                             "an array source is gathered natively (Ragged columns pad natively)")
        return obj
    from .arrow import Arrow, is_arrow_data  # noqa: PLC0415 - numpy only; no Arrow library

    if is_arrow_data(obj):  # a Hugging Face Dataset, pyarrow Table, Polars/DuckDB result: read natively
        given = [k for k in ("collate_fn", "worker_init_fn") if options[k] is not None]
        if given:
            raise ValueError(f"{', '.join(given)} apply to Python datasets (__getitem__), not to Arrow data "
                             f"({type(obj).__name__}), which is gathered natively")
        return Arrow(obj, pad=pad, max_length=max_length)
    if type(obj).__name__ == "LazyFrame" and type(obj).__module__.startswith("polars"):
        raise TypeError("source is a Polars LazyFrame, a query not yet run: collect it first (fl.Loader(lf.collect(), "
                        "...)), which fastload then reads natively")
    check_map_style(obj)
    from .python import PythonSource  # noqa: PLC0415 - only Python datasets need it

    return PythonSource(obj, seed=seed, **options)


def check_map_style(obj: Any, what: str = "source") -> None:
    """Refuses, saying what to pass instead, anything but a map-style Python dataset (an object
    with __len__ and __getitem__): an array or tensor, a dataset class, a torch IterableDataset, a
    str, bytes or dict. The one check for the Loader and for a Mix's sources."""
    kind = type(obj).__name__
    if hasattr(obj, "__array_interface__") or _is_tensor(obj) or (type(obj).__module__.startswith("torch")
                                                                   and hasattr(obj, "dim")):
        raise TypeError(f"{what} must be a dataset, got {kind}: an array is not a dataset: wrap it, "
                        "fl.Dataset({'x': x}) (rows are samples, gathered natively)")
    if isinstance(obj, type):
        raise TypeError(f"{what} must be a dataset object, got the class {obj.__name__} itself: construct it first")
    refuse_iterable_dataset(obj, what)
    if not (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")) or isinstance(obj, (str, bytes, Mapping)):
        raise TypeError(f"{what} must be a fastload source (fl.Dataset, fl.Windows, fl.Dataset.open(...)) or a "
                        f"map-style dataset (an object with __len__ and __getitem__), got {kind}")


def _is_tensor(obj: Any) -> bool:
    import torch  # noqa: PLC0415 - loaded with fastload anyway

    return isinstance(obj, torch.Tensor)


def refuse_iterable_dataset(obj: Any, what: str = "source") -> None:
    """A torch IterableDataset promises iteration only: one that also defines __len__ and
    __getitem__ is refused here, by name, rather than read by index and failing later."""
    from torch.utils.data import IterableDataset  # noqa: PLC0415 - torch is loaded with fastload anyway

    if isinstance(obj, IterableDataset):
        raise TypeError(f"{what} is a torch IterableDataset ({type(obj).__name__}); fastload reads map-style datasets "
                        "by index (__len__ and __getitem__(i)): derive it from torch.utils.data.Dataset instead")
