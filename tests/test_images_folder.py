"""fl.ImageFolder: torchvision's classes, indices and file order (its rules written out in
tests/image_reference.py, and torchvision itself where it imports), batches of images and int64
labels, and the loader's contracts (steps=, a Mix of folders, stats, pickling)."""
from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch
from image_reference import needs_native_decoders, coordinates, encode, photo, torchvision_folder, write

import fastload as fl

pytestmark = needs_native_decoders()


@pytest.fixture
def messy_tree(tmp_path):
    """Classes in an order sorting must fix, nested folders, a followed symbolic link, upper-case
    extensions, files that are not images, a hidden image, and a class folder holding only a
    nested one."""
    a = encode(coordinates(20, 30, 1))
    for rel in ["zebra/b.png", "zebra/a.PNG", "zebra/sub/c.jpeg", "zebra/sub/deeper/d.JPG", "apple/x.webp",
                "apple/notes.txt", "apple/.hidden.png", "Mango/m.png", "mango/n.bmp", "kiwi/only/k.tif",
                "apple/y.ppm", "apple/z.PGM", "apple/w.tiff", "apple/v.jpg.bak"]:
        write(tmp_path / rel, a)
    os.makedirs(tmp_path / "elsewhere")
    write(tmp_path / "elsewhere" / "linked.png", a)
    os.symlink(tmp_path / "elsewhere", tmp_path / "zebra" / "link")
    (tmp_path / "not_a_class.png").write_bytes(a)
    return tmp_path


def test_classes_indices_and_order_are_torchvisions(messy_tree):
    ds = fl.ImageFolder(messy_tree, image=fl.Image(8))
    classes, class_to_idx, samples = torchvision_folder(str(messy_tree))
    assert ds.classes == classes == ["Mango", "apple", "elsewhere", "kiwi", "mango", "zebra"]
    assert ds.class_to_idx == class_to_idx
    assert ds.samples == samples
    assert ds.targets == [s[1] for s in samples]
    names = [os.path.relpath(p, messy_tree) for p, _ in ds.samples]
    assert "zebra/link/linked.png" in names and "apple/.hidden.png" in names
    assert "apple/notes.txt" not in names and "apple/v.jpg.bak" not in names


def test_the_same_as_torchvision_itself(messy_tree):
    folder = pytest.importorskip("torchvision.datasets", exc_type=ImportError)
    tv = folder.ImageFolder(str(messy_tree))
    ds = fl.ImageFolder(messy_tree, image=fl.Image(8))
    assert (ds.classes, ds.class_to_idx, ds.samples, ds.targets) == (tv.classes, tv.class_to_idx, tv.samples,
                                                                     tv.targets)


def test_extensions_and_is_valid_file(messy_tree):
    only_png = fl.ImageFolder(messy_tree, image=fl.Image(8), extensions=(".png",), allow_empty=True)
    assert all(p.lower().endswith(".png") for p, _ in only_png.samples)
    chosen = fl.ImageFolder(messy_tree, image=fl.Image(8), is_valid_file=lambda p: p.endswith("b.png"),
                            allow_empty=True)
    assert [os.path.basename(p) for p, _ in chosen.samples] == ["b.png"]
    with pytest.raises(ValueError, match="exactly one of extensions and is_valid_file"):
        fl.ImageFolder(messy_tree, image=fl.Image(8), extensions=(".png",), is_valid_file=lambda p: True)


def test_empty_and_missing_folders_raise_as_torchvision(tmp_path):
    with pytest.raises(FileNotFoundError, match="Couldn't find any class folder"):
        fl.ImageFolder(tmp_path, image=fl.Image(8))
    write(tmp_path / "a" / "x.png", encode(coordinates(8, 8)))
    os.makedirs(tmp_path / "b")
    with pytest.raises(FileNotFoundError, match="Found no valid file for the classes b. Supported extensions"):
        fl.ImageFolder(tmp_path, image=fl.Image(8))
    assert len(fl.ImageFolder(tmp_path, image=fl.Image(8), allow_empty=True)) == 1
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        fl.ImageFolder(tmp_path / "nope", image=fl.Image(8))
    with pytest.raises(ValueError, match="are for a root in object storage"):  # tests/test_images_folder_remote.py
        fl.ImageFolder(tmp_path, image=fl.Image(8), storage_options={})
    with pytest.raises(TypeError, match="image must be an fl.Image"):
        fl.ImageFolder(tmp_path, image=224)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("folder")
    for k in range(30):
        write(root / f"class{k % 4}" / f"{k:03d}.jpg", encode(photo(48 + k, 64, seed=k), "JPEG", quality=90))
    return root


def test_batches_hold_images_and_their_labels(folder):
    ds = fl.ImageFolder(folder, image=fl.Image(32, flip=0.5))
    loader = fl.Loader(ds, batch_size=8, shuffle=True, seed=1, device="cpu", with_index=True)
    seen = []
    for b in loader:
        assert set(b) == {"image", "label", "index"}
        assert b["image"].dtype == torch.uint8 and b["image"].shape[1:] == (32, 32, 3)
        assert b["label"].dtype == torch.int64
        assert b["label"].tolist() == [ds.targets[i] for i in b["index"].tolist()]
        seen += b["index"].tolist()
    assert sorted(seen) == list(range(len(ds)))
    assert len(loader) == 4 and ds.names == ["image", "label"] and len(ds) == 30


def test_chw_batches(folder):
    ds = fl.ImageFolder(folder, image=fl.Image((24, 32), layout="CHW"))
    b = next(iter(fl.Loader(ds, batch_size=4, device="cpu")))
    assert b["image"].shape == (4, 3, 24, 32)


def test_steps_and_a_mix_of_folders(folder, tmp_path):
    other = tmp_path / "other"
    for k in range(6):
        write(other / f"c{k % 2}" / f"{k}.png", encode(photo(40, 40, seed=100 + k)))
    a, b = fl.ImageFolder(folder, image=fl.Image(16)), fl.ImageFolder(other, image=fl.Image(16))
    loader = fl.Loader(fl.Mix([a, b], weights=[0.5, 0.5]), batch_size=6, steps=5, seed=3, device="cpu")
    batches = [x["image"].clone() for x in loader]
    assert len(batches) == 5 and all(x.shape == (6, 16, 16, 3) for x in batches)
    again = [x["image"] for x in fl.Loader(fl.Mix([a, b], weights=[0.5, 0.5]), batch_size=6, steps=5, seed=3,
                                           device="cpu", num_threads=3)]
    assert all((x == y).all() for x, y in zip(batches, again))
    stepped = fl.Loader(a, batch_size=7, steps=9, device="cpu")
    assert sum(1 for _ in stepped) == 9


def test_decode_time_is_collation_time(folder):
    loader = fl.Loader(fl.ImageFolder(folder, image=fl.Image(32)), batch_size=10, device="cpu")
    for _ in loader:
        pass
    stats = loader.stats()
    assert stats.collation.count == 3 and stats.collation.busy_s > 0 and stats.user_s == 0


def test_image_and_folder_pickle(folder):
    spec = fl.Image((20, 30), crop="random", scale=(0.5, 1.0), flip=0.25, layout="CHW", max_pixels=10**6)
    assert pickle.loads(pickle.dumps(spec)) == spec and hash(pickle.loads(pickle.dumps(spec))) == hash(spec)
    ds = fl.ImageFolder(folder, image=spec)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.samples == ds.samples and copy.image == spec
    x = next(iter(fl.Loader(ds, batch_size=5, seed=8, device="cpu")))["image"]
    y = next(iter(fl.Loader(copy, batch_size=5, seed=8, device="cpu")))["image"]
    assert (x == y).all()


def test_own_size_needs_every_image_at_one_size(tmp_path):
    write(tmp_path / "a" / "0.png", encode(photo(30, 40, seed=1)))
    write(tmp_path / "a" / "1.png", encode(photo(30, 40, seed=2)))
    ds = fl.ImageFolder(tmp_path, image=fl.Image(crop="none"))
    b = next(iter(fl.Loader(ds, batch_size=2, device="cpu")))
    assert b["image"].shape == (2, 30, 40, 3)
    bad = write(tmp_path / "a" / "2.png", encode(photo(31, 40, seed=3)))
    ds = fl.ImageFolder(tmp_path, image=fl.Image(crop="none"))
    with pytest.raises(fl.ImageError, match=rf"image file '{bad}' \(sample 2\): .*every image at one size: this one "
                                            r"is 40x31.*the first was 40x30"):
        list(fl.Loader(ds, batch_size=3, device="cpu"))


def test_backends_name_the_decoders():
    b = fl.image_backends()
    assert set(b) == {"jpeg", "png", "other"}
    assert b["jpeg"].startswith("libjpeg") and b["png"].startswith("libpng")  # this build has both
    assert b["other"].startswith("PIL ")


def test_arguments_are_checked():
    for kwargs, error, message in [
        (dict(size=0), ValueError, "size must be positive"),
        (dict(size=(224, 224, 3)), TypeError, "size must be an int or a"),
        (dict(size=224.0), TypeError, "size must be an int"),
        (dict(), ValueError, "size is needed for crop='random'"),
        (dict(size=8, crop="middle"), ValueError, "crop must be one of"),
        (dict(size=8, scale=(0.5, 0.1)), ValueError, "scale must satisfy 0 < min <= max"),
        (dict(size=8, ratio=(0, 1)), ValueError, "ratio must satisfy"),
        (dict(size=8, crop="center", scale=(0.5, 1)), ValueError, "scale and ratio apply to crop='random'"),
        (dict(size=8, resize=10), ValueError, "resize applies to crop='center'"),
        (dict(size=8, crop="center", resize=-1), ValueError, "resize must be positive"),
        (dict(size=8, flip=1.5), ValueError, "flip must be a probability"),
        (dict(size=8, flip=True), ValueError, "flip must be a probability"),
        (dict(size=8, layout="NCHW"), ValueError, "layout must be one of"),
        (dict(size=8, max_pixels=0), ValueError, "max_pixels must be positive"),
        (dict(size=8, fallback="cv2"), ValueError, "fallback must be 'pil' or None"),
    ]:
        with pytest.raises(error, match=message):
            fl.Image(**kwargs)
    assert fl.Image(8, max_pixels=None).max_pixels is None
    assert fl.Image(crop="none").size is None
    np.testing.assert_equal(fl.Image((10, 20)).shape(), (10, 20, 3))
