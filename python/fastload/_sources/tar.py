"""`fl.Tar`: WebDataset-format tar shards as a fastload source. Each shard is indexed once
(tar_index_cache.py; the headers walked natively), its members grouped into samples by
WebDataset's rule (key = the path up to the first dot of the file name, field = the rest,
lower-cased), and the collation threads read members as ranges of the memory-mapped shards
(csrc/image/tar_source.*): no tarfile, no Python per member. Samples are the sampler's unit
(exact ranks, equal steps, resume); shards are the file-level unit (order="block",
partition="shards")."""
from __future__ import annotations

import io
import os
from typing import Any, Mapping, Sequence

import numpy as np

from .. import _C
from .._storage.file_set import redacted
from .._columns.spec import numpy_dl_code
from .._images.fallback import fallback_for
from .._images.spec import Image
from .._columns.mapping import LazyTable
from .tar_index_cache import ShardIndex, default_index_root, index_shards
from .tar_urls import resolve_shards

__all__ = ["Tar", "field_kind"]

KEY = "__key__"
_INT = {"cls", "cls2", "index", "idx", "id", "label"}
_TEXT = {"txt", "text"}
_JSON = {"json", "jsn"}
IMAGE_SUFFIXES = {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "bmp", "tif", "tiff", "webp", "gif"}
# Never unpickled: unpickling runs code chosen by whoever wrote the shard.
PICKLE_SUFFIXES = {"pyd", "pickle", "pth", "pt"}


def field_kind(field: str, decoded: bool = False) -> str:
    """How a field is read, from the last part of its suffix ("seg.png" is a png): "int", "text",
    "json", "npy", "image" (with a decode= entry), else "bytes"."""
    if field == KEY:
        return "key"
    last = field.rsplit(".", 1)[-1]
    if decoded:
        return "image"
    if last in _INT:
        return "int"
    if last in _TEXT:
        return "text"
    if last in _JSON:
        return "json"
    if last == "npy":
        return "npy"
    return "bytes"


class Tar:
    """WebDataset tar shards: ``fl.Tar("shards/train-{000000..000146}.tar")``.

    - ``urls``: a path, a folder (its .tar files, sorted), a brace pattern, or a list of them.
      Local files, or URLs (s3://, gs://, http(s)://; a prefix is listed) fetched into the cache.
    - ``fields``: the fields to read, e.g. ``["jpg", "cls"]``, and ``"__key__"`` for the keys;
      None: every field found in the shards, and the keys. A sample that lacks a selected field
      is a ValueError naming the shard and the key.
    - ``decode``: ``{"jpg": fl.Image(224)}``: fields decoded natively into uint8 images.
    - ``cache_dir``: where shard indexes are kept (``<cache_dir>/tar-index``; default
      ``~/.cache/fastload/tar-index``), and for URLs the fetched shards; ``cache_limit``,
      ``storage_options``: for URLs, as in docs/object-storage.md.

    Batches: cls/cls2/index/idx/id/label -> int64; npy -> one array per batch (one shape and
    type per field); decoded images -> uint8; txt/text -> list of str; json -> list of parsed
    objects; anything else (undecoded images, pickles: never unpickled) -> list of bytes;
    ``__key__`` -> list of str. ``.empty_shards``: the shards without samples, skipped.
    """

    def __init__(self, urls: Any, *, fields: Sequence[str] | None = None, decode: Mapping[str, Image] | None = None,
                 cache_dir: str | os.PathLike | None = None, cache_limit: Any = None,
                 storage_options: dict | None = None):
        # What a pickle carries: storage_options without credentials (a copy takes them from the
        # credential chain of the process it lands in).
        self._args = dict(urls=urls, fields=fields, decode=decode, cache_dir=cache_dir, cache_limit=cache_limit,
                          storage_options=redacted(storage_options))
        cache_dir = os.path.expanduser(os.fspath(cache_dir)) if cache_dir is not None else None
        remote = any("://" in n for n in _flat(urls))
        self._files = resolve_shards(urls, cache_dir=cache_dir if remote else None, cache_limit=cache_limit,
                                     storage_options=storage_options)
        root = default_index_root() if cache_dir is None else os.path.join(cache_dir, "tar-index")
        indexes = index_shards(self._files, root)
        self.empty_shards = [ix.name for ix in indexes if ix.samples == 0]
        self._indexes = [ix for ix in indexes if ix.samples > 0]
        if not self._indexes:
            raise ValueError(f"none of the {len(indexes)} tar shards holds a sample (first: {indexes[0].name!r}): a "
                             "sample is a group of members named <key>.<field>")
        # The shards' files, mapped by the collation threads on demand (the mapping budget; each
        # local file checked against the identity it had when indexed; objects fetched first).
        identities = [ix.identity for ix in indexes]
        self._table = LazyTable(self._files.paths, np.zeros(len(indexes), dtype=np.int64), self._files.sizes,
                                identities)
        if self._files.fetched:
            self._files.provide_to(self._table.files)
            self._files.shards_read(unit_of_shard=[ix.file for ix in self._indexes])
        found: dict[str, None] = {}
        for ix in self._indexes:
            found.update(dict.fromkeys(ix.fields))
        self._fields = self._select(fields, list(found))
        self._decode = self._check_decode(decode)
        self._build()

    # -- arguments --------------------------------------------------------------------------
    @staticmethod
    def _select(fields: Sequence[str] | None, found: list[str]) -> list[str]:
        if fields is None:
            return [KEY, *found]
        if isinstance(fields, str) or not isinstance(fields, (list, tuple)):
            raise TypeError(f"fields must be a list of field names such as ['jpg', 'cls'], got {fields!r}")
        chosen = []
        for f in fields:
            if not isinstance(f, str):
                raise TypeError(f"fields must hold str, got {type(f).__name__}: {f!r}")
            name = f if f == KEY else f.lower()
            if name in chosen:
                raise ValueError(f"fields names {f!r} twice")
            if name != KEY and name not in found:
                raise ValueError(f"fields: no sample in these shards has the field {f!r}; found {found}")
            chosen.append(name)
        if not chosen:
            raise ValueError("fields is empty: name at least one field")
        return chosen

    def _check_decode(self, decode: Mapping[str, Image] | None) -> dict[str, Image]:
        if decode is None:
            return {}
        if not isinstance(decode, Mapping):
            raise TypeError(f"decode must be a dict of field -> fl.Image, got {type(decode).__name__}")
        out = {}
        for field, spec in decode.items():
            name = field.lower() if isinstance(field, str) else field
            if name not in self._fields or name == KEY:
                raise ValueError(f"decode names the field {field!r}, which is not read (fields: {self._fields})")
            if not isinstance(spec, Image):
                raise TypeError(f"decode[{field!r}] must be an fl.Image, got {type(spec).__name__}")
            if field_kind(name) != "bytes":
                raise ValueError(f"decode[{field!r}]: the field is read as {field_kind(name)}, not as image bytes")
            out[name] = spec
        return out

    # -- the sample table -------------------------------------------------------------------
    def _build(self) -> None:
        data_fields = [f for f in self._fields if f != KEY]
        starts = np.zeros(len(self._indexes) + 1, dtype=np.int64)
        np.cumsum([ix.samples for ix in self._indexes], out=starts[1:])
        n = int(starts[-1])
        offsets = np.empty((n, len(data_fields)), dtype=np.int64)
        sizes = np.empty((n, len(data_fields)), dtype=np.int64)
        key_lengths = np.empty(n, dtype=np.int64)
        for s, ix in enumerate(self._indexes):
            rows = slice(int(starts[s]), int(starts[s + 1]))
            for c, f in enumerate(data_fields):
                if f not in ix.fields:
                    raise ValueError(f"tar shard {ix.name!r}: the sample with key {ix.key(0)!r} has no field {f!r}"
                                     f"{self._hint()}")
                col = ix.fields.index(f)
                lacking = np.flatnonzero(ix.offsets[:, col] < 0)
                if len(lacking):
                    raise ValueError(f"tar shard {ix.name!r}: the sample with key {ix.key(int(lacking[0]))!r} has no "
                                     f"field {f!r} ({len(lacking)} samples of this shard lack it){self._hint()}")
                offsets[rows, c] = ix.offsets[:, col]
                sizes[rows, c] = ix.sizes[:, col]
            key_lengths[rows] = np.diff(ix.key_offsets)
        self._keys = np.concatenate([ix.keys for ix in self._indexes])
        self._key_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(key_lengths, out=self._key_offsets[1:])
        self._offsets, self._sizes, self._starts = offsets, sizes, starts
        self._specs = [self._field_spec(f, data_fields.index(f) if f != KEY else -1) for f in self._fields]
        self._fallback = fallback_for(next(iter(self._decode.values()))) if self._decode else None

    def _first_member(self, field: str) -> bytes:
        ix = self._indexes[0]
        c = ix.fields.index(field)
        start = int(ix.offsets[0, c])
        return self._files.read_range(ix.file, start, start + int(ix.sizes[0, c]))

    def _hint(self) -> str:
        if self._args["fields"] is None:
            return " (fields=None reads every field found in the shards: choose with fields=[...])"
        return ""

    def _field_spec(self, field: str, column: int) -> tuple:
        kind = field_kind(field, field in self._decode)
        descr, shape, dtype, image = "", [], (0, 0), None
        first = self._indexes[0]
        if kind == "npy":
            data = self._first_member(field)
            try:
                a = np.load(io.BytesIO(data), allow_pickle=False)
            except ValueError as e:
                raise ValueError(f"field {field!r} of key {first.key(0)!r} in tar shard {first.name!r} is not a .npy "
                                 f"array fastload can read: {e}") from None
            code = numpy_dl_code(a.dtype)
            if code is None or a.dtype.kind == "V":
                raise ValueError(f"field {field!r} of key {first.key(0)!r} in tar shard {first.name!r} has the dtype "
                                 f"{a.dtype}, which fastload does not batch")
            descr = _C._npy_header(data)[0]
            shape, dtype = list(a.shape), (code, a.dtype.itemsize * 8)
        elif kind == "image":
            spec = self._decode[field]
            own = None
            if spec.size is None:
                data = self._first_member(field)
                _, width, height = _C.image_size(data, fallback_for(spec))
                own = (height, width)
            image = spec.native(own)
        return (field, kind, column, descr, shape, dtype, image)

    # -- the Source protocol ----------------------------------------------------------------
    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def names(self) -> list[str]:
        return list(self._fields)

    @property
    def string_lists(self) -> list[str]:
        """The fields a batch carries as Python lists (str, parsed JSON, bytes)."""
        return [f for f in self._fields if field_kind(f, f in self._decode) in ("key", "text", "json", "bytes")]

    @property
    def shard_rows(self) -> list[int] | None:
        return [ix.samples for ix in self._indexes]

    @property
    def shards(self) -> list[str]:
        """The shards read (paths or URLs), in order (empty shards left out: see empty_shards)."""
        return [ix.name for ix in self._indexes]

    @property
    def fields(self) -> list[str]:
        return list(self._fields)

    def key(self, i: int) -> str:
        """The key of sample i."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range [0, {len(self)})")
        return bytes(self._keys[self._key_offsets[i]:self._key_offsets[i + 1]]).decode("utf-8", "replace")

    def native_source(self) -> Any:
        # Made per call, over the LazyTable's files: a forked child gets its own mappings.
        kept = self._indexes
        return _C.TarSource(self._table.files, [ix.name for ix in kept], [ix.size for ix in kept],
                            [ix.file for ix in kept], self._starts.tolist(), self._offsets, self._sizes, self._keys,
                            self._key_offsets, self._specs, self._fallback)

    def stored_files(self) -> Any:
        """The FileSet of shards in object storage, which follows the run's order (None: local)."""
        return self._files if self._files.fetched else None

    def storage_stats(self) -> Any:
        """For shards in object storage: bytes fetched, requests, hits, misses, waits."""
        if not self._files.fetched:
            raise ValueError("storage_stats() is for tar shards in object storage; these are local")
        return self._files.stats()

    def fingerprint(self) -> Any:
        return [ix.pin for ix in self._indexes]

    def check_fingerprint(self, fp: Any) -> None:
        if self._files.fetched:
            return  # every read of an object is pinned to its version: a rewrite fails the fetch, naming it
        for ix, pin in zip(self._indexes, fp):
            try:
                st = os.stat(ix.name)
            except OSError as e:
                raise ValueError(f"tar shard {ix.name!r} is gone ({e}): build fl.Tar again") from None
            if (st.st_size, st.st_mtime_ns, st.st_ino) != tuple(pin[1:]):
                raise ValueError(f"tar shard {ix.name!r} was rewritten since it was indexed (size {pin[1]} -> "
                                 f"{st.st_size}, or its modification time): build fl.Tar again")

    def __reduce__(self) -> Any:
        return (_rebuild, (self._args, self.fingerprint()))

    def __repr__(self) -> str:
        empty = f", {len(self.empty_shards)} empty skipped" if self.empty_shards else ""
        return f"fl.Tar({len(self)} samples in {len(self._indexes)} shards{empty}; fields {self._fields})"


def _rebuild(args: dict, fingerprint: Any) -> Tar:
    """A pickled or copied fl.Tar, opened again: it must find the shards the original read (the
    same local files, or the same versions of the objects), else an error naming the first that
    changed (a copy must never read other bytes than the original)."""
    source = Tar(**args)
    now = source.fingerprint()
    for before, after in zip(fingerprint, now):
        if tuple(before) != tuple(after):
            raise ValueError(f"tar shard {before[0]} changed since this fl.Tar was pickled or copied: build it again")
    if len(now) != len(fingerprint):
        raise ValueError("the tar shards changed since this fl.Tar was pickled or copied: build it again")
    return source


def _flat(urls: Any) -> list[str]:
    items = urls if isinstance(urls, (list, tuple)) else [urls]
    return [os.fspath(u) for u in items if isinstance(u, (str, os.PathLike))]
