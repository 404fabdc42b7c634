"""Where fl.Image crops and when it flips: the sample stream is numpy's own (SeedSequence +
PCG64, as fl.sample_rng derives it), the crop boxes are torchvision's RandomResizedCrop rule
replayed with that stream, the center crop is Resize + CenterCrop, and the boxes recovered from
pictures whose colours are their coordinates agree, through the Loader, for any number of
threads and ranks and after a resume."""
from __future__ import annotations

import os

import numpy as np
import pytest
from image_reference import (coordinates, encode, expected_crop, needs_native_decoders, ramp_mismatch,
                             random_resized_crop, sample_generator, write)

import fastload as fl
from fastload import _C

pytestmark = needs_native_decoders()

SIZES = [(256, 200), (120, 256), (40, 40), (256, 20), (30, 250), (200, 200), (17, 256)]


# ------------------------------------------------------------------------------ the sample stream
@pytest.mark.parametrize("seed, epoch, index", [(0, 0, 0), (7, 3, 12345), (2**32 + 5, 2**33, 2**40 + 1),
                                                (2**64 - 1, 0, 99), (123, 10**12, 0)])
def test_the_sample_stream_is_numpys_pcg64_from_seedsequence(seed, epoch, index):
    raw, uniform = _C._sample_stream(seed, epoch, index, 16)
    g = np.random.PCG64(np.random.SeedSequence([seed, epoch, index, 0x5EED]))
    assert raw == [int(v) for v in g.random_raw(16)]
    assert uniform == list(sample_generator(seed, epoch, index).random(16))


# ------------------------------------------------------------------------------ the crop rules
def _box(spec, height, width, seed=0, epoch=0, index=0):
    data = encode(coordinates(height, width))
    out, info = _C._decode_image(data, spec.native(), seed, epoch, index, None)
    x, y, w, h = info["box"]
    return out, (y, x, h, w), info["flipped"]


def _check_ramp(values, start, length):
    """The ramp is the interval's; an interval starting a pixel off fits worse (one a pixel longer
    or shorter may fit as well where the output has too few pixels to tell)."""
    rate = ramp_mismatch(values, start, length)
    assert rate <= 0.1, (rate, start, length, values)
    for s in (start - 1, start + 1):
        assert rate < ramp_mismatch(values, s, length), ((start, length), s)
    for n in (length - 1, length + 1):
        assert rate <= ramp_mismatch(values, start, n), ((start, length), n)


@pytest.mark.parametrize("height, width", SIZES)
def test_random_crop_boxes_follow_torchvisions_rule_draw_for_draw(height, width):
    spec = fl.Image(32, flip=0.5)
    seen = set()
    for index in range(60):
        _, box, flipped = _box(spec, height, width, seed=3, epoch=1, index=index)
        assert (box, flipped) == expected_crop(spec, height, width, 3, 1, index)
        seen.add(box)
    assert len(seen) > 1 or height / width > 4 / 3 * 2 or width / height > 4 / 3 * 2  # the fallback is fixed


def test_random_crop_honours_scale_and_ratio():
    spec = fl.Image(16, scale=(0.25, 0.5), ratio=(1.0, 2.0))
    for index in range(200):
        _, (i, j, h, w), _ = _box(spec, 200, 240, index=index)
        assert (i, j, h, w) == random_resized_crop(200, 240, (0.25, 0.5), (1.0, 2.0), sample_generator(0, 0, index))
        assert 0 <= i and i + h <= 200 and 0 <= j and j + w <= 240
        # rounding moves the area and aspect by at most a pixel's worth
        assert 0.25 * 200 * 240 * 0.97 <= h * w <= 0.5 * 200 * 240 * 1.03, (h, w)
        assert 1.0 - 0.03 <= w / h <= 2.0 + 0.05, (h, w)


def test_an_impossible_aspect_falls_back_to_the_central_crop():
    # 256 x 20 cannot hold a 3/4..4/3 crop of 8-100% of its area: 10 tries fail every time.
    for index in range(20):
        _, box, _ = _box(fl.Image(8), 256, 20, index=index)
        assert box == ((256 - 27) // 2, 0, 27, 20)


def test_the_crop_is_recovered_from_the_pixels():
    spec = fl.Image((40, 56), flip=0.5)
    for index in range(40):
        out, (i, j, h, w), flipped = _box(spec, 200, 256, seed=11, index=index)
        row, col = out[20, :, 0], out[:, 28, 1]
        if flipped:
            row = row[::-1]
        _check_ramp(row, j, w)
        _check_ramp(col, i, h)


@pytest.mark.parametrize("height, width, size, resize", [(200, 256, (64, 64), 73), (256, 120, (48, 40), 60),
                                                         (60, 60, (96, 80), 64), (100, 250, (50, 50), 57)])
def test_center_crop_is_resize_then_center_crop(height, width, size, resize):
    # Resize(resize): the shorter side to `resize`; CenterCrop(size), padded with 0 when larger.
    spec = fl.Image(size, crop="center", resize=resize)
    out, _, flipped = _box(spec, height, width)
    assert not flipped
    short, long = min(height, width), max(height, width)
    new_long = int(resize * long / short)
    new_h, new_w = (resize, new_long) if height <= width else (new_long, resize)
    top, left = int(round((new_h - size[0]) / 2.0)), int(round((new_w - size[1]) / 2.0))
    pad_t, pad_l = max(0, (size[0] - new_h) // 2), max(0, (size[1] - new_w) // 2)
    # Output pixel (r, c) is resized pixel (r + top, c + left) (or padding): its coordinate ramp.
    for r in range(size[0]):
        src_r = r + top if size[0] <= new_h else r - pad_t
        if not 0 <= src_r < new_h:
            assert (out[r] == 0).all()
            continue
        for c in (size[1] // 2,):
            src_c = c + left if size[1] <= new_w else c - pad_l
            if 0 <= src_c < new_w and 2 < src_r < new_h - 3:
                expected_y = (src_r + 0.5) * height / new_h - 0.5
                assert abs(out[r, c, 1] - expected_y) <= 1.0, (r, out[r, c, 1], expected_y)


def test_default_resize_is_size_over_0875():
    assert fl.Image(224, crop="center").resize == 256
    assert fl.Image((224, 160), crop="center").resize == 256


def test_flip_probability_and_mirror():
    data = encode(coordinates(64, 64))
    plain, _ = _C._decode_image(data, fl.Image(crop="none").native((64, 64)), 0, 0, 0, None)
    flipped, info = _C._decode_image(data, fl.Image(crop="none", flip=1.0).native((64, 64)), 0, 0, 0, None)
    assert info["flipped"] and (flipped == plain[:, ::-1]).all()
    draws = [_C._decode_image(data, fl.Image(8, flip=0.3).native(), 0, 0, i, None)[1]["flipped"] for i in range(400)]
    assert 0.2 < np.mean(draws) < 0.4
    assert not any(_C._decode_image(data, fl.Image(8).native(), 0, 0, i, None)[1]["flipped"] for i in range(50))


def test_chw_is_hwc_transposed():
    data = encode(coordinates(100, 120))
    hwc, _ = _C._decode_image(data, fl.Image((30, 40), flip=0.5).native(), 5, 2, 9, None)
    chw, _ = _C._decode_image(data, fl.Image((30, 40), flip=0.5, layout="CHW").native(), 5, 2, 9, None)
    assert chw.shape == (3, 30, 40) and (chw == hwc.transpose(2, 0, 1)).all()


# ------------------------------------------------------------------------------ through the Loader
@pytest.fixture(scope="module")
def coordinate_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("coords")
    for k in range(28):
        h, w = SIZES[k % len(SIZES)]
        write(root / f"c{k % 3}" / f"img{k:02d}.png", encode(coordinates(h, w, tag=k)))
    return str(root)


def _crops(loader, ds, epochs=(0,)):
    """{(epoch, sample id): the output image} over the loader's epochs."""
    seen = {}
    for epoch in epochs:
        loader.set_epoch(epoch)
        for b in loader:
            for img, idx, label in zip(b["image"].numpy(), b["index"].numpy(), b["label"].numpy()):
                assert label == ds.targets[idx]
                seen[(epoch, int(idx))] = img
    return seen


def test_loader_crops_follow_the_rule_for_every_sample(coordinate_folder):
    spec = fl.Image(48, flip=0.5)
    ds = fl.ImageFolder(coordinate_folder, image=spec)
    loader = fl.Loader(ds, batch_size=6, shuffle=True, seed=21, device="cpu", with_index=True, num_threads=2)
    crops = _crops(loader, ds, epochs=(0, 1))
    assert len(crops) == 2 * len(ds)
    for (epoch, idx), img in crops.items():
        tag = int(os.path.basename(ds.samples[idx][0])[3:5])
        h, w = SIZES[tag % len(SIZES)]
        assert (img[..., 2] == tag).all()
        (i, j, ch, cw), flipped = expected_crop(spec, h, w, 21, epoch, idx)
        row, col = img[24, :, 0], img[:, 24, 1]
        if flipped:
            row = row[::-1]
        _check_ramp(row, j, cw)
        _check_ramp(col, i, ch)


def _batches(loader):
    return [{k: v.clone() for k, v in b.items()} for b in loader]


@pytest.mark.parametrize("threads", [1, 3])
def test_same_batches_for_any_thread_count(coordinate_folder, threads):
    ds = fl.ImageFolder(coordinate_folder, image=fl.Image(24, flip=0.5))
    one = _batches(fl.Loader(ds, batch_size=5, shuffle=True, seed=4, device="cpu", num_threads=1, prefetch=1))
    many = _batches(fl.Loader(ds, batch_size=5, shuffle=True, seed=4, device="cpu", num_threads=threads, prefetch=6))
    assert len(one) == len(many)
    for a, b in zip(one, many):
        assert (a["image"] == b["image"]).all() and (a["label"] == b["label"]).all()


def test_ranks_see_the_single_rank_crops(coordinate_folder):
    ds = fl.ImageFolder(coordinate_folder, image=fl.Image(24, flip=0.5))
    single = {}
    for b in fl.Loader(ds, batch_size=4, shuffle=True, seed=9, device="cpu", with_index=True):
        single.update({int(i): img.clone() for i, img in zip(b["index"], b["image"])})
    for rank in range(2):
        loader = fl.Loader(ds, batch_size=2, shuffle=True, seed=9, device="cpu", with_index=True, rank=rank,
                           world_size=2, even="drop")
        for b in loader:
            for i, img in zip(b["index"], b["image"]):
                assert (single[int(i)] == img).all()


def test_resume_mid_epoch_gives_the_same_crops(coordinate_folder):
    ds = fl.ImageFolder(coordinate_folder, image=fl.Image(24, flip=0.5))
    make = lambda: fl.Loader(ds, batch_size=4, shuffle=True, seed=2, device="cpu", num_threads=2)  # noqa: E731
    loader = make()
    loader.set_epoch(1)
    full = _batches(loader)
    loader = make()
    loader.set_epoch(1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    rest = _batches(resumed)
    assert len(rest) == len(full) - 3
    for a, b in zip(full[3:], rest):
        assert (a["image"] == b["image"]).all() and (a["label"] == b["label"]).all()


def test_epochs_draw_new_crops(coordinate_folder):
    ds = fl.ImageFolder(coordinate_folder, image=fl.Image(24))
    loader = fl.Loader(ds, batch_size=28, shuffle=False, device="cpu")
    loader.set_epoch(0)
    a = next(iter(loader))["image"].clone()
    loader.set_epoch(1)
    b = next(iter(loader))["image"].clone()
    assert (a != b).any()
