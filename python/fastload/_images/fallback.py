"""The fallback decoder of the decode stage: PIL, for the formats this build does not decode
natively (WebP, BMP, TIFF, GIF, ...; JPEG and PNG too in a build without libjpeg / libpng). The
collation threads call it with the GIL held; PIL releases the GIL while its decoders run. It
returns the whole image as RGB (PIL's convert("RGB"): alpha dropped, palette looked up); the crop,
resize and flip stay native. EXIF orientation is ignored, as it is natively and by torchvision."""
from __future__ import annotations

import io
from typing import Any

import numpy as np

__all__ = ["PilDecoder", "fallback_for"]


class PilDecoder:
    """header(data) -> (width, height, format name); decode(data) -> uint8 (height, width, 3)."""

    def __init__(self) -> None:
        from PIL import Image  # noqa: PLC0415 - optional dependency, loaded when a spec wants it

        self._image = Image

    def _open(self, data: Any) -> Any:
        # PIL's own decompression-bomb check runs here too (a warning past Image.MAX_IMAGE_PIXELS,
        # an error past twice that): fl.Image(max_pixels=...) above PIL's limit does not lift it.
        return self._image.open(io.BytesIO(bytes(data)))

    def header(self, data: Any) -> tuple[int, int, str]:
        with self._open(data) as im:
            return im.width, im.height, im.format or "unknown format"

    def decode(self, data: Any) -> np.ndarray:
        with self._open(data) as im:
            return np.asarray(im.convert("RGB"))

    def __reduce__(self) -> Any:
        return (PilDecoder, ())


def fallback_for(spec: Any) -> PilDecoder | None:
    """The fallback decoder a spec asks for, or None (refuse other formats, or PIL not installed)."""
    if spec.fallback != "pil":
        return None
    try:
        return PilDecoder()
    except ImportError:
        return None
