"""`fl.ImageFolder`: torchvision's ImageFolder layout (one folder per class under `root`) as a
fastload source. Classes, their indices and the order of the files follow torchvision's rules
(`find_classes`, `make_dataset`: class folders sorted by name, each walked with symbolic links
followed, roots and file names sorted, files kept by extension, case-insensitive), so a model
trained on either loader sees the same labels. Batches are {"image": uint8, "label": int64}; the
images are decoded natively on the collation threads (fl.Image; csrc/image/)."""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Sequence

import numpy as np

from .. import _C
from .._images.fallback import fallback_for
from .._images.spec import Image, image_backends

__all__ = ["ImageFolder", "IMG_EXTENSIONS", "find_classes", "list_images"]

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


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
    if (extensions is None) == (is_valid_file is None):
        raise ValueError("pass exactly one of extensions and is_valid_file")
    if extensions is not None:
        suffixes = tuple(e.lower() for e in extensions)

        def is_valid_file(path: str) -> bool:
            return path.lower().endswith(suffixes)

    assert is_valid_file is not None
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
    empty = set(class_to_idx) - found
    if empty and not allow_empty:
        message = f"Found no valid file for the classes {', '.join(sorted(empty))}. "
        if extensions is not None:
            message += f"Supported extensions are: {', '.join(extensions)}"
        raise FileNotFoundError(message)
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
    """

    def __init__(self, root: str | os.PathLike, image: Image, *, extensions: Sequence[str] | None = None,
                 is_valid_file: Callable[[str], bool] | None = None, allow_empty: bool = False):
        if not isinstance(image, Image):
            raise TypeError(f"image must be an fl.Image, got {type(image).__name__}")
        root = os.fspath(root)
        if "://" in root:
            raise ValueError(f"ImageFolder reads a local folder; got the URL {root!r} (object storage is not "
                             "supported for image folders yet)")
        root = os.path.expanduser(root)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"ImageFolder root {root!r} is not a folder")
        if extensions is None and is_valid_file is None:
            extensions = IMG_EXTENSIONS
        self.root = root
        self.image = image
        self.classes, self.class_to_idx = find_classes(root)
        self.samples = list_images(root, self.class_to_idx, extensions, is_valid_file, allow_empty)
        if not self.samples:
            raise FileNotFoundError(f"ImageFolder found no image files under {root!r}")
        self.targets = [label for _, label in self.samples]
        _warn_without_native(image)
        encoded = [os.fsencode(p) for p, _ in self.samples]
        self._paths = b"".join(encoded)
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in encoded], out=self._offsets[1:])
        self._labels = np.asarray(self.targets, dtype=np.int64)
        # crop="none" without a size: every image must be the first one's size (read from its header).
        self._own: tuple[int, int] | None = None
        if image.size is None:
            with open(self.samples[0][0], "rb") as f:
                _, width, height = _C.image_size(f.read(), fallback_for(image))
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
        return _C.ImageFileSource(self._paths, self._offsets, self._labels, self.image.native(self._own),
                                  fallback_for(self.image))

    def __repr__(self) -> str:
        return (f"fl.ImageFolder({self.root!r}, {len(self.samples)} images, {len(self.classes)} classes, "
                f"image={self.image!r})")
