"""Image columns of Arrow, Parquet and Hugging Face data (decode={"col": fl.Image(...)}): each
row's encoded bytes (or the file its path names) decoded natively per sample into the batch,
with the crops of fl.ImageFolder for the same files and sample ids; the reference is the
decode stage run on one image with the sample's key (_C._decode_image), itself checked against
PIL and torchvision's crop rule in test_images_formats.py and test_images_crop.py."""
from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from image_reference import encode, needs_native_decoders, photo, write

import fastload as fl
from fastload import _C

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

pytestmark = needs_native_decoders()

N = 23
SPEC = fl.Image(32, flip=0.5)


def _images() -> list[bytes]:
    """JPEGs and PNGs of several sizes (a file's format is told by its bytes)."""
    out = []
    for k in range(N):
        pixels = photo(40 + 7 * (k % 5), 60 - 3 * (k % 4), seed=k)
        out.append(encode(pixels, "JPEG", quality=90) if k % 3 else encode(pixels, "PNG"))
    return out


IMAGES = _images()


def reference(data: bytes, spec: fl.Image, seed: int, epoch: int, sample: int) -> np.ndarray:
    return _C._decode_image(data, spec.native(), seed, epoch, sample, None)[0]


def _by_index(loader, epoch: int = 0, name: str = "image") -> dict[int, torch.Tensor]:
    loader.set_epoch(epoch)
    out = {}
    for b in loader:
        out.update({int(i): img.clone() for i, img in zip(b["index"], b[name])})
    return out


def _check(loader, images: list[bytes], spec: fl.Image, seed: int, epochs=(0, 1), name="image") -> None:
    for epoch in epochs:
        got = _by_index(loader, epoch, name)
        assert sorted(got) == list(range(len(images)))
        for i, img in got.items():
            assert np.array_equal(img.numpy(), reference(images[i], spec, seed, epoch, i)), (epoch, i)


@pytest.fixture(scope="module")
def table():
    return pa.table({"jpg": pa.array(IMAGES, pa.binary()), "label": pa.array(np.arange(N) % 4, pa.int64())})


def test_a_binary_column_is_decoded_per_sample(table):
    source = fl.Arrow(table, decode={"jpg": SPEC})
    assert source.names == ["jpg", "label"]
    loader = fl.Loader(source, batch_size=5, shuffle=True, seed=7, device="cpu", with_index=True, num_threads=2)
    b = next(iter(loader))
    assert b["jpg"].dtype == torch.uint8 and b["jpg"].shape == (5, 32, 32, 3)
    assert b["label"].tolist() == [i % 4 for i in b["index"].tolist()]
    _check(loader, IMAGES, SPEC, 7, name="jpg")
    assert source.schema["jpg"].dtype == torch.uint8 and source.schema["jpg"].shape == (32, 32, 3)


def test_large_binary_and_binary_view_and_chw(table):
    spec = fl.Image((24, 20), crop="center", layout="CHW")
    for kind in (pa.large_binary(), pa.binary_view()):
        t = pa.table({"jpg": pa.array(IMAGES, kind)})
        loader = fl.Loader(fl.Arrow(t, decode={"jpg": spec}), batch_size=4, device="cpu", with_index=True)
        _check(loader, IMAGES, spec, 0, epochs=(0,), name="jpg")


def test_the_same_crops_as_an_image_folder_of_the_same_files(tmp_path, table):
    # ImageFolder lists class folders, then sorted names: one class keeps the table's order.
    for k, data in enumerate(IMAGES):
        write(tmp_path / "c" / f"{k:03d}.img.png", data)
    folder = fl.ImageFolder(tmp_path, image=SPEC, extensions=(".png",))
    kw = dict(batch_size=4, shuffle=True, seed=3, device="cpu", with_index=True)
    a = _by_index(fl.Loader(folder, **kw), epoch=2)
    b = _by_index(fl.Loader(fl.Arrow(table, decode={"jpg": SPEC}), **kw), epoch=2, name="jpg")
    assert a.keys() == b.keys() and all(torch.equal(a[i], b[i]) for i in a)


def test_threads_ranks_and_resume_leave_the_crops_alone(table):
    source = fl.Arrow(table, decode={"jpg": SPEC})
    single = _by_index(fl.Loader(source, batch_size=4, shuffle=True, seed=5, device="cpu", with_index=True,
                                 num_threads=1), name="jpg")
    many = _by_index(fl.Loader(source, batch_size=4, shuffle=True, seed=5, device="cpu", with_index=True,
                               num_threads=3, prefetch=6), name="jpg")
    assert all(torch.equal(single[i], many[i]) for i in single)
    for rank in range(2):
        loader = fl.Loader(source, batch_size=2, shuffle=True, seed=5, device="cpu", with_index=True, rank=rank,
                           world_size=2, even="drop")
        for b in loader:
            assert all(torch.equal(single[int(i)], img) for i, img in zip(b["index"], b["jpg"]))
    make = lambda: fl.Loader(source, batch_size=4, shuffle=True, seed=5, device="cpu", num_threads=2)  # noqa: E731
    loader = make()
    full = [b["jpg"].clone() for b in loader]
    it = iter(make_resumable := make())
    for _ in range(2):
        next(it)
    state = make_resumable.state_dict()
    del it
    resumed = make()
    resumed.load_state_dict(state)
    rest = [b["jpg"] for b in resumed]
    assert len(rest) == len(full) - 2 and all(torch.equal(x, y) for x, y in zip(full[2:], rest))


def test_parquet_binary_column(tmp_path, table):
    path = tmp_path / "images.parquet"
    pq.write_table(table, path, row_group_size=6)
    source = fl.Parquet(path, decode={"jpg": SPEC})
    loader = fl.Loader(source, batch_size=5, shuffle=True, seed=11, device="cpu", with_index=True, num_threads=2)
    _check(loader, IMAGES, SPEC, 11, name="jpg")
    copy = pickle.loads(pickle.dumps(source))
    again = _by_index(fl.Loader(copy, batch_size=5, shuffle=True, seed=11, device="cpu", with_index=True), name="jpg")
    assert all(np.array_equal(img.numpy(), reference(IMAGES[i], SPEC, 11, 0, i)) for i, img in again.items())


def test_a_struct_of_bytes_and_path_reads_the_file_where_bytes_is_null(tmp_path):
    paths = [write(tmp_path / f"{k}.bin", data) for k, data in enumerate(IMAGES)]
    image = pa.array([{"bytes": None if k % 2 else IMAGES[k], "path": paths[k] if k % 2 else None} for k in range(N)],
                     pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    t = pa.table({"image": image})
    loader = fl.Loader(fl.Arrow(t, decode={"image": SPEC}), batch_size=6, shuffle=True, seed=2, device="cpu",
                       with_index=True)
    _check(loader, IMAGES, SPEC, 2)
    pq.write_table(t, tmp_path / "s.parquet", row_group_size=5)
    loader = fl.Loader(fl.Parquet(tmp_path / "s.parquet", decode={"image": SPEC}), batch_size=6, shuffle=True,
                       seed=2, device="cpu", with_index=True)
    _check(loader, IMAGES, SPEC, 2, epochs=(1,))


def test_bad_rows_name_the_column_row_and_sample(tmp_path):
    rows = list(IMAGES[:6])
    rows[4] = IMAGES[1][: len(IMAGES[1]) // 3]  # a truncated JPEG
    loader = fl.Loader(fl.Arrow(pa.table({"jpg": pa.array(rows, pa.binary())}), decode={"jpg": SPEC}),
                       batch_size=3, device="cpu")
    it = iter(loader)
    next(it)
    with pytest.raises(fl.ImageError, match=r"image column 'jpg' row 4 \(sample 4\)"):
        next(it)
    missing = pa.array([{"bytes": None, "path": str(tmp_path / "gone.jpg")}],
                       pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    with pytest.raises(fl.ImageError, match=r"row 0 \(sample 0\), file '.*gone.jpg': cannot open"):
        next(iter(fl.Loader(fl.Arrow(pa.table({"image": missing}), decode={"image": SPEC}), batch_size=1,
                            device="cpu")))
    nothing = pa.array([{"bytes": IMAGES[0], "path": None}, {"bytes": None, "path": None}],
                       pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    with pytest.raises(ValueError, match="row 1 .*holds no image"):
        next(iter(fl.Loader(fl.Arrow(pa.table({"image": nothing}), decode={"image": SPEC}), batch_size=2,
                            device="cpu")))


def test_arguments_are_checked(table):
    t = pa.table({"jpg": pa.array(IMAGES, pa.binary()), "name": pa.array([str(k) for k in range(N)]),
                  "label": pa.array(np.arange(N))})
    with pytest.raises(TypeError, match="decode must be a dict"):
        fl.Arrow(t, decode=SPEC)
    with pytest.raises(TypeError, match=r"decode\['jpg'\] must be an fl.Image"):
        fl.Arrow(t, decode={"jpg": 224})
    with pytest.raises(ValueError, match="does not have"):
        fl.Arrow(t, decode={"png": SPEC})
    with pytest.raises(ValueError, match="'name' is string; decode= takes a binary column"):
        fl.Arrow(t, decode={"name": SPEC})
    with pytest.raises(ValueError, match="'label' is int64"):
        fl.Arrow(t, decode={"label": SPEC})
    with pytest.raises(ValueError, match="needs fl.Image\\(size=...\\)"):
        fl.Arrow(t, decode={"jpg": fl.Image(crop="none")})
    with pytest.raises(ValueError, match="columns= leaves out"):
        fl.Arrow(t, columns=["label"], decode={"jpg": SPEC})
    with pytest.raises(ValueError, match=r"max_length\['jpg'\]: 'jpg' is an image column"):
        fl.Arrow(t, max_length={"jpg": 4}, decode={"jpg": SPEC})
    assert fl.Arrow(t, columns=["jpg"], decode={"jpg": SPEC}).names == ["jpg"]


# ------------------------------------------------------------------- Hugging Face Image features
@pytest.fixture(scope="module")
def hf_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return [write(root / f"{k:03d}.{'png' if k % 3 == 0 else 'jpg'}", data) for k, data in enumerate(IMAGES)]


def _hf(paths, embed: bool):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict({"image": list(paths), "label": list(range(N))}, features=features)
    # From paths datasets stores {bytes: None, path}; embed_table_storage puts the bytes in (as push_to_hub does).
    return _embedded(ds, datasets) if embed else ds


def _embedded(ds, datasets):
    from datasets.table import embed_table_storage  # noqa: PLC0415 - what push_to_hub / save_to_disk use

    return datasets.Dataset(embed_table_storage(ds.data.table), info=ds.info)


@pytest.mark.parametrize("embed", [False, True], ids=["paths", "bytes"])
def test_a_hugging_face_image_feature(hf_files, embed):
    ds = _hf(hf_files, embed)
    stored = ds.data.table.column("image").to_pylist()
    assert all((r["bytes"] is None) != embed for r in stored)
    with pytest.raises(ValueError, match=r"Hugging Face Image feature.*decode=\{'image': fl.Image"):
        fl.Arrow(ds)
    with pytest.raises(ValueError, match="decode="):
        fl.Loader(ds, batch_size=2, device="cpu")
    loader = fl.Loader(fl.Arrow(ds, decode={"image": SPEC}), batch_size=5, shuffle=True, seed=8, device="cpu",
                       with_index=True)
    assert set(next(iter(loader))) == {"image", "label", "index"}
    _check(loader, IMAGES, SPEC, 8)
    # The images are PIL's: datasets' own decode, cropped and resized by PIL, is close (test_images_formats
    # bounds the difference); with crop="none" at the image's size they are equal.
    spec = fl.Image((40, 60), crop="none")
    b = next(iter(fl.Loader(fl.Arrow(ds, decode={"image": spec}), batch_size=1, device="cpu")))
    pil = np.asarray(ds[0]["image"].convert("RGB"))
    assert pil.shape == (40, 60, 3) and np.abs(b["image"][0].numpy().astype(int) - pil).max() <= 1


def test_a_hugging_face_dataset_after_shuffle_keys_crops_by_sample(hf_files):
    ds = _hf(hf_files, embed=True).shuffle(seed=0)
    order = ds._indices.column(0).to_pylist()
    loader = fl.Loader(fl.Arrow(ds, decode={"image": SPEC}), batch_size=4, shuffle=True, seed=1, device="cpu",
                       with_index=True)
    got = _by_index(loader, epoch=1)
    for i, img in got.items():  # sample i is the table's row order[i]; its crop is keyed by i
        assert np.array_equal(img.numpy(), reference(IMAGES[order[i]], SPEC, 1, 1, i))
    b = next(iter(fl.Loader(fl.Arrow(ds, decode={"image": SPEC}), batch_size=N, device="cpu", with_index=True)))
    assert b["label"].tolist() == order


def test_hugging_face_parquet_with_an_image_feature(hf_files, tmp_path):
    ds = _hf(hf_files, embed=True)
    path = tmp_path / "hf.parquet"
    ds.to_parquet(path)
    with pytest.raises(ValueError, match="decode="):
        fl.Parquet(path)
    loader = fl.Loader(fl.Parquet(path, decode={"image": SPEC}), batch_size=5, seed=4, shuffle=True, device="cpu",
                       with_index=True)
    _check(loader, IMAGES, SPEC, 4, epochs=(0,))
