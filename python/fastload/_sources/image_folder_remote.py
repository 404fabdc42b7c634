"""`fl.ImageFolder` over object storage (s3://, gs://, http(s)://): the folder is listed once
(one paginated listing of the prefix; http(s):// has none, so its files are named by `files=`
and each is HEAD once, side by side), classes and samples are derived from the listed keys by
torchvision's rules (folder_layout below), and every image becomes a file of one FileSet
(_storage/file_set.py): pinned to the version listed, fetched whole into the cache by the
source's fetcher along the run's order, one file per sample (FileSet.shards_read(per_sample=
True): the plan's sample ids are the fetcher's units, no Python per sample per batch), mapped
by the collation threads after the fetcher made it present (the fetcher/provider path,
csrc/README.md)."""
from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .._storage.cache import cache_key
from .._storage.file_set import FileSet, cache_folder, cache_limit_of, check_cache_holds, redacted
from .._storage.urls import Url, is_url, parse_url
from .image_files import file_filter, refuse_empty_classes

__all__ = ["RemoteImages", "folder_layout"]

_SALT = b"fastload image folder"


def folder_layout(rels: Sequence[str], root: str, extensions: Sequence[str] | None,
                  is_valid_file: Callable[[str], bool] | None, allow_empty: bool
                  ) -> tuple[list[str], dict[str, int], list[tuple[int, int]]]:
    """(classes, class_to_idx, (index into rels, class index) of each sample) of a folder whose
    files are `rels` ("/"-separated paths below `root`), by torchvision's find_classes and
    make_dataset: a class is a folder directly under root (here: one that holds an object; object
    storage has no empty folders), sorted by name; within a class, its folders in sorted order
    (os.walk's roots sorted), each folder's files sorted; a file kept if is_valid_file(its URL) or
    its name ends with one of `extensions` (case-insensitive). Files directly under root are no
    sample, as for torchvision."""
    is_valid_file = file_filter(extensions, is_valid_file)
    base = root if root.endswith("/") else root + "/"
    classes = sorted({rel.split("/", 1)[0] for rel in rels if "/" in rel.strip("/")})
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
    class_to_idx = {c: i for i, c in enumerate(classes)}
    # torchvision walks class by class; within one, sorted(os.walk()) orders the folders by their
    # path and each folder's files by name: the key (class, folder below root, file name).
    keyed = []
    for k, rel in enumerate(rels):
        folder, _, name = rel.rpartition("/")
        if not folder or not name:
            continue
        keyed.append((folder.split("/", 1)[0], folder, name, k))
    keyed.sort()
    samples, found = [], set()
    for cls, _, _, k in keyed:
        if is_valid_file(base + rels[k]):
            samples.append((k, class_to_idx[cls]))
            found.add(cls)
    refuse_empty_classes(classes, found, extensions, allow_empty)
    return classes, class_to_idx, samples


def _listing(root: str, files: Sequence[str] | None, options: Mapping[str, Any]
             ) -> tuple[Any, Url, list[Url], list[int], list[str]]:
    """(client, the root, every object under it, their sizes, their versions): one listing of the
    prefix (s3://, gs://), or for http(s):// (no listing) the `files` named, each HEAD once."""
    from .._storage.choose_client import make_client  # noqa: PLC0415

    where = parse_url(root, "root")
    client = make_client(where.scheme, dict(options))
    if where.scheme in ("s3", "gs"):
        if files is not None:
            raise ValueError(f"files= names the images of an http(s):// folder (which has no listing); {root} is listed")
        listed = [t for t in client.list(where) if not t[0].key.endswith("/")]
        if not listed:
            raise FileNotFoundError(f"{root}: no objects under this prefix")
        urls, sizes, tags = ([t[i] for t in listed] for i in range(3))
    else:
        if files is None:
            raise ValueError(f"root {root!r}: http(s):// has no listing; pass files=[...], the images' paths below "
                             "the root ('cat/001.jpg') or their URLs")
        urls = [_below(where, f, k) for k, f in enumerate(files)]
        if not urls:
            raise ValueError("files is empty: name the images of the folder")
        with concurrent.futures.ThreadPoolExecutor(max(1, min(client.concurrency, len(urls)))) as pool:
            stats = list(pool.map(client.stat, urls))
        sizes, tags = [n for n, _ in stats], [t for _, t in stats]
    for u in urls:
        reason = client.unreadable(u)
        if reason is not None:
            raise ValueError(reason)
    return client, where, urls, sizes, tags


def _below(root: Url, given: Any, k: int) -> Url:
    """files[k] (a path below the root, or a URL under it) as a URL."""
    if not isinstance(given, str):
        raise TypeError(f"files[{k}] must be a str, got {type(given).__name__}")
    url = parse_url(given, f"files[{k}]") if is_url(given) else root.child(given.lstrip("/"))
    base = root.child("").key
    if (url.scheme, url.bucket) != (root.scheme, root.bucket) or not url.key.startswith(base) or url.key == base:
        raise ValueError(f"files[{k}] = {given!r} is not a file below the root {root}")
    return url


class RemoteImages:
    """The images of a folder in object storage, in torchvision's sample order, as a FileSet
    (file k = sample k) with classes and labels. `ImageFolder` is its only user."""

    def __init__(self, root: str, files: Sequence[str] | None, extensions: Sequence[str] | None,
                 is_valid_file: Callable[[str], bool] | None, allow_empty: bool, cache_dir: Any, cache_limit: Any,
                 storage_options: Mapping[str, Any] | None):
        options = dict(storage_options or {})
        client, where, urls, sizes, tags = _listing(root, files, options)
        base = where.child("").key
        rels = [u.key[len(base):] for u in urls]
        self.classes, self.class_to_idx, chosen = folder_layout(rels, str(where), extensions, is_valid_file,
                                                                allow_empty)
        if not chosen:
            raise FileNotFoundError(f"ImageFolder found no image files under {root!r}")
        keep = [k for k, _ in chosen]
        urls, sizes, tags = [urls[k] for k in keep], [sizes[k] for k in keep], [tags[k] for k in keep]
        self.labels = np.asarray([label for _, label in chosen], dtype=np.int64)
        # The cache folder is keyed by every image's URL, size and version: a folder whose objects
        # were rewritten, added or removed gets another folder, never the old bytes.
        folder = cache_folder(cache_dir, cache_key(_SALT, *[f"{u} {n} {t}".encode() for u, n, t in zip(urls, sizes, tags)]))
        limit = cache_limit_of(cache_limit, folder)
        largest = int(np.argmax(sizes))
        check_cache_holds(limit, sizes[largest], urls[largest])
        # Names in the cache: the sample's index first (names below different classes never
        # collide), 1,000 to a folder: a download lists its folder for abandoned partial files
        # (cache.py), which must not cost O(images) per image.
        cached = [f"{k // 1000:04d}/{k:07d}-{os.path.basename(u.key)}" for k, u in enumerate(urls)]
        self.files = FileSet.of_objects(client, urls, sizes, tags, cached, folder, limit)
        self.files.shards_read(per_sample=True)
        self.versions = tags
        self.reopen_args = dict(root=root, files=None if files is None else list(files), extensions=extensions,
                                is_valid_file=is_valid_file, allow_empty=allow_empty, cache_dir=cache_dir,
                                cache_limit=cache_limit, storage_options=redacted(storage_options))

    def first_image(self) -> bytes:
        """The first sample's bytes (for crop="none" without a size: its header), by one GET."""
        return self.files.read_range(0, 0, self.files.sizes[0])

    def changed_since(self, names: Sequence[str], versions: Sequence[str]) -> str | None:
        """Why this listing is not the one recorded (a pickle's), or None: the first object whose
        version differs, or the set of images."""
        if list(names) != list(self.files.names):
            return "the folder's images changed (objects added, removed or renamed)"
        for name, before, now in zip(names, versions, self.versions):
            if before != now:
                return f"{name}: the object changed"
        return None
