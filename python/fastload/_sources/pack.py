"""fl.Pack: variable-length documents packed into fixed rows of `length` tokens, natively.

A Pack is a source over another source's list columns (fl.Arrow, fl.Parquet, fl.Dataset with
fl.Ragged columns, dataset directories with ragged columns). Its samples are packed rows: each
epoch the documents, in the Loader's order for that epoch, are cut into windows and each window
is packed best-fit-decreasing from the lengths alone (csrc/core/packing_plan.h); the collation
threads write the rows straight into the batch. The Loader's schedule for a Pack
(_pack_schedule.py) deals the epoch's packed rows to ranks as it deals samples.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .. import _C
from .._arguments import as_int
from .._machine import helper_threads
from .arrow import Arrow, is_arrow_data
from .protocol import check_fingerprint, default_order, fingerprint, member, stored_files
from .._columns.ragged import stored_scalar

__all__ = ["Pack"]

SPLITS: tuple[str, ...] = tuple(_C.PACK_SPLITS)
PARTS: tuple[str, ...] = tuple(_C.PACK_PARTS)  # segment_ids, position_ids, cu_seqlens, documents
_SCAN_THREADS = 8  # at most, of the process's CPU share (_machine.helper_threads)


def _list_kinds(source: Any) -> dict[str, str]:
    """Each column the inner source reads -> "list" (packable), or what else it is."""
    from .parquet import Parquet  # noqa: PLC0415 - imports pyarrow lazily itself

    if isinstance(source, Arrow):
        table = source._table
    elif isinstance(source, Parquet):
        table = source._schema_table
    else:
        return {name: "list" if ragged else "a column of fixed-size rows"
                for name, ragged in _C.pack_array_columns(source.native_source())}
    infos = {c["name"]: c for c in table.columns}
    kinds = {}
    for name in source._selected:
        info = infos[name]
        kinds[name] = "list" if info["kind"] == "list" else (
            f"a string column ({info['type']})" if info["kind"] == "bytes" else f"a {info['type']} column")
    return kinds


def _check_inner(source: Any) -> Any:
    from .directory_source import DiskDataset  # noqa: PLC0415
    from .arrays import Dataset  # noqa: PLC0415
    from .mix import Mix  # noqa: PLC0415
    from .parquet import Parquet  # noqa: PLC0415

    if isinstance(source, Pack):
        raise TypeError("source is already an fl.Pack")
    if isinstance(source, Mix):
        raise TypeError("fl.Pack over an fl.Mix is not supported: pack each source, or mix before writing the data")
    if not isinstance(source, (Arrow, Parquet, Dataset, DiskDataset)) and is_arrow_data(source):
        source = Arrow(source)  # a Hugging Face dataset, a pyarrow Table, Polars
    if not isinstance(source, (Arrow, Parquet, Dataset, DiskDataset)):
        raise TypeError(f"fl.Pack packs the list columns of fl.Arrow (or a Hugging Face dataset), fl.Parquet, "
                        f"fl.Dataset with fl.Ragged columns or a dataset directory; got {type(source).__name__}")
    if stored_files(source) is not None:
        raise ValueError("fl.Pack over data in object storage (s3://, gs://, http(s)://) is not supported yet: the "
                         "fetcher prefetches along sample ids, and a packed row's documents are known only to the "
                         "packer; copy the data to local disk first")
    return source


class Pack:
    """Packed rows of ``length`` tokens from a source's variable-length list columns.

    ``fl.Loader(fl.Pack(fl.Arrow(ds), length=4096), batch_size=8, shuffle=True)``: every batch
    holds ``batch_size`` rows; each row holds whole documents (or their pieces, ``split="split"``)
    back to back, padded at its end. Batches (see docs/packing.md):

    - each packed column: ``(batch, length)`` (``(batch, length, *item_shape)``), its own dtype;
    - ``segment_ids`` int32 ``(batch, length)``: 1, 2, ... per document of the row, 0 on padding;
    - ``position_ids`` int64 ``(batch, length)``: 0, 1, ... restarting at each document (and at
      the row's padding, which counts as one more segment);
    - ``cu_seqlens`` int32, 1-D: the segment boundaries over the flattened ``batch x length``
      tokens, each row's padding one more segment (FlashAttention's ``cu_seqlens``);
    - ``max_seqlen``: a Python int, the batch's longest segment (padding included);
    - with the Loader's ``with_index=True``: ``index`` (the packed rows' numbers) and ``documents``
      int64 ``(batch, S)``: the document (row id of the inner source) of each segment, -1 after the
      row's last (S = min(length, max_segments)).

    The epoch's packed rows are a pure function of (the documents' lengths, length, window,
    split, max_segments, the Loader's seed, shuffle and order, the epoch): ranks, even=,
    resume (also at another world size), steps= and plan() work on packed rows as on samples.
    Padding rows that even="pad"/"mask" adds are empty rows (all padding), never repeated
    documents.

    Args:
        source: fl.Arrow (a Hugging Face dataset or Arrow data is wrapped in one), fl.Parquet,
            fl.Dataset with fl.Ragged columns, or a dataset directory with ragged columns.
        length: tokens per row.
        columns: the list columns packed together, each row's documents the same in all (they
            must have equal lengths row by row: input_ids and labels). Default: every column of
            the source, which must then all be list columns; others are dropped by naming the
            ones to pack.
        pad: the pad value of every column, or ``{column: value}`` (others pad with 0), e.g.
            ``{"input_ids": 0, "labels": -100}``.
        window: documents of the epoch's order packed together. Default: enough documents for 256
            rows on average (mean tokens per document from the data), at least 1024 and at most
            65536: about 0.25% padding on lognormal lengths (docs/packing.md).
        split: a document longer than ``length``: "truncate" (keep its first ``length`` tokens),
            "split" (pieces of ``length`` tokens, each a row of its own, and the rest packed as any
            document; each piece is its own segment) or "error".
        max_segments: at most this many segments per row (None: no bound).

    An empty document (no tokens) is skipped and counted (``loader.stats().packing``). A Pack
    reads every document's length when it is made (a Parquet source decodes every row group once
    for it, and keeps the lengths: 4 bytes a document).
    """

    packs_rows = True  # the Loader deals packed rows (_pack_schedule.py)

    def __init__(self, source: Any, length: int, *, columns: Sequence[str] | None = None, pad: Any = 0,
                 window: int | None = None, split: str = "truncate", max_segments: int | None = None):
        length = as_int("length", length)
        if length <= 0:
            raise ValueError(f"length must be positive, got {length}")
        if max_segments is not None:
            max_segments = as_int("max_segments", max_segments)
            if max_segments < 1:
                raise ValueError(f"max_segments must be at least 1, got {max_segments}")
        if window is not None:
            window = as_int("window", window)
            if window <= 0:
                raise ValueError(f"window must be positive, got {window}")
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        source = _check_inner(source)
        self._args = {"length": length, "columns": None if columns is None else list(columns), "pad": pad,
                      "window": window, "split": split, "max_segments": max_segments}
        self.source = source
        self.length, self.split, self.max_segments = length, split, max_segments
        self.columns = self._pick_columns(source, columns)
        inner = source.native_source()
        pads = self._pad_bytes(inner, pad)
        self._native = _C.PackSource(inner, self.columns, length, pads, window or 0, split, max_segments or 0,
                                     False, helper_threads(_SCAN_THREADS), (source,))
        self._documents_native: Any = None
        self.scan = dict(_C.pack_scan(self._native))
        self.window = self.scan["window"]

    @staticmethod
    def _pick_columns(source: Any, columns: Sequence[str] | None) -> list[str]:
        kinds = _list_kinds(source)
        if columns is None:
            others = {n: k for n, k in kinds.items() if k != "list"}
            if others:
                name, kind = next(iter(others.items()))
                raise ValueError(f"column {name!r} is {kind}, not a list column: a packed row holds several "
                                 f"documents, so a per-document value has no place in it; name the list columns to "
                                 f"pack, e.g. columns={[n for n, k in kinds.items() if k == 'list']} (other "
                                 f"columns: {sorted(others)})")
            picked = list(kinds)
        else:
            if isinstance(columns, str):
                raise TypeError(f"columns must be a list of column names, got the string {columns!r}")
            picked = [str(c) for c in columns]
            if not picked:
                raise ValueError("columns must name at least one list column")
            if len(set(picked)) != len(picked):
                raise ValueError(f"columns names a column twice: {picked}")
            for name in picked:
                if name not in kinds:
                    raise ValueError(f"columns names {name!r}, which the source does not read; it reads {list(kinds)}")
                if kinds[name] != "list":
                    raise ValueError(f"column {name!r} is {kinds[name]}, not a list column: fl.Pack packs list "
                                     "columns (token ids, labels, loss masks)")
        if not picked:
            raise ValueError("the source has no list column to pack")
        clash = [n for n in picked if n in PARTS]
        if clash:
            raise ValueError(f"column {clash[0]!r} has a name fl.Pack gives its own part ({', '.join(PARTS)}); "
                             "rename it")
        return picked

    def _pad_bytes(self, inner: Any, pad: Any) -> list[bytes]:
        dtypes = {}
        for name, (code, bits), _, _ in inner.schema:
            dtypes[name] = _numpy_dtype(code, bits)
        if isinstance(pad, Mapping):
            unknown = [k for k in pad if k not in self.columns]
            if unknown:
                raise ValueError(f"pad names columns {unknown} that are not packed; packed: {self.columns}")
            values = {n: pad.get(n, 0) for n in self.columns}
        else:
            values = {n: pad for n in self.columns}
        return [_scalar_bytes(f"pad[{n!r}]", values[n], dtypes[n]) for n in self.columns]

    # ------------------------------------------------------------------ the Source protocol
    def __len__(self) -> int:
        """Documents (the inner source's rows); an epoch's packed rows: loader.plan(epoch)."""
        return int(self.scan["documents"])

    @property
    def names(self) -> list[str]:
        return list(self.columns) + list(PARTS[:3])

    @property
    def shard_rows(self) -> None:
        return None  # packed rows have no shards (the documents' shards order them: order="block")

    @property
    def document_shard_rows(self) -> list[int]:
        """The inner source's shards, which order="block" keeps together when ordering documents."""
        return list(self.source.shard_rows or [])

    @property
    def default_order(self) -> str:
        return default_order(self.source)

    def native_source(self, with_documents: bool = False) -> Any:
        if not with_documents:
            return self._native
        if self._documents_native is None:
            self._documents_native = _C.pack_with_documents(self._native)
        return self._documents_native

    def fingerprint(self) -> Any:
        return fingerprint(self.source)

    def check_fingerprint(self, fp: Any) -> None:
        check_fingerprint(self.source, fp)

    def state_key(self) -> dict[str, Any]:
        """What a resume state must match: the same documents packed the same way."""
        return {"documents": len(self), "tokens": int(self.scan["tokens"]), "length": self.length,
                "window": self.window, "split": self.split, "max_segments": self.max_segments,
                "columns": list(self.columns)}

    def __reduce__(self) -> Any:
        return (_rebuild, (self.source, self._args))

    def __repr__(self) -> str:
        return (f"Pack({self.source!r}, length={self.length}, columns={self.columns}, window={self.window}, "
                f"split={self.split!r}, max_segments={self.max_segments})")


def _scalar_bytes(label: str, value: Any, dtype: Any) -> bytes:
    if isinstance(dtype, np.dtype) or dtype is np.bool_:
        return stored_scalar(label, value, dtype).tobytes()
    import torch  # noqa: PLC0415 - bfloat16

    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{label} must be a number, got {value!r}")
    return torch.tensor([value], dtype=dtype).view(torch.uint8).numpy().tobytes()


def _numpy_dtype(code: int, bits: int) -> Any:
    kinds = {0: "i", 1: "u", 2: "f", 6: "b"}
    if code == 4 and bits == 16:
        import torch  # noqa: PLC0415 - bfloat16 has no numpy dtype

        return torch.bfloat16
    if code == 6:
        return np.bool_
    return np.dtype(f"{kinds[code]}{bits // 8}")


def _rebuild(source: Any, args: dict) -> Pack:
    length = args.pop("length")
    return Pack(source, length, **args)
