"""Reading a dataset directory's manifest.json strictly: every field is checked for its type and
range before anything uses it, so that a malformed directory is one DatasetError naming the file
and the field (`rows: 100.7`, `version: true`, a column named `index`, a FIFO, JSON nested a
thousand deep) instead of a hang, a RecursionError, or a silently wrong dataset.

The manifest is read relative to an open descriptor of the directory, and the shards are stat'ed
relative to the same descriptor: a directory replaced while it is being opened (an overwrite)
gives either the old dataset or the new one, never a mix."""
from __future__ import annotations

import json
import os
import stat
from typing import Any

import numpy as np

from .._columns.spec import RESERVED_NAMES

MANIFEST = "manifest.json"
FORMAT = "fastload-dataset"
VERSION = 1
CHECKSUM = "fl64"  # fastload._C.Checksum64 of each file's data bytes (after the .npy header), hex
_MAX_MANIFEST_BYTES = 1 << 30  # a manifest is ~100 bytes a shard file; far above any real one


class DatasetError(ValueError):
    """A dataset directory that cannot be opened as valid: missing, truncated or corrupt shards,
    a manifest that disagrees with its files, an unknown format version. The message names the file."""


class Bad(Exception):
    """A field of the manifest that is not what it must be: (field, message)."""

    def __init__(self, field: str, message: str):
        super().__init__(field, message)
        self.field, self.message = field, message


def want_int(value: Any, field: str, low: int = 0) -> int:
    # bool is an int to Python, and 100.7 or "100" are not counts: only a JSON integer is.
    if isinstance(value, bool) or not isinstance(value, int):
        raise Bad(field, f"must be an integer, got {value!r}")
    if value < low:
        raise Bad(field, f"must be at least {low}, got {value}")
    return value


def want(value: Any, kind: type, field: str, what: str) -> Any:
    if not isinstance(value, kind):
        raise Bad(field, f"must be {what}, got {value!r}")
    return value


def want_shape(value: Any, field: str) -> tuple[int, ...]:
    # The common case in one pass (a manifest of 100,000 shards has 100,000 shapes); `type is int`
    # rules out bool as well.
    if type(value) is list and all(type(s) is int and s >= 0 for s in value):
        return tuple(value)
    want(value, list, field, "a list of sizes")
    return tuple(want_int(s, f"{field}[{i}]") for i, s in enumerate(value))


def want_dtype(value: Any, field: str) -> np.dtype:
    want(value, str, field, "a numpy dtype string such as '<f4'")
    try:
        dtype = np.dtype(value)
    except (TypeError, ValueError):
        raise Bad(field, f"is not a numpy dtype: {value!r}") from None
    if dtype.kind not in "iufcb" or dtype.byteorder == ">" or dtype.fields is not None or dtype.subdtype:
        raise Bad(field, f"must be a little-endian bool or numeric dtype, got {value!r}")
    return dtype


def check_names(names: list[str], ragged: list[bool]) -> None:
    """The rule the in-memory Dataset uses: no reserved name, no name twice, and no column named
    like a ragged column's `<name>_lengths` (the batch would carry both under one key)."""
    seen: dict[str, str] = {}
    for k, (name, r) in enumerate(zip(names, ragged)):
        if name in RESERVED_NAMES:
            raise Bad(f"columns[{k}].name", f"{name!r} is reserved by the loader (reserved: "
                                            f"{', '.join(RESERVED_NAMES)})")
        outputs = [name] + ([f"{name}_lengths"] if r else [])
        for out in outputs:
            if out in seen:
                why = "twice" if out == name and seen[out] == "column" else "twice in a batch"
                raise Bad(f"columns[{k}].name", f"{name!r} gives the batch key {out!r} {why} "
                                                f"(a ragged column's lengths come as <name>_lengths)")
            seen[out] = "column" if out == name else "lengths"


def read_regular(dir_fd: int, rel: str, limit: int) -> bytes:
    """A file's bytes, refusing anything but a regular file before reading (a FIFO would block
    a plain open() until a writer appears)."""
    fd = os.open(rel, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Bad("", "is not a regular file")
        if st.st_size > limit:
            raise Bad("", f"is {st.st_size} bytes, more than a manifest can be ({limit})")
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                break
            chunks.append(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def parse(text: bytes) -> dict[str, Any]:
    """The manifest's JSON, with its format and version checked."""
    try:
        manifest = json.loads(text)
    except RecursionError:
        raise Bad("", "not valid JSON (nested too deeply)") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise Bad("", f"not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        fmt = manifest.get("format") if isinstance(manifest, dict) else None
        raise Bad("format", f"not a fastload dataset manifest (format {fmt!r})")
    version = manifest.get("version")
    if isinstance(version, bool) or version != VERSION or not isinstance(version, int):
        raise Bad("version", f"format version {version!r} is not one this fastload reads (it reads version "
                             f"{VERSION}); upgrade fastload or rewrite the dataset")
    return manifest
