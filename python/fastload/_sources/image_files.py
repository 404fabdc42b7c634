"""Which files of a folder are images, by torchvision's ImageFolder rules, for the local folder
(image_folder.py) and one in object storage (image_folder_remote.py) alike."""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

__all__ = ["IMG_EXTENSIONS", "file_filter", "refuse_empty_classes"]

# torchvision.datasets.folder.IMG_EXTENSIONS
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def file_filter(extensions: Sequence[str] | None,
                is_valid_file: Callable[[str], bool] | None) -> Callable[[str], bool]:
    """Which files are images, as torchvision decides: is_valid_file(path), or a name ending with
    one of `extensions` (case-insensitive); exactly one of the two."""
    if (extensions is None) == (is_valid_file is None):
        raise ValueError("pass exactly one of extensions and is_valid_file")
    if is_valid_file is not None:
        return is_valid_file
    suffixes = tuple(e.lower() for e in extensions or ())
    return lambda path: path.lower().endswith(suffixes)


def refuse_empty_classes(classes: Iterable[str], found: set[str], extensions: Sequence[str] | None,
                         allow_empty: bool) -> None:
    """torchvision's error for class folders without a valid file, unless allow_empty."""
    empty = set(classes) - found
    if empty and not allow_empty:
        message = f"Found no valid file for the classes {', '.join(sorted(empty))}. "
        if extensions is not None:
            message += f"Supported extensions are: {', '.join(extensions)}"
        raise FileNotFoundError(message)
