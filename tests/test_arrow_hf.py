"""Hugging Face datasets as the issue's adversarial user met them: a transform is applied (the
Loader reads the dataset through ds[i]) or refused by fl.Arrow, never ignored; a format's columns
are honoured; Array2D..Array5D arrive as (batch, *shape) with each row's shape checked, through
indices mappings and from the Parquet `datasets` writes; an empty dataset says "no rows"; lists
of bools are read. References are the values the datasets were built from (numpy)."""
from __future__ import annotations

import numpy as np
import pytest

import fastload as fl

pa = pytest.importorskip("pyarrow")
datasets = pytest.importorskip("datasets")
from arrow_reference import epoch  # noqa: E402



# ------------------------------------------------------------------------------ transforms

def _times_ten(batch):
    return {"x": [v * 10 for v in batch["x"]], "y": [v + 0.5 for v in batch["y"]]}


@pytest.mark.parametrize("how", ["with_transform", "set_transform"])
def test_a_transform_is_applied_by_the_loader_and_refused_by_fl_arrow(how):
    ds = datasets.Dataset.from_dict({"x": list(range(30)), "y": [float(i) for i in range(30)], "z": [1] * 30})
    if how == "with_transform":
        view = ds.with_transform(_times_ten)
    else:
        view = ds.shuffle(seed=3)  # through an indices mapping too
        view.set_transform(_times_ten)
    want = [view[i] for i in range(len(view))]
    got = epoch(view, with_index=True)
    assert set(got) == {"x", "y", "index"}  # the transform's columns, not the stored ones
    np.testing.assert_array_equal(got["x"], [w["x"] for w in want])
    np.testing.assert_array_equal(got["y"], [w["y"] for w in want])
    assert got["x"].max() == 290
    with pytest.raises(ValueError, match="_times_ten.*with_transform or set_transform.*fl.Loader"):
        fl.Arrow(view)
    # The stored columns, explicitly.
    np.testing.assert_array_equal(epoch(fl.Arrow(view.with_format(None), ["x"]))["x"], view.with_format(None)["x"])


def test_a_transform_in_a_mix_is_a_python_source():
    ds = datasets.Dataset.from_dict({"x": list(range(20))}).with_transform(lambda b: {"x": [v + 100 for v in b["x"]]})
    other = datasets.Dataset.from_dict({"x": list(range(5))}).with_transform(lambda b: {"x": [-v for v in b["x"]]})
    got = set(epoch(fl.Mix([ds, other]))["x"].tolist())
    assert got == {v + 100 for v in range(20)} | {-v for v in range(5)}  # every row, each transformed


def test_format_columns_are_honoured_and_format_arguments_refused():
    torch = pytest.importorskip("torch")
    ds = datasets.Dataset.from_dict({"a": list(range(10)), "b": list(range(10, 20)), "c": ["s"] * 10})
    assert set(epoch(ds.with_format("torch", columns=["a", "b"]))) == {"a", "b"}
    formatted = ds.with_format("numpy", columns=["a"])
    assert fl.Arrow(formatted).names == ["a"]
    assert set(fl.Arrow(ds.with_format("numpy", columns=["a"], output_all_columns=True)).names) == {"a", "b", "c"}
    assert fl.Arrow(formatted, columns=["b"]).names == ["b"]  # the explicit argument wins
    in_place = ds.select(range(10))
    in_place.set_format("torch", columns=["b"])
    np.testing.assert_array_equal(epoch(in_place)["b"], np.arange(10, 20))
    assert set(epoch(in_place)) == {"b"}
    with pytest.raises(ValueError, match="dtype=torch.float16.*stored dtype"):
        fl.Arrow(ds.with_format("torch", dtype=torch.float16))


# ------------------------------------------------------------------------------ ArrayND

DTYPES = ["float32", "int16", "uint8", "bool", "float64", "int64"]


def array_dataset(rows: int = 40, seed: int = 0):
    rng = np.random.default_rng(seed)

    def values(shape, dtype):
        if dtype == "bool":
            return rng.random(shape) < 0.5
        if dtype.startswith("float"):
            return rng.standard_normal(shape).astype(dtype)
        return rng.integers(0, 100, shape).astype(dtype)

    shapes = {"a2": (2, 3), "a3": (2, 2, 3), "a4": (1, 2, 2, 2), "a5": (2, 1, 1, 2, 3)}
    kinds = {2: datasets.Array2D, 3: datasets.Array3D, 4: datasets.Array4D, 5: datasets.Array5D}
    features, data = {}, {}
    for k, (name, shape) in enumerate(shapes.items()):
        for dtype in DTYPES[k:k + 3]:
            col = f"{name}_{dtype}"
            features[col] = kinds[len(shape)](shape, dtype)
            data[col] = values((rows, *shape), dtype)
    lens = rng.integers(0, 5, rows)
    features["dyn"] = datasets.Array2D((None, 3), "int32")
    data["dyn"] = [values((k, 3), "int32") for k in lens]
    ds = datasets.Dataset.from_dict({k: list(v) for k, v in data.items()}, features=datasets.Features(features))
    return ds, data


def check_arrays(got: dict, data: dict, rows: np.ndarray, max_length: int | None = None) -> None:
    for name, values in data.items():
        if name == "dyn":
            cap = max_length if max_length is not None else max(len(v) for v in values)
            want = np.zeros((len(rows), cap, 3), np.int32)
            for i, r in enumerate(rows):
                k = min(len(values[r]), cap)
                want[i, :k] = values[r][:k]
            np.testing.assert_array_equal(got["dyn"], want)
            np.testing.assert_array_equal(got["dyn_lengths"], [min(len(values[r]), cap) for r in rows])
            continue
        assert got[name].shape == (len(rows), *values.shape[1:]), name
        assert got[name].dtype == values.dtype, name
        np.testing.assert_array_equal(got[name], values[rows], err_msg=name)


def test_array2d_to_5d_arrive_with_their_shape_through_indices_mappings():
    ds, data = array_dataset()
    got = epoch(ds, with_index=True)
    check_arrays(got, data, got["index"])
    for view in (ds.shuffle(seed=1), ds.select([5, 3, 3, 39, 0] * 4), ds.shuffle(seed=2).select(range(0, 40, 3))):
        mapping = view._indices.column("indices").to_numpy()
        for threads in (1, 3):
            got = fl.Loader(view, batch_size=6, shuffle=True, seed=threads, num_threads=threads, with_index=True,
                            device="cpu")
            for b in got:
                check_arrays({k: v.numpy() for k, v in b.items()}, data, mapping[b["index"].numpy()])


def test_array_with_a_dynamic_first_dimension_is_cut_to_max_length():
    ds, data = array_dataset(seed=4)
    got = epoch(fl.Arrow(ds, max_length={"dyn": 2}), with_index=True)
    check_arrays(got, data, got["index"], max_length=2)
    with pytest.raises(ValueError, match="max_length\\['a2_float32'\\].*fixed shape"):
        fl.Arrow(ds, max_length={"a2_float32": 1})
    # One max_length for all applies to the columns of variable length only.
    got = epoch(fl.Loader(ds, batch_size=8, max_length=2, device="cpu").dataset, with_index=True)
    check_arrays(got, data, got["index"], max_length=2)


def test_a_row_of_another_shape_is_an_error_naming_column_and_row():
    feats = datasets.Features({"img": datasets.Array2D((2, 3), "int32")})
    good = np.arange(6, dtype=np.int32).reshape(2, 3)
    ds = datasets.Dataset.from_dict({"img": [good] * 10}, features=feats)
    table = ds.data.table
    storage = table.column("img").combine_chunks().storage.to_pylist()
    for bad_row, bad in ((7, [[1, 2, 3], [4, 5, 6], [7, 8, 9]]), (4, [[1, 2], [3, 4]])):
        rows = list(storage)
        rows[bad_row] = bad
        column = pa.ExtensionArray.from_storage(table.schema.field("img").type, pa.array(rows, table.column("img").type.storage_type))
        broken = datasets.Dataset(pa.table({"img": column}, schema=table.schema))
        loader = fl.Loader(broken, batch_size=5, device="cpu")
        with pytest.raises(ValueError, match=f"'img': row {bad_row} does not have the declared shape \\(2, 3\\)"):
            list(loader)
        # A batch without the row reads.
        first = next(iter(fl.Loader(fl.Arrow(broken.select(range(4)) if bad_row >= 4 else broken), batch_size=4,
                                    device="cpu")))
        np.testing.assert_array_equal(first["img"].numpy(), np.stack([good] * 4))


def test_array_nulls_filled_with_a_scalar_or_a_row():
    feats = datasets.Features({"img": datasets.Array2D((2, 2), "float32")})
    rows = [None if i % 3 == 0 else np.full((2, 2), i, np.float32) for i in range(12)]
    ds = datasets.Dataset.from_dict({"img": rows}, features=feats)
    with pytest.raises(ValueError, match="'img' holds nulls \\(the first at row 0\\)"):
        fl.Arrow(ds)
    got = epoch(fl.Arrow(ds, fill_null={"img": -1.0}, with_valid=True))
    want = np.stack([np.full((2, 2), -1.0 if i % 3 == 0 else i, np.float32) for i in range(12)])
    np.testing.assert_array_equal(got["img"], want)
    np.testing.assert_array_equal(got["img_valid"], [i % 3 != 0 for i in range(12)])
    got = epoch(fl.Arrow(ds, fill_null={"img": [[1, 2], [3, 4]]}))
    np.testing.assert_array_equal(got["img"][0], [[1, 2], [3, 4]])


def test_arrays_from_the_parquet_datasets_writes(tmp_path):
    ds, data = array_dataset(rows=30, seed=5)
    ds.to_parquet(str(tmp_path / "arrays.parquet"))
    got = epoch(fl.Parquet(tmp_path / "arrays.parquet", max_length={"dyn": 5}), with_index=True)
    check_arrays(got, data, got["index"], max_length=5)
    # Without the extension types (as a reader that never imported datasets sees it): the shapes
    # come from the schema's "huggingface" metadata.
    plain = pa.table({"grid": pa.array([[[1, 2], [3, 4], [5, 6]]] * 4, pa.list_(pa.list_(pa.int64())))})
    meta = b'{"info": {"features": {"grid": {"shape": [3, 2], "dtype": "int64", "_type": "Array2D"}}}}'
    plain = plain.replace_schema_metadata({"huggingface": meta})
    got = epoch(plain)
    np.testing.assert_array_equal(got["grid"], np.tile([[1, 2], [3, 4], [5, 6]], (4, 1, 1)))
    with pytest.raises(ValueError, match="list of lists is read only with a declared shape"):
        fl.Arrow(plain.replace_schema_metadata(None))


# ------------------------------------------------------------------------------ other types

def test_empty_dataset_says_no_rows():
    for empty in (datasets.Dataset.from_dict({"x": []}), datasets.Dataset.from_dict({"x": [1, 2]}).select([]),
                  datasets.Dataset.from_dict({"x": [1, 2]}).filter(lambda r: False)):
        with pytest.raises(ValueError, match="no rows"):
            fl.Arrow(empty)
        with pytest.raises(ValueError, match="no rows"):
            fl.Loader(empty, batch_size=2)


def test_sequence_of_bool_and_of_fixed_lists():
    rng = np.random.default_rng(2)
    flags = [list(rng.random(k) < 0.5) for k in rng.integers(0, 7, 50)]
    pairs = [rng.integers(0, 9, (k, 2)).astype(np.int8) for k in rng.integers(0, 4, 50)]
    ds = datasets.Dataset.from_dict({"flags": flags, "pairs": [p.tolist() for p in pairs]}, features=datasets.Features({
        "flags": datasets.Sequence(datasets.Value("bool")),
        "pairs": datasets.Sequence(datasets.Sequence(datasets.Value("int8"), length=2))}))
    ds = ds.shuffle(seed=0)
    mapping = ds._indices.column("indices").to_numpy()
    got = epoch(fl.Arrow(ds, pad={"flags": True}), with_index=True)
    rows = mapping[got["index"]]
    longest = max(len(f) for f in flags)
    want = np.ones((len(rows), longest), bool)
    for i, r in enumerate(rows):
        want[i, :len(flags[r])] = flags[r]
    np.testing.assert_array_equal(got["flags"], want)
    np.testing.assert_array_equal(got["flags_lengths"], [len(flags[r]) for r in rows])
    assert got["pairs"].shape[2:] == (2,)
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(got["pairs"][i, :len(pairs[r])], pairs[r])
