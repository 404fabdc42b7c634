"""The crops of an image source inside fl.Mix (and with steps=): keyed by (seed, the sample's
epoch of its own source, its id in its own source), so a sample's crop is the one it gets when
its source is read alone, whatever the other sources, the weights, the thread count or the
rank; checked against the decode stage run on the file alone with that key."""
from __future__ import annotations

import pathlib

import numpy as np
import pytest
from image_reference import encode, needs_native_decoders, photo, write

import fastload as fl
from fastload import _C

pytestmark = needs_native_decoders()

SPEC = fl.Image(20, flip=0.5)


def _folder(root, count, seed):
    for k in range(count):
        write(root / f"c{k % 2}" / f"{k:02d}.png", encode(photo(30 + 3 * k, 40, seed=seed + k)))
    return fl.ImageFolder(root, image=SPEC)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return [_folder(tmp_path_factory.mktemp(f"mix{j}"), count, 10 * j) for j, count in enumerate((12, 5, 7))]


def _reference(folder, local: int, seed: int, epoch: int) -> np.ndarray:
    with open(folder.samples[local][0], "rb") as f:
        return _C._decode_image(f.read(), SPEC.native(), seed, epoch, local, None)[0]


def _check_stream(loader, sources, seed):
    """Every row is its file decoded alone with (seed, its source's epoch, its own id): the n-th
    time a sample is drawn is its source's epoch n (each epoch draws every sample once)."""
    offsets = np.cumsum([0] + [len(s) for s in sources])
    drawn: dict[tuple[int, int], int] = {}
    rows = 0
    for b in loader:
        for mix_id, source, img in zip(b["index"].tolist(), b["source"].tolist(), b["image"]):
            local = mix_id - int(offsets[source])
            epoch = drawn.get((source, local), 0)
            drawn[(source, local)] = epoch + 1
            assert np.array_equal(img.numpy(), _reference(sources[source], local, seed, epoch)), (source, local, epoch)
            rows += 1
    return rows, drawn


@pytest.mark.parametrize("threads", [1, 3])
def test_a_sample_s_crop_does_not_depend_on_the_mixture(folders, threads):
    a, b, c = folders
    for sources, weights in (([a, b], [0.5, 0.5]), ([a, b], [0.8, 0.2]), ([c, b, a], [1, 3, 1])):
        loader = fl.Loader(fl.Mix(sources, weights=weights, with_source=True), batch_size=6, steps=7, seed=5,
                           device="cpu", with_index=True, num_threads=threads, shuffle=True)
        rows, drawn = _check_stream(loader, sources, 5)
        assert rows == 42 and max(drawn.values()) >= 2  # some source was read in more than one epoch


def test_ranks_and_resume_keep_the_crops(folders):
    a, b, _ = folders
    mix = fl.Mix([a, b], weights=[0.5, 0.5])
    make = lambda **kw: fl.Loader(mix, steps=6, seed=2, device="cpu", shuffle=True, **kw)  # noqa: E731
    whole = [x["image"].clone() for x in make(batch_size=6)]
    for rank in range(2):  # each rank's rows are rows of the single-rank global batch, crops and all
        for step, x in enumerate(make(batch_size=3, rank=rank, world_size=2)):
            rows = {r.numpy().tobytes() for r in whole[step]}
            assert all(r.numpy().tobytes() in rows for r in x["image"])
    loader = make(batch_size=6, num_threads=2)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    del it
    resumed = make(batch_size=6, num_threads=2)
    resumed.load_state_dict(state)
    rest = [x["image"] for x in resumed]
    assert len(rest) == 4 and all((r == w).all() for r, w in zip(rest, whole[2:]))


def test_steps_over_one_folder_keys_crops_by_its_epochs(folders):
    a = folders[0]
    loader = fl.Loader(a, batch_size=5, steps=7, seed=9, device="cpu", with_index=True, shuffle=True)
    drawn: dict[int, int] = {}
    for x in loader:
        for i, img in zip(x["index"].tolist(), x["image"]):
            epoch = drawn.get(i, 0)
            drawn[i] = epoch + 1
            assert np.array_equal(img.numpy(), _reference(a, i, 9, epoch))
    # the same crops as a Loader without steps= gives in those epochs
    plain = fl.Loader(a, batch_size=4, seed=9, device="cpu", with_index=True, shuffle=True)
    plain.set_epoch(1)
    for x in plain:
        for i, img in zip(x["index"].tolist(), x["image"]):
            assert np.array_equal(img.numpy(), _reference(a, i, 9, 1))


def test_an_image_column_mixes_with_an_image_folder(folders):
    pa = pytest.importorskip("pyarrow")
    a, b, _ = folders
    table = pa.table({"image": pa.array([pathlib.Path(p).read_bytes() for p, _ in b.samples], pa.binary()),
                      "label": pa.array(b.targets, pa.int64())})
    column = fl.Arrow(table, decode={"image": SPEC})
    loader = fl.Loader(fl.Mix([a, column], weights=[0.5, 0.5], with_source=True), batch_size=6, steps=5, seed=4,
                       device="cpu", with_index=True, shuffle=True)
    rows, _ = _check_stream(loader, [a, b], 4)  # the column's rows decode as the folder b's files do
    assert rows == 30
