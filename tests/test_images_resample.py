"""The resize's vector forms give the bytes of its scalar form: every crop kind, downscales from
none to 40x (the widest filters, whose pairs of output pixels differ most in length), upscales,
flips and both layouts, decoded with the AVX2 form (where the CPU has it), the SSE2 form and the
scalar one (_C._set_resample_simd), compared byte for byte."""
from __future__ import annotations

import numpy as np
import pytest
from image_reference import encode, needs_native_decoders, photo

import fastload as fl
from fastload import _C

pytestmark = needs_native_decoders()

FORMS = ("scalar", "sse2", "avx2")


@pytest.fixture
def simd():
    before, _ = _C._set_resample_simd("avx2")

    def use(form: str) -> str:
        return _C._set_resample_simd(form)[1]

    yield use
    _C._set_resample_simd(before)


CASES = [
    ((375, 500), fl.Image(224, flip=0.5), "JPEG"),
    ((375, 500), fl.Image(224, crop="center", layout="CHW"), "JPEG"),
    ((1200, 1600), fl.Image(224, flip=0.5), "JPEG"),            # DCT-scaled crops
    ((1200, 1600), fl.Image((61, 37), crop="none"), "PNG"),     # 20-40x down, odd widths
    ((900, 700), fl.Image(17, scale=(0.9, 1.0)), "PNG"),         # ~45x down
    ((40, 30), fl.Image(223, flip=1.0), "JPEG"),                 # upscales
    ((333, 257), fl.Image((129, 131), crop="center", resize=200), "PNG"),
]


@pytest.mark.parametrize("shape, spec, fmt", CASES)
def test_every_form_gives_the_same_bytes(simd, shape, spec, fmt):
    data = encode(photo(*shape, seed=shape[0]), fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    used = [simd(f) for f in FORMS]
    assert used[0] == "scalar" and used[1] == "sse2"
    for index in range(6):
        out = {}
        for form in FORMS:
            simd(form)
            out[form], _ = _C._decode_image(data, spec.native(), 3, 0, index, None)
        assert np.array_equal(out["scalar"], out["sse2"]), index
        assert np.array_equal(out["scalar"], out["avx2"]), index


def test_the_cap_is_checked():
    with pytest.raises(ValueError, match="simd must be 'scalar', 'sse2' or 'avx2', got 'neon'"):
        _C._set_resample_simd("neon")
