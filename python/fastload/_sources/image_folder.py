"""`fl.ImageFolder`: torchvision's ImageFolder layout (one folder per class under `root`) as a
fastload source. Classes, their indices and the order of the files follow torchvision's rules
(`find_classes`, `make_dataset`: class folders sorted by name, each walked with symbolic links
followed, roots and file names sorted, files kept by extension, case-insensitive), so a model
trained on either loader sees the same labels. Batches are {"image": uint8, "label": int64}; the
images are decoded natively on the collation threads (fl.Image; csrc/image/). A root in object
storage (s3://, gs://, http(s)://) is listed and fetched through the storage seam
(image_folder_remote.py)."""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from .. import _C
from .._images.fallback import fallback_for
from .._images.spec import Image, image_backends
from .._columns.mapping import LazyTable
from .image_files import IMG_EXTENSIONS, file_filter, refuse_empty_classes

__all__ = ["ImageFolder", "IMG_EXTENSIONS", "find_classes", "list_images"]



def find_classes(root: str) -> tuple[list[str], dict[str, int]]:
    """The class folders of `root`, sorted by name, and their indices (torchvision's rule)."""
    with os.scandir(root) as entries:
        classes = sorted(e.name for e in entries if e.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {root}.")
    return classes, {c: i for i, c in enumerate(classes)}


def list_images(root: str, class_to_idx: dict[str, int], extensions: Sequence[str] | None,
                is_valid_file: Callable[[str], bool] | None, allow_empty: bool) -> list[tuple[str, int]]:
    """(path, class index) of every image, in torchvision's order."""
    is_valid_file = file_filter(extensions, is_valid_file)
    samples: list[tuple[str, int]] = []
    found: set[str] = set()
    for name in sorted(class_to_idx):
        folder = os.path.join(root, name)
        if not os.path.isdir(folder):
            continue
        index = class_to_idx[name]
        for dirpath, _, files in sorted(os.walk(folder, followlinks=True)):
            for f in sorted(files):
                path = os.path.join(dirpath, f)
                if is_valid_file(path):
                    samples.append((path, index))
                    found.add(name)
    refuse_empty_classes(class_to_idx, found, extensions, allow_empty)
    return samples


def _warn_without_native(spec: Image) -> None:
    backends = image_backends()
    missing = [f for f in ("jpeg", "png") if backends[f] is None or backends[f].endswith("(fallback)")]
    if not missing:
        return
    if spec.fallback is None or backends["other"] is None:
        raise RuntimeError(f"this fastload build decodes no {' or '.join(m.upper() for m in missing)} natively (built without "
                           "the libjpeg / libpng headers) and the fallback is unavailable: pip install pillow, or "
                           "rebuild with the headers installed (docs/install.md)")
    warnings.warn(f"this fastload build decodes {' and '.join(m.upper() for m in missing)} through PIL (built without the "
                  "libjpeg / libpng headers): slower than native; see docs/install.md", RuntimeWarning, stacklevel=3)


class ImageFolder:
    """Images in class folders: ``root/<class>/**/<file>``.

    ``fl.Loader(fl.ImageFolder(root, image=fl.Image(224, flip=0.5)), batch_size=256)`` gives
    batches ``{"image": (256, 224, 224, 3) uint8, "label": (256,) int64}``.

    - ``image``: the fl.Image spec applied to every file.
    - ``extensions``, ``is_valid_file``, ``allow_empty``: as torchvision's ImageFolder (by default
      its IMG_EXTENSIONS). A file's format is told by its bytes, not its name.
    - ``.classes``, ``.class_to_idx``, ``.samples`` ((path, class index) per sample) and
      ``.targets``: as torchvision computes them.
    - A root in object storage (``s3://bucket/train/``, ``gs://...``): listed once, each image
      pinned to the version listed and fetched into the cache along the run's order;
      ``cache_dir``, ``cache_limit``, ``storage_options`` as in docs/object-storage.md.
      ``http(s)://`` has no listing: name the images with ``files=`` (paths below the root,
      ``"cat/001.jpg"``, or their URLs). ``.samples`` then holds URLs.
    """

    def __init__(self, root: str | os.PathLike, image: Image, *, extensions: Sequence[str] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None, allow_empty: bool = False,
                 files: Sequence[str] | None = None, cache_dir: str | os.PathLike | None = None,
                 cache_limit: Any = None, storage_options: dict | None = None):
        if not isinstance(image, Image):
            raise TypeError(f"image must be an fl.Image, got {type(image).__name__}")
        if extensions is None and is_valid_file is None:
            extensions = IMG_EXTENSIONS
        self.image = image
        self._remote: Any = None
        root = os.fspath(root)
        if "://" in root:
            self._open_remote(root, files, extensions, is_valid_file, allow_empty, cache_dir, cache_limit,
                              storage_options)
            return
        if files is not None or cache_dir is not None or cache_limit is not None or storage_options is not None:
            raise ValueError("files, cache_dir, cache_limit and storage_options are for a root in object storage "
                             f"(s3://, gs://, http(s)://), not the local folder {root!r}")
        root = os.path.expanduser(root)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"ImageFolder root {root!r} is not a folder")
        self.root = root
        self.classes, self.class_to_idx = find_classes(root)
        self.samples = list_images(root, self.class_to_idx, extensions, is_valid_file, allow_empty)
        if not self.samples:
            raise FileNotFoundError(f"ImageFolder found no image files under {root!r}")
        self._finish(lambda: _read(self.samples[0][0]))

    def _open_remote(self, root: str, files: Sequence[str] | None, extensions: Sequence[str] | None,
                     is_valid_file: Callable[[str], bool] | None, allow_empty: bool, cache_dir: Any,
                     cache_limit: Any, storage_options: dict | None) -> None:
        from .image_folder_remote import RemoteImages  # noqa: PLC0415

        remote = RemoteImages(root, files, extensions, is_valid_file, allow_empty, cache_dir, cache_limit,
                              storage_options)
        self.root, self.classes, self.class_to_idx = root, remote.classes, remote.class_to_idx
        self.samples = [(name, int(label)) for name, label in zip(remote.files.names, remote.labels)]
        self._remote = remote
        # The cached copies, mapped by the collation threads after the fetcher made each present
        # (identities zero: the provider gives each download's own).
        stored = remote.files
        self._table = LazyTable(stored.paths, np.zeros(len(stored), dtype=np.int64), stored.sizes,
                                np.zeros((len(stored), 4), dtype=np.int64))
        stored.provide_to(self._table.files)
        self._finish(remote.first_image)

    def _finish(self, first_image: Callable[[], bytes]) -> None:
        """What local and remote folders share: targets, the native source's arrays, the size of a
        crop="none" image."""
        self.targets = [label for _, label in self.samples]
        _warn_without_native(self.image)
        encoded = [os.fsencode(p) for p, _ in self.samples]
        self._paths = b"".join(encoded)
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in encoded], out=self._offsets[1:])
        self._labels = np.asarray(self.targets, dtype=np.int64)
        # crop="none" without a size: every image must be the first one's size (read from its header).
        self._own: tuple[int, int] | None = None
        if self.image.size is None:
            _, width, height = _C.image_size(first_image(), fallback_for(self.image))
            self._own = (height, width)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def names(self) -> list[str]:
        return ["image", "label"]

    @property
    def shard_rows(self) -> list[int] | None:
        return None

    def native_source(self) -> Any:
        lazy = self._table.files if self._remote is not None else None  # made per call: a forked child maps its own
        return _C.ImageFileSource(self._paths, self._offsets, self._labels, self.image.native(self._own),
                                  fallback_for(self.image), lazy=lazy)

    # -- object storage (the Source protocol's optional members) -----------------------------
    def stored_files(self) -> Any:
        """The FileSet of the images in object storage, which follows the run's order (None: local)."""
        return self._remote.files if self._remote is not None else None

    def storage_stats(self) -> Any:
        """For a folder in object storage: bytes fetched, requests, hits, misses, waits."""
        if self._remote is None:
            raise ValueError("storage_stats() is for an image folder in object storage; this one is local")
        return self._remote.files.stats()

    def __reduce_ex__(self, protocol: Any) -> Any:
        if self._remote is None:
            return super().__reduce_ex__(protocol)
        # Credentials never travel (the copy reads them from its own process's chain), and a copy
        # must read the same versions of the same objects, else an error naming the first changed.
        remote = self._remote
        return _reopen, (remote.reopen_args, self.image, list(remote.files.names), list(remote.versions))

    def __repr__(self) -> str:
        return (f"fl.ImageFolder({self.root!r}, {len(self.samples)} images, {len(self.classes)} classes, "
                f"image={self.image!r})")


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _reopen(args: dict, image: Image, names: list[str], versions: list[str]) -> ImageFolder:
    """A pickled or copied ImageFolder in object storage, opened again: the same images at the
    same versions, or a ValueError naming what changed."""
    folder = ImageFolder(args["root"], image, **{k: v for k, v in args.items() if k != "root"})
    why = folder._remote.changed_since(names, versions)
    if why is not None:
        raise ValueError(f"{why} since this ImageFolder was pickled or copied: build it again")
    return folder
