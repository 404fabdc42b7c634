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

from .._arguments import as_int

__all__ = ["Source", "OPTIONAL_MEMBERS", "member", "default_order", "declare_shards", "redeclare", "attach_storage", "follow_run"]


@runtime_checkable
class Source(Protocol):
    """What a Loader reads.

    - ``len(source)``: samples; sample ids are ``range(len(source))``.
    - ``names``: the batch parts it fills, in order (the Loader adds "index" and "valid").
    - ``shard_rows``: samples per shard in id order, or None without shard structure (used by
      ``order="block"`` and ``partition="shards"``).
    - ``native_source()``: the native source the collation threads fill batches from.

    Optional members (OPTIONAL_MEMBERS: the Loader asks a source nothing else, and a source
    without one is read as its default says):

    - ``default_order`` ("random"): the order a shuffled Loader reads it in when ``order=`` is
      not given ("block" for Parquet: windows of row groups, each decoded about once); asked
      once, through default_order() below.
    - ``string_lists`` (none): names of its list-of-strings columns (a Mix joins them).
    - ``packs_rows`` (False): its samples are packed rows (fl.Pack): the Loader deals packed rows.
    - ``fingerprint()`` / ``check_fingerprint(fp)`` (nothing checked): a cheap record, taken
      when a Loader is built, of where the source's bytes are, and a check at every ``iter()``
      that raises a ValueError naming what changed (arrays resized or moved, files replaced).
    - ``stored_files()`` (None: nothing is fetched): the source follows the run's order. The
      FileSet (_storage/file_set.py) of files it reads from object storage: the Loader hands it
      the order of each run (what to prefetch and what to evict) and reads its counters.
    """

    def __len__(self) -> int: ...

    @property
    def names(self) -> list[str]: ...

    @property
    def shard_rows(self) -> list[int] | None: ...

    def native_source(self) -> Any: ...


# The optional members of a Source and the default of a source that has none (see Source).
OPTIONAL_MEMBERS: dict[str, Any] = {
    "default_order": "random",
    "string_lists": (),
    "packs_rows": False,
    "fingerprint": None,
    "check_fingerprint": None,
    "stored_files": None,
}


def member(source: Any, name: str) -> Any:
    """The optional member `name` of a source, or its default (only declared members are asked)."""
    if name not in OPTIONAL_MEMBERS:
        raise KeyError(f"{name!r} is not a member of the Source protocol (see OPTIONAL_MEMBERS)")
    return getattr(source, name, OPTIONAL_MEMBERS[name])


def fingerprint(source: Any) -> Any:
    take = member(source, "fingerprint")
    return take() if take is not None else None


def check_fingerprint(source: Any, fp: Any) -> None:
    check = member(source, "check_fingerprint")
    if check is not None:
        check(fp)


def stored_files(source: Any) -> Any:
    """The FileSet a source fetches along the run's order, or None."""
    files = member(source, "stored_files")
    return files() if callable(files) else None


def attach_storage(order: Any, kind: str | None, threads: int) -> Any:
    """At Loader construction (see _storage/plan.py): each source that follows the run's order
    checks its cache holds what one step reads and readies its fetcher; returns the storage
    counters of the runs (RunStorage). Object storage is imported only where a source has it."""
    if not any(stored_files(s) is not None for s in order.sources):
        return _NoStorage()
    from .._storage.plan import attach_loader  # noqa: PLC0415 - only for sources in object storage

    return attach_loader(order, kind, threads)


def follow_run(order: Any) -> None:
    """At each run's start: every source that follows the run's order is given it."""
    if any(stored_files(s) is not None for s in order.sources):
        from .._storage.plan import follow_run as follow  # noqa: PLC0415

        follow(order)


class _NoStorage:
    """The storage counters of a Loader that reads nothing from object storage."""

    def begin(self) -> None:
        pass

    def stats(self) -> None:
        return None


def default_order(source: Any) -> str:
    """The order a Loader over `source` uses when order= is not given, decided here once (the
    Loader's configuration, tune's baseline and fl.Pack over an inner source all ask this)."""
    return member(source, "default_order")


def declare_shards(source: Any, rows: Any) -> Any:
    """Declares shard boundaries on a source of one in-memory array per column (tests, benchmarks):
    `rows` samples per shard, in order, adding up to len(source). Returns the source. A source
    made of several arrays (or files) has its real shards, which cannot be redeclared."""
    rows = [as_int("shard_rows", r) for r in rows]
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
