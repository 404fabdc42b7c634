"""References for the image tests: test pictures (photograph-like, and pictures whose colours are
their own coordinates), encoders, and the rules fastload promises to follow, written out in
Python from their sources: torchvision's RandomResizedCrop.get_params, Resize + CenterCrop, and
ImageFolder's find_classes / make_dataset (torchvision/transforms/transforms.py and
torchvision/datasets/folder.py, 0.29.1), with each uniform draw taken from the sample's numpy
Generator as fastload documents it."""
from __future__ import annotations

import io
import math
import os

import numpy as np
from PIL import Image as PILImage

# -------------------------------------------------------------------------------- pictures


def photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """A photograph-like RGB picture: smooth gradients, edges of overlapping discs, fine noise
    (every 8x8 block has detail, as in a photo; no flat areas JPEG would code for free)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.zeros((height, width, 3), np.float32)
    for c in range(3):
        for _ in range(6):
            fx, fy = rng.uniform(0.5, 12, 2) / np.array([width, height])
            img[..., c] += rng.uniform(10, 40) * np.sin(2 * np.pi * (fx * x + fy * y) + rng.uniform(0, 2 * np.pi))
    for _ in range(20):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(2, max(3, min(height, width) / 4))
        img[(x - cx) ** 2 + (y - cy) ** 2 < r * r] += rng.uniform(-60, 60, 3)
    img += 128 + rng.normal(0, 6, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def coordinates(height: int, width: int, tag: int = 0) -> np.ndarray:
    """A picture whose red channel is its column and green its row (both < 256), and whose blue
    channel is `tag`: a resized crop of it tells where the crop was."""
    assert height <= 256 and width <= 256
    y, x = np.mgrid[0:height, 0:width]
    return np.stack([x, y, np.full_like(x, tag)], axis=-1).astype(np.uint8)


def encode(array: np.ndarray, fmt: str = "PNG", mode: str | None = None, **options) -> bytes:
    out = io.BytesIO()
    PILImage.fromarray(array, mode=mode).save(out, format=fmt, **options)
    return out.getvalue()


def pil_rgb(data: bytes) -> PILImage.Image:
    return PILImage.open(io.BytesIO(data)).convert("RGB")


def write(path: str | os.PathLike, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return os.fspath(path)


# -------------------------------------------------------------------------------- the crop rules


def sample_generator(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The stream fastload draws sample `index`'s crop and flip from (fl.sample_rng's)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch, index, 0x5EED])))


def random_resized_crop(height: int, width: int, scale, ratio, g: np.random.Generator) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params (i, j, h, w), each uniform draw g.random()."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * g.random())
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * g.random())
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = min(int(g.random() * (height - h + 1)), height - h)
            j = min(int(g.random() * (width - w + 1)), width - w)
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w = width
        h = height
    return (height - h) // 2, (width - w) // 2, h, w


def expected_crop(spec, height: int, width: int, seed: int, epoch: int, index: int):
    """((i, j, h, w) or None, flipped) that fastload draws for sample `index` of `epoch`."""
    g = sample_generator(seed, epoch, index)
    box = random_resized_crop(height, width, spec.scale, spec.ratio, g) if spec.crop == "random" else None
    flipped = bool(spec.flip > 0 and g.random() < spec.flip)
    return box, flipped


def torchvision_eval(img: PILImage.Image, size: tuple[int, int], resize: int) -> np.ndarray:
    """torchvision's Resize(resize) then CenterCrop(size) on a PIL image (v2 semantics: the
    longer side int(resize * long / short); a crop larger than the image is zero padded)."""
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = resize, int(resize * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    resized = np.asarray(img.resize((new_w, new_h), PILImage.BILINEAR))
    ch, cw = size
    pad_t, pad_l = max(0, (ch - new_h) // 2), max(0, (cw - new_w) // 2)
    pad_b, pad_r = max(0, (ch - new_h + 1) // 2), max(0, (cw - new_w + 1) // 2)
    padded = np.pad(resized, ((pad_t, pad_b), (pad_l, pad_r), (0, 0)))
    ph, pw = padded.shape[:2]
    top, left = int(round((ph - ch) / 2.0)), int(round((pw - cw) / 2.0))
    return padded[top:top + ch, left:left + cw]


def ramp_mismatch(values: np.ndarray, start: int, length: int) -> float:
    """How often a resized coordinate ramp (value = source pixel index) is not the ramp of the
    source interval [start, start + length) resized to len(values) pixels: output o shows source
    coordinate start + (o + 0.5) * length / n - 0.5, rounded half up as the resize rounds. The
    share of interior pixels (the filter is cut at the edges) that differ. The right interval:
    about 0 (fixed-point weights may tip a value at exactly .5); one pixel off in start: about 1;
    one pixel off in length: about 0.5."""
    n = len(values)
    o = np.arange(n, dtype=np.float64)
    expected = np.floor(start + (o + 0.5) * length / n - 0.5 + 0.5)
    return float((values.astype(np.float64) != expected)[2:n - 2].mean())


# -------------------------------------------------------------------------------- ImageFolder's rules

TORCHVISION_IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def torchvision_folder(root: str, extensions=TORCHVISION_IMG_EXTENSIONS):
    """(classes, class_to_idx, samples) as torchvision's ImageFolder computes them."""
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    class_to_idx = {c: i for i, c in enumerate(classes)}
    samples = []
    for target in sorted(class_to_idx):
        d = os.path.join(root, target)
        if not os.path.isdir(d):
            continue
        for dirpath, _, fnames in sorted(os.walk(d, followlinks=True)):
            for f in sorted(fnames):
                p = os.path.join(dirpath, f)
                if p.lower().endswith(extensions):
                    samples.append((p, class_to_idx[target]))
    return classes, class_to_idx, samples


# -------------------------------------------------------------------------------- PNG, written by hand
# PIL writes few of PNG's layouts (no 2/4-bit gray, no 16-bit RGB, no interlacing): these do.
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _chunk(kind: bytes, data: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _scanlines(samples: np.ndarray, bit_depth: int) -> bytes:
    """Rows of samples (height, width * channels) packed at bit_depth, each after filter byte 0."""
    out = bytearray()
    for row in samples:
        if bit_depth == 16:
            packed = row.astype(">u2").tobytes()
        elif bit_depth == 8:
            packed = row.astype(np.uint8).tobytes()
        else:
            per = 8 // bit_depth
            padded = np.zeros(-(-len(row) // per) * per, np.uint8)
            padded[:len(row)] = row
            groups = padded.reshape(-1, per)
            packed = bytes(int(sum(int(v) << (8 - bit_depth * (k + 1)) for k, v in enumerate(g))) for g in groups)
        out += b"\x00" + packed
    return bytes(out)


def png_bytes(samples: np.ndarray, color_type: int, bit_depth: int, *, palette: np.ndarray | None = None,
              trns: bytes | None = None, interlaced: bool = False) -> bytes:
    """A PNG of `samples` (height, width, channels) as given: color_type 0 gray, 2 RGB, 3 palette,
    4 gray + alpha, 6 RGBA; any legal bit depth; Adam7-interlaced on request."""
    import struct
    import zlib

    h, w = samples.shape[:2]
    flat = samples.reshape(h, w, -1)
    ihdr = struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 1 if interlaced else 0)
    if not interlaced:
        raw = _scanlines(flat.reshape(h, -1), bit_depth)
    else:
        raw = b""
        for x0, y0, dx, dy in _ADAM7:
            sub = flat[y0::dy, x0::dx]
            if sub.size:
                raw += _scanlines(sub.reshape(sub.shape[0], -1), bit_depth)
    body = _chunk(b"IHDR", ihdr)
    if palette is not None:
        body += _chunk(b"PLTE", palette.astype(np.uint8).tobytes())
    if trns is not None:
        body += _chunk(b"tRNS", trns)
    return b"\x89PNG\r\n\x1a\n" + body + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


def needs_native_decoders():
    """Skips a module in a build without libjpeg / libpng (their tests call the native decoders
    directly). CI builds with FASTLOAD_REQUIRE_NATIVE_IMAGES=ON, so there a missing library fails
    the build instead of skipping these."""
    import pytest

    from fastload import _C

    backends = _C.image_backends()
    return pytest.mark.skipif(backends["jpeg"] is None or backends["png"] is None,
                              reason="this build has no native JPEG / PNG decoder (libjpeg / libpng headers missing)")
