"""`fl.Image`: what the decode stage makes of each encoded image (a plain, picklable value), and
what this build decodes it with (`fl.image_backends()`). The decode itself is native
(csrc/image/): on the collation threads, per sample, header -> crop drawn from the sample's stream
-> decode of only what the crop needs -> antialiased resize -> flip -> uint8 into the batch slot.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

from .. import _C
from .._arguments import INT64_MAX, as_int

__all__ = ["Image", "ImageError", "image_backends", "DEFAULT_MAX_PIXELS"]

# PIL's Image.MAX_IMAGE_PIXELS: the size past which PIL calls an image a decompression bomb.
DEFAULT_MAX_PIXELS = 89_478_485
_CROPS = ("random", "center", "none")
_LAYOUTS = ("HWC", "CHW")
_FALLBACKS = ("pil", None)
_MAX_SIDE = 1 << 15  # csrc/image/image_spec.cpp


class ImageError(OSError):
    """An image could not be decoded or was refused: not an image, corrupt or truncated data, over
    the pixel limit (`fl.Image(max_pixels=...)`), a format with no decoder, or (crop="none"
    without a size) a size other than the first image's. The message names the file or row and
    what the decoder said. An OSError, as PIL's UnidentifiedImageError is."""


def _size(value: Any, name: str = "size") -> tuple[int, int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        pair = (int(value), int(value))
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        pair = (as_int(f"{name}[0]", value[0]), as_int(f"{name}[1]", value[1]))
    else:
        raise TypeError(f"{name} must be an int or a (height, width) pair, got {value!r}")
    if not all(0 < v <= _MAX_SIDE for v in pair):
        raise ValueError(f"{name} must be positive and at most {_MAX_SIDE} a side, got {value!r}")
    return pair


def _range(name: str, value: Any, default: tuple[float, float]) -> tuple[float, float]:
    if value is None:
        return default
    if not (isinstance(value, (tuple, list)) and len(value) == 2):
        raise TypeError(f"{name} must be a (min, max) pair, got {value!r}")
    try:
        lo, hi = float(value[0]), float(value[1])
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a pair of numbers, got {value!r}") from None
    if not (0 < lo <= hi and math.isfinite(hi)):
        raise ValueError(f"{name} must satisfy 0 < min <= max (finite), got {value!r}")
    return lo, hi


@dataclass(frozen=True, init=False)
class Image:
    """How each image of a column (or of `fl.ImageFolder`) becomes a uint8 array in the batch.

    - ``size``: the output, an int (square) or ``(height, width)``; with ``crop="none"`` it may be
      None: every image must then have the first one's size, kept as it is.
    - ``crop="random"``: torchvision's ``RandomResizedCrop(size, scale, ratio)`` (10 tries at a
      random area share in ``scale`` and a log-uniform aspect ratio in ``ratio``, then the
      central crop that fits ``ratio``), resized to ``size``.
      ``crop="center"``: the evaluation transform, ``Resize(resize)`` (the shorter side) then
      ``CenterCrop(size)``; ``resize`` defaults to ``round(max(size) / 0.875)`` (256 for 224).
      ``crop="none"``: the whole image resized to ``size`` (or, without a size, kept as it is).
    - ``flip``: the probability of a horizontal flip.
    - ``layout``: ``"HWC"`` gives ``(batch, H, W, 3)``, ``"CHW"`` gives ``(batch, 3, H, W)``.
    - ``max_pixels``: images larger than this (width x height, read from the header) are refused
      before any pixel memory is allocated (None: no limit). Default: PIL's 89,478,485.
    - ``fallback``: ``"pil"`` decodes formats without a native decoder (WebP, BMP, TIFF, GIF, ...)
      with PIL on the collation threads; None refuses them, naming the file and the format.

    Crops and flips come from the sample's stream (seed, epoch, sample id) as ``fl.sample_rng``
    derives it: the same for any number of threads or ranks, and after a resume.
    """

    size: tuple[int, int] | None
    crop: str
    scale: tuple[float, float] | None
    ratio: tuple[float, float] | None
    resize: int | None
    flip: float
    layout: str
    max_pixels: int | None
    fallback: str | None

    def __init__(self, size: Any = None, crop: str = "random", scale: Any = None, ratio: Any = None,
                 resize: Any = None, flip: float = 0.0, layout: str = "HWC", max_pixels: Any = DEFAULT_MAX_PIXELS,
                 fallback: str | None = "pil"):
        if crop not in _CROPS:
            raise ValueError(f"crop must be one of {_CROPS}, got {crop!r}")
        if size is None and crop != "none":
            raise ValueError(f"size is needed for crop={crop!r} (an int or (height, width)); only crop='none' "
                             "keeps each image at its own size")
        pair = None if size is None else _size(size)
        if crop != "random" and (scale is not None or ratio is not None):
            raise ValueError(f"scale and ratio apply to crop='random', not crop={crop!r}")
        if crop == "random":
            scale = _range("scale", scale, (0.08, 1.0))
            ratio = _range("ratio", ratio, (3.0 / 4.0, 4.0 / 3.0))
        if resize is not None and crop != "center":
            raise ValueError(f"resize applies to crop='center' (the shorter side before the crop), not crop={crop!r}")
        if crop == "center":
            resize = round(max(pair) / 0.875) if resize is None else as_int("resize", resize)  # type: ignore[arg-type]
            if not 0 < resize <= _MAX_SIDE:
                raise ValueError(f"resize must be positive and at most {_MAX_SIDE}, got {resize}")
        if isinstance(flip, bool) or not isinstance(flip, numbers.Real) or not 0.0 <= float(flip) <= 1.0:
            raise ValueError(f"flip must be a probability in [0, 1], got {flip!r}")
        if layout not in _LAYOUTS:
            raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
        if max_pixels is not None:
            max_pixels = as_int("max_pixels", max_pixels)
            if max_pixels <= 0:
                raise ValueError(f"max_pixels must be positive (or None for no limit), got {max_pixels}")
        if fallback not in _FALLBACKS:
            raise ValueError(f"fallback must be 'pil' or None, got {fallback!r}")
        for k, v in (("size", pair), ("crop", crop), ("scale", scale), ("ratio", ratio), ("resize", resize),
                     ("flip", float(flip)), ("layout", layout), ("max_pixels", max_pixels), ("fallback", fallback)):
            object.__setattr__(self, k, v)

    def shape(self, own: tuple[int, int] | None = None) -> tuple[int, int, int]:
        """One sample's shape in the batch; `own` is the images' (height, width) when size is None."""
        h, w = self.size or own or (0, 0)
        return (h, w, 3) if self.layout == "HWC" else (3, h, w)

    def native(self, own: tuple[int, int] | None = None) -> tuple:
        """The spec as fastload._C reads it (csrc/bindings/image.cpp: spec_from)."""
        if self.size is None and own is None:
            raise ValueError("crop='none' without a size needs the images' size (the first image's)")
        h, w = self.size or own  # type: ignore[misc]
        scale = self.scale or (1.0, 1.0)
        ratio = self.ratio or (1.0, 1.0)
        return (h, w, self.crop, scale[0], scale[1], ratio[0], ratio[1], self.resize or 0, self.flip, self.layout,
                INT64_MAX if self.max_pixels is None else self.max_pixels, self.size is None)


def image_backends() -> dict[str, str | None]:
    """What decodes each format in this installation: {"jpeg": ..., "png": ..., "other": ...},
    e.g. "libjpeg-turbo 2.1.5", or "PIL 11.0.0 (fallback)" where this build has no native decoder
    (built without libjpeg / libpng headers; see docs/install.md), or None where nothing can."""
    native = _C.image_backends()
    pil = _pil_version()
    fallback = f"PIL {pil} (fallback)" if pil else None
    return {"jpeg": native["jpeg"] or fallback, "png": native["png"] or fallback, "other": fallback}


def _pil_version() -> str | None:
    try:
        import PIL  # noqa: PLC0415 - optional: only the fallback needs it
    except ImportError:
        return None
    return str(PIL.__version__)
