"""Where fl.Tar's shards are: brace patterns expanded as webdataset writes them
("train-{000000..000146}.tar"), and the one function that turns what the user gave into the
storage seam's FileSet (`resolve_shards`): local paths, or URLs pinned and fetched into the cache."""
from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["expand_braces", "resolve_shards", "COMPRESSED_SUFFIXES"]

# Compressed tars have no random access: refused by name here (and by their bytes natively).
COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".tzst", ".gz")
_BRACE = re.compile(r"\{([^{}]*)\}")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


def expand_braces(pattern: str) -> list[str]:
    """Every name a brace pattern stands for, in order: "{a,b}" alternatives and "{000..146}"
    ranges (zero-padded to the width of the first bound when it has leading zeros), left to right."""
    m = _BRACE.search(pattern)
    if m is None:
        return [pattern]
    head, body, tail = pattern[:m.start()], m.group(1), pattern[m.end():]
    r = _RANGE.match(body)
    if r:
        lo, hi = int(r.group(1)), int(r.group(2))
        if hi < lo:
            raise ValueError(f"urls: the range {{{body}}} in {pattern!r} runs backwards")
        if hi - lo >= 10_000_000:
            raise ValueError(f"urls: the range {{{body}}} in {pattern!r} is too long ({hi - lo + 1} names)")
        width = len(r.group(1)) if r.group(1).lstrip("-").startswith("0") and len(r.group(1)) > 1 else 0
        items = [str(i).zfill(width) for i in range(lo, hi + 1)]
    elif "," in body:
        items = body.split(",")
    else:
        raise ValueError(f"urls: {{{body}}} in {pattern!r} is neither a range {{000..146}} nor alternatives {{a,b}}")
    return [head + item + rest for item in items for rest in expand_braces(tail)]


def _names(urls: Any) -> list[str]:
    if isinstance(urls, (str, os.PathLike)):
        given = [urls]
    elif isinstance(urls, (list, tuple)):
        given = list(urls)
    else:
        raise TypeError(f"urls must be a path, a URL, a brace pattern or a list of them, got {type(urls).__name__}")
    if not given:
        raise ValueError("urls is empty: give at least one tar shard")
    names: list[str] = []
    for u in given:
        if not isinstance(u, (str, os.PathLike)):
            raise TypeError(f"urls must hold paths or URLs (str), got {type(u).__name__}: {u!r}")
        names.extend(expand_braces(os.fspath(u)))
    return names


def _refuse_compressed(name: str) -> None:
    if name.lower().endswith(COMPRESSED_SUFFIXES):
        raise ValueError(f"tar shard {name!r} is compressed: a compressed tar has no random access (reading one "
                         "sample would decompress everything before it), so fastload reads uncompressed .tar shards. "
                         "Decompress it once (gunzip -k, xz -dk, zstd -d) and read the .tar; shards of "
                         "already-compressed members (JPEG, PNG) lose little without it")


def resolve_shards(urls: Any, *, cache_dir: str | None = None, cache_limit: Any = None,
                   storage_options: dict | None = None) -> Any:
    """The shards named by `urls` as a FileSet (the storage seam), in order: local paths (a
    folder: its .tar files, sorted), or URLs (s3://, gs://, http(s)://; a prefix is listed), each
    pinned to the version seen now and fetched into the cache when read."""
    from .._storage.file_set import FileSet, is_remote  # noqa: PLC0415 - the storage layer on demand

    names = _names(urls)
    remote = [n for n in names if "://" in n]
    if remote and len(remote) != len(names):
        raise ValueError(f"urls mixes URLs and local paths ({remote[0]!r}): give one or the other")
    if remote:
        for n in names:
            _refuse_compressed(n)
        given: Any = names[0] if isinstance(urls, str) and len(names) == 1 else names
        files = FileSet.resolve(given, what="urls", kind="tar shard", salt=b"tar", skip=_hidden,
                                cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options)
        for n in files.names:
            _refuse_compressed(n)
        return files
    if storage_options is not None or cache_limit is not None:
        raise ValueError("storage_options and cache_limit apply to shards in object storage (URLs); these shards "
                         "are local files")
    paths: list[str] = []
    for name in names:
        path = os.path.expanduser(name)
        if os.path.isdir(path):
            found = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".tar"))
            if not found:
                raise FileNotFoundError(f"urls: the folder {name!r} holds no .tar files")
            paths.extend(found)
            continue
        _refuse_compressed(name)
        if not os.path.exists(path):
            raise FileNotFoundError(f"urls: no tar shard at {name!r}")
        paths.append(path)
    seen: set[str] = set()
    for p in paths:
        real = os.path.realpath(p)
        if real in seen:
            raise ValueError(f"urls names the tar shard {p!r} twice: each shard is read once per epoch")
        seen.add(real)
    assert not is_remote(paths)
    return FileSet.resolve(paths, what="urls", kind="tar shard")


def _hidden(name: str) -> bool:
    return name.startswith(".")
