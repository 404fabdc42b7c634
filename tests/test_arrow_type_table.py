"""Every row of docs/arrow.md's type table, with the real producers it names (pyarrow, Hugging
Face `datasets`, Polars, pandas): the batch entry the row promises, against the Python values
the data were built from. A row added to the table without a test here fails
test_every_row_of_the_type_table_is_tested."""
from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import numpy as np
import pytest

import fastload as fl

pa = pytest.importorskip("pyarrow")
TABLE = Path(__file__).resolve().parents[1] / "docs" / "arrow.md"
TESTED: dict[str, set[str]] = {}  # row of the table -> producers tested


def row(first_cell: str, producer: str):
    """Registers a test as the one for (row, producer); the row's text must be the table's."""
    def register(fn):
        TESTED.setdefault(first_cell, set()).add(producer)
        return fn
    return register


def table_rows() -> list[str]:
    text = TABLE.read_text().split("## Types\n", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]  # not the subsections
    cells = [line.split(" | ")[0].lstrip("| ").strip() for line in text.splitlines() if line.startswith("| ")]
    return [c for c in cells if c not in ("Arrow type", "---")]


def epoch(source, **kw) -> dict:
    """One epoch (shuffled, with "index"), as numpy arrays (lists stay lists), concatenated."""
    out: dict = {}
    for b in fl.Loader(source, batch_size=9, shuffle=True, with_index=True, device="cpu", num_threads=2, **kw):
        for k, v in b.items():
            out.setdefault(k, []).append(v if isinstance(v, list) else v.numpy())
    return {k: sum(v, []) if isinstance(v[0], list) else np.concatenate(v) for k, v in out.items()}


def padded(rows: list, dtype, item_shape=(), pad=0, cap=None) -> tuple[np.ndarray, np.ndarray]:
    width = cap if cap is not None else max(1, max(len(r) for r in rows))
    out = np.full((len(rows), width, *item_shape), pad, dtype)
    lengths = np.zeros(len(rows), np.int64)
    for i, r in enumerate(rows):
        k = min(len(r), width)
        out[i, :k] = np.asarray(r[:k], dtype).reshape(k, *item_shape)
        lengths[i] = k
    return out, lengths


RNG = np.random.default_rng(0)
N = 40
NUMBERS = {t: (RNG.integers(-100, 100, N) if t.startswith("int") else RNG.integers(0, 200, N) if t.startswith("uint")
               else RNG.standard_normal(N)).astype(t)
           for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
                     "float64")}
FLAGS = RNG.random(N) < 0.5
WORDS = ["", "a", "twelve bytes", "héllo wörld, long enough", "日本語" * 4]
TEXT = [WORDS[k] for k in RNG.integers(0, len(WORDS), N)]
TOKENS = [RNG.integers(0, 1000, k).tolist() for k in RNG.integers(0, 7, N)]
BITS = [(RNG.random(k) < 0.5).tolist() for k in RNG.integers(0, 7, N)]
PAIRS = [RNG.integers(0, 9, (k, 2)).tolist() for k in RNG.integers(0, 4, N)]


def check_numbers(got, names):
    for n in names:
        assert got[n].dtype == NUMBERS[n].dtype, n
        np.testing.assert_array_equal(got[n], NUMBERS[n][got["index"]], err_msg=n)


# --------------------------------------------------------------------------- numbers and bools
NUM = "int8..int64, uint8..uint64, float16/32/64 (HF `Value`, Polars numbers)"


@row(NUM, "pyarrow")
def test_numbers_pyarrow():
    check_numbers(epoch(pa.table(NUMBERS)), NUMBERS)


@row(NUM, "datasets")
def test_numbers_hf():
    datasets = pytest.importorskip("datasets")
    names = [n for n in NUMBERS if n != "float16"]  # HF Value has float16 too, but stores it as float32
    ds = datasets.Dataset.from_dict({n: NUMBERS[n] for n in names},
                                    features=datasets.Features({n: datasets.Value(n) for n in names}))
    check_numbers(epoch(ds), names)


@row(NUM, "polars")
def test_numbers_polars():
    pl = pytest.importorskip("polars")
    names = [n for n in NUMBERS if n != "float16"]
    check_numbers(epoch(pl.DataFrame({n: NUMBERS[n] for n in names})), names)


@row(NUM, "pandas")
def test_numbers_pandas():
    pd = pytest.importorskip("pandas")
    check_numbers(epoch(pd.DataFrame(NUMBERS)), NUMBERS)


BOOL = "bool (bit-packed)"


@row(BOOL, "pyarrow")
def test_bool_pyarrow():
    got = epoch(pa.table({"f": FLAGS, "pad": np.arange(N)}).slice(3))  # bits from mid-byte
    assert got["f"].dtype == np.bool_
    np.testing.assert_array_equal(got["f"], FLAGS[3:][got["index"]])


@row(BOOL, "datasets")
def test_bool_hf():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"f": FLAGS}, features=datasets.Features({"f": datasets.Value("bool")}))
    np.testing.assert_array_equal((got := epoch(ds.shuffle(seed=1)))["f"],
                                  FLAGS[ds.shuffle(seed=1)._indices.column(0).to_numpy()[got["index"]]])


@row(BOOL, "polars")
def test_bool_polars():
    pl = pytest.importorskip("polars")
    got = epoch(pl.DataFrame({"f": FLAGS}))
    np.testing.assert_array_equal(got["f"], FLAGS[got["index"]])


# --------------------------------------------------------------------------- temporal
TIME = "date32, time32 / date64, time64, timestamp, duration"
DAYS = RNG.integers(0, 20000, N)


@row(TIME, "pyarrow")
def test_temporal_pyarrow():
    t = pa.table({"d32": pa.array(DAYS.astype(np.int32), pa.date32()),
                  "d64": pa.array(DAYS * 86_400_000, pa.date64()),
                  "t32": pa.array((DAYS % 86400).astype(np.int32), pa.time32("s")),
                  "t64": pa.array(DAYS * 1000, pa.time64("us")),
                  "ts": pa.array(DAYS * 1000, pa.timestamp("ms", tz="UTC")),
                  "dur": pa.array(DAYS, pa.duration("s"))})
    got = epoch(t)
    want = {"d32": DAYS.astype(np.int32), "d64": DAYS * 86_400_000, "t32": (DAYS % 86400).astype(np.int32),
            "t64": DAYS * 1000, "ts": DAYS * 1000, "dur": DAYS}
    for n, w in want.items():
        assert got[n].dtype == w.dtype, n
        np.testing.assert_array_equal(got[n], w[got["index"]], err_msg=n)


@row(TIME, "datasets")
def test_temporal_hf():
    datasets = pytest.importorskip("datasets")
    stamps = [dt.datetime(1970, 1, 1) + dt.timedelta(milliseconds=int(d) * 1000) for d in DAYS]
    dates = [dt.date(1970, 1, 1) + dt.timedelta(days=int(d)) for d in DAYS]
    ds = datasets.Dataset.from_dict({"ts": stamps, "day": dates}, features=datasets.Features(
        {"ts": datasets.Value("timestamp[ms]"), "day": datasets.Value("date32")}))
    got = epoch(ds)
    np.testing.assert_array_equal(got["ts"], (DAYS * 1000)[got["index"]])  # milliseconds since the epoch
    np.testing.assert_array_equal(got["day"], DAYS[got["index"]])


@row(TIME, "polars")
def test_temporal_polars():
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"day": pl.Series(DAYS).cast(pl.Date), "at": pl.Series(DAYS * 1000).cast(pl.Datetime("ms")),
                       "took": pl.Series(DAYS).cast(pl.Duration("us"))})
    got = epoch(df)
    for n in ("day", "at", "took"):
        np.testing.assert_array_equal(got[n], DAYS[got["index"]] * (1000 if n == "at" else 1), err_msg=n)


# --------------------------------------------------------------------------- fixed shapes
FIXED = "fixed_size_list (nested), HF `Sequence(length=n)`, Polars `Array`"
GRID = RNG.integers(0, 100, (N, 3, 2)).astype(np.int16)


@row(FIXED, "pyarrow")
def test_fixed_size_list_pyarrow():
    t = pa.table({"g": pa.array(GRID.tolist(), pa.list_(pa.list_(pa.int16(), 2), 3))})
    got = epoch(t)
    np.testing.assert_array_equal(got["g"], GRID[got["index"]])


@row(FIXED, "datasets")
def test_fixed_size_list_hf():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"g": GRID.tolist()}, features=datasets.Features(
        {"g": datasets.Sequence(datasets.Sequence(datasets.Value("int16"), length=2), length=3)}))
    got = epoch(ds)
    np.testing.assert_array_equal(got["g"], GRID[got["index"]])


@row(FIXED, "polars")
def test_fixed_size_list_polars():
    pl = pytest.importorskip("polars")
    got = epoch(pl.DataFrame({"g": pl.Series(GRID.tolist(), dtype=pl.Array(pl.Int16, (3, 2)))}))
    np.testing.assert_array_equal(got["g"], GRID[got["index"]])


TENSOR = "`arrow.fixed_shape_tensor` (`pa.fixed_shape_tensor`, `pa.FixedShapeTensorArray`)"


@row(TENSOR, "pyarrow")
def test_fixed_shape_tensor_pyarrow():
    got = epoch(pa.table({"t": pa.FixedShapeTensorArray.from_numpy_ndarray(GRID)}))
    np.testing.assert_array_equal(got["t"], GRID[got["index"]])
    typ = pa.fixed_shape_tensor(pa.int16(), (3, 2), permutation=[1, 0])
    permuted = pa.ExtensionArray.from_storage(typ, pa.array(GRID.reshape(N, 6).tolist(), pa.list_(pa.int16(), 6)))
    with pytest.raises(ValueError, match=r"permutation \[1, 0\]"):
        fl.Arrow(pa.table({"t": permuted}))


ARRAYS = "HF `Array2D` .. `Array5D` (stored as lists of lists, the shape in the feature)"


@row(ARRAYS, "datasets")
def test_arrays_hf():
    datasets = pytest.importorskip("datasets")
    cube = RNG.standard_normal((N, 2, 3, 2)).astype(np.float32)
    dyn = [RNG.integers(0, 9, (k, 2)).astype(np.int64) for k in RNG.integers(0, 4, N)]
    ds = datasets.Dataset.from_dict({"g": list(GRID), "c": list(cube), "d": dyn}, features=datasets.Features(
        {"g": datasets.Array2D((3, 2), "int16"), "c": datasets.Array3D((2, 3, 2), "float32"),
         "d": datasets.Array2D((None, 2), "int64")}))
    got = epoch(ds)
    np.testing.assert_array_equal(got["g"], GRID[got["index"]])
    np.testing.assert_array_equal(got["c"], cube[got["index"]])
    want, lengths = padded([dyn[i].tolist() for i in got["index"]], np.int64, (2,))
    np.testing.assert_array_equal(got["d"], want)
    np.testing.assert_array_equal(got["d_lengths"], lengths)


BYTES = "fixed_size_binary(n), `arrow.uuid`"


@row(BYTES, "pyarrow")
def test_fixed_binary_pyarrow():
    raw = [bytes(RNG.integers(0, 256, 16).astype(np.uint8)) for _ in range(N)]
    t = pa.table({"b3": pa.array([r[:3] for r in raw], pa.binary(3)),
                  "u": pa.ExtensionArray.from_storage(pa.uuid(), pa.array(raw, pa.binary(16)))})
    got = epoch(t)
    want = np.frombuffer(b"".join(raw), np.uint8).reshape(N, 16)[got["index"]]
    np.testing.assert_array_equal(got["u"], want)
    np.testing.assert_array_equal(got["b3"], want[:, :3])


# --------------------------------------------------------------------------- lists
LISTS = "list / large_list / list_view of numbers, bools or fixed-size lists (HF `Sequence`, Polars `List`)"


def check_lists(got, name, rows, dtype, item_shape=(), pad=0):
    want, lengths = padded([rows[i] for i in got["index"]], dtype, item_shape, pad)
    np.testing.assert_array_equal(got[name], want, err_msg=name)
    np.testing.assert_array_equal(got[name + "_lengths"], lengths, err_msg=name)


@row(LISTS, "pyarrow")
def test_lists_pyarrow():
    t = pa.table({"l": pa.array(TOKENS, pa.list_(pa.int32())), "big": pa.array(TOKENS, pa.large_list(pa.float64())),
                  "view": pa.array(TOKENS, pa.list_view(pa.int64())), "bits": pa.array(BITS, pa.list_(pa.bool_())),
                  "pairs": pa.array(PAIRS, pa.list_(pa.list_(pa.int8(), 2)))})
    got = epoch(fl.Arrow(t, pad={"bits": True}))
    check_lists(got, "l", TOKENS, np.int32)
    check_lists(got, "big", TOKENS, np.float64)
    check_lists(got, "view", TOKENS, np.int64)
    check_lists(got, "bits", BITS, np.bool_, pad=True)
    check_lists(got, "pairs", PAIRS, np.int8, (2,))


@row(LISTS, "datasets")
def test_lists_hf():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"l": TOKENS, "bits": BITS, "pairs": PAIRS}, features=datasets.Features({
        "l": datasets.Sequence(datasets.Value("int64")), "bits": datasets.Sequence(datasets.Value("bool")),
        "pairs": datasets.Sequence(datasets.Sequence(datasets.Value("int8"), length=2))}))
    got = epoch(ds)
    check_lists(got, "l", TOKENS, np.int64)
    check_lists(got, "bits", BITS, np.bool_)
    check_lists(got, "pairs", PAIRS, np.int8, (2,))


@row(LISTS, "polars")
def test_lists_polars():
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"l": TOKENS, "bits": BITS,
                       "pairs": pl.Series(PAIRS, dtype=pl.List(pl.Array(pl.Int8, 2)))})
    got = epoch(df)
    check_lists(got, "l", TOKENS, np.int64)
    check_lists(got, "bits", BITS, np.bool_)
    check_lists(got, "pairs", PAIRS, np.int8, (2,))


# --------------------------------------------------------------------------- strings
STRINGS = ("string / binary (large, view, dictionary-encoded too: Polars `String`, `Binary`, `Categorical`, `Enum`; "
           "`arrow.json` as its text)")
RAW = [w.encode() for w in TEXT]


def check_strings(got, names, values):
    for n in names:
        assert got[n] == [values[i] for i in got["index"]], n


@row(STRINGS, "pyarrow")
def test_strings_pyarrow():
    t = pa.table({"s": pa.array(TEXT), "ls": pa.array(TEXT, pa.large_string()), "sv": pa.array(TEXT, pa.string_view()),
                  "d": pa.array(TEXT).dictionary_encode(), "b": pa.array(RAW), "lb": pa.array(RAW, pa.large_binary()),
                  "bv": pa.array(RAW, pa.binary_view()),
                  "j": pa.ExtensionArray.from_storage(pa.json_(), pa.array([f'{{"k": {i}}}' for i in range(N)]))})
    got = epoch(t)
    check_strings(got, ["s", "ls", "sv", "d"], TEXT)
    check_strings(got, ["b", "lb", "bv"], RAW)
    check_strings(got, ["j"], [f'{{"k": {i}}}' for i in range(N)])


@row(STRINGS, "datasets")
def test_strings_hf():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"s": TEXT, "ls": TEXT, "b": RAW}, features=datasets.Features(
        {"s": datasets.Value("string"), "ls": datasets.Value("large_string"), "b": datasets.Value("binary")}))
    got = epoch(ds)
    check_strings(got, ["s", "ls"], TEXT)
    check_strings(got, ["b"], RAW)


@row(STRINGS, "polars")
def test_strings_polars():
    pl = pytest.importorskip("polars")
    kinds = [["cat", "dog", "emu"][i % 3] for i in range(N)]
    df = pl.DataFrame({"s": TEXT, "b": RAW, "c": pl.Series(kinds, dtype=pl.Categorical),
                       "e": pl.Series(kinds, dtype=pl.Enum(["cat", "dog", "emu"]))})
    got = epoch(df)
    check_strings(got, ["s"], TEXT)
    check_strings(got, ["b"], RAW)
    check_strings(got, ["c", "e"], kinds)


@row(STRINGS, "pandas")
def test_strings_pandas():
    pd = pytest.importorskip("pandas")
    got = epoch(pd.DataFrame({"s": TEXT, "c": pd.Categorical(TEXT)}))
    check_strings(got, ["s", "c"], TEXT)


PADDED = 'string / binary with `max_length={"col": n}`'


def check_padded(got, name, values, cap):
    want, lengths = padded([list(values[i][:cap]) for i in got["index"]], np.uint8, cap=cap)
    np.testing.assert_array_equal(got[name], want, err_msg=name)
    np.testing.assert_array_equal(got[name + "_lengths"], lengths, err_msg=name)


@row(PADDED, "pyarrow")
def test_padded_strings_pyarrow():
    t = pa.table({"s": pa.array(TEXT), "sv": pa.array(TEXT, pa.string_view()), "b": pa.array(RAW, pa.binary_view())})
    got = epoch(fl.Arrow(t, max_length=7))
    for n in ("s", "sv", "b"):
        check_padded(got, n, RAW, 7)


@row(PADDED, "datasets")
def test_padded_strings_hf():
    datasets = pytest.importorskip("datasets")
    check_padded(epoch(fl.Arrow(datasets.Dataset.from_dict({"s": TEXT}), max_length={"s": 5})), "s", RAW, 5)


@row(PADDED, "polars")
def test_padded_strings_polars():
    pl = pytest.importorskip("polars")
    check_padded(epoch(fl.Arrow(pl.DataFrame({"s": TEXT}), max_length={"s": 9})), "s", RAW, 9)


# --------------------------------------------------------------------------- structs, dictionaries
STRUCT = "struct (HF dict features, Polars `Struct`)"


@row(STRUCT, "pyarrow")
def test_struct_pyarrow():
    t = pa.table({"m": pa.array([{"score": float(i), "deep": {"ok": i % 2 == 0, "name": TEXT[i]}} for i in range(N)])})
    got = epoch(t)
    np.testing.assert_array_equal(got["m.score"], got["index"].astype(float))
    np.testing.assert_array_equal(got["m.deep.ok"], got["index"] % 2 == 0)
    check_strings(got, ["m.deep.name"], TEXT)
    clash = pa.table({"m.score": np.arange(N), "m": t.column("m")})
    with pytest.raises(ValueError, match="the column 'm.score' and the field 'score' of the struct 'm'"):
        fl.Arrow(clash)


@row(STRUCT, "datasets")
def test_struct_hf():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"m": [{"score": i, "name": TEXT[i]} for i in range(N)]}, features=datasets.Features(
        {"m": {"score": datasets.Value("int32"), "name": datasets.Value("string")}}))
    got = epoch(ds)
    np.testing.assert_array_equal(got["m.score"], got["index"])
    check_strings(got, ["m.name"], TEXT)


@row(STRUCT, "polars")
def test_struct_polars():
    pl = pytest.importorskip("polars")
    got = epoch(pl.DataFrame({"m": [{"score": i, "name": TEXT[i]} for i in range(N)]}))
    np.testing.assert_array_equal(got["m.score"], got["index"])
    check_strings(got, ["m.name"], TEXT)


DICT = "dictionary (pandas categoricals)"


@row(DICT, "pyarrow")
def test_dictionary_pyarrow():
    codes = (np.arange(N) % 3 * 10).astype(np.int16)
    t = pa.table({"c": pa.array(codes).dictionary_encode(),
                  "n": pa.DictionaryArray.from_arrays(pa.array(np.arange(N) % 3, pa.int8()), pa.array([5, None, 7]))})
    got = epoch(fl.Arrow(t, fill_null={"n": -1}))
    np.testing.assert_array_equal(got["c"], codes[got["index"]])
    np.testing.assert_array_equal(got["n"], np.array([5, -1, 7])[got["index"] % 3])


@row(DICT, "pandas")
def test_dictionary_pandas():
    pd = pytest.importorskip("pandas")
    nums = pd.Categorical(np.arange(N) % 4 * 2.5)
    got = epoch(pd.DataFrame({"n": nums}))
    np.testing.assert_array_equal(got["n"], (np.arange(N) % 4 * 2.5)[got["index"]])


@row(DICT, "datasets")
def test_class_label_hf():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"y": [i % 3 for i in range(N)]},
                                    features=datasets.Features({"y": datasets.ClassLabel(names=["a", "b", "c"])}))
    got = epoch(ds)
    assert got["y"].dtype == np.int64
    np.testing.assert_array_equal(got["y"], got["index"] % 3)


# --------------------------------------------------------------------------- nulls
NULLS = "a column with nulls"
MASK = RNG.random(N) < 0.3


@row(NULLS, "pyarrow")
def test_nulls_pyarrow():
    t = pa.table({"x": pa.array(NUMBERS["int32"], mask=MASK), "s": pa.array([None if m else w for m, w in zip(MASK, TEXT)]),
                  "l": pa.array([None if m else r for m, r in zip(MASK, TOKENS)], pa.list_(pa.int64()))})
    with pytest.raises(ValueError, match=f"'x' holds nulls \\(the first at row {int(np.argmax(MASK))}\\)"):
        fl.Arrow(t)
    got = epoch(fl.Arrow(t, fill_null={"x": -1, "s": "?", "l": [0, 0]}, with_valid=True))
    np.testing.assert_array_equal(got["x"], np.where(MASK, -1, NUMBERS["int32"])[got["index"]])
    check_strings(got, ["s"], ["?" if m else w for m, w in zip(MASK, TEXT)])
    check_lists(got, "l", [[0, 0] if m else r for m, r in zip(MASK, TOKENS)], np.int64)
    for n in ("x", "s", "l"):
        np.testing.assert_array_equal(got[n + "_valid"], ~MASK[got["index"]])


@row(NULLS, "datasets")
def test_nulls_hf():
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"x": [None if m else int(v) for m, v in zip(MASK, NUMBERS["int16"])],
                                     "s": [None if m else w for m, w in zip(MASK, TEXT)]},
                                    features=datasets.Features({"x": datasets.Value("int16"), "s": datasets.Value("string")}))
    with pytest.raises(ValueError, match="holds nulls"):
        fl.Loader(ds, batch_size=4)
    got = epoch(fl.Arrow(ds, fill_null={"x": 0, "s": None}))
    np.testing.assert_array_equal(got["x"], np.where(MASK, 0, NUMBERS["int16"])[got["index"]])
    check_strings(got, ["s"], [None if m else w for m, w in zip(MASK, TEXT)])


@row(NULLS, "polars")
def test_nulls_polars():
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"x": [None if m else float(v) for m, v in zip(MASK, NUMBERS["float64"])],
                       "s": [None if m else w for m, w in zip(MASK, TEXT)]})
    got = epoch(fl.Arrow(df, fill_null={"x": 0.5, "s": ""}, with_valid=True))
    np.testing.assert_array_equal(got["x"], np.where(MASK, 0.5, NUMBERS["float64"])[got["index"]])
    check_strings(got, ["s"], ["" if m else w for m, w in zip(MASK, TEXT)])
    np.testing.assert_array_equal(got["s_valid"], ~MASK[got["index"]])


# --------------------------------------------------------------------------- refused
REFUSED = ("map, union, decimal, lists of lists without a declared shape, lists of strings, null, images/audio as "
           "`struct<bytes, path>`, other extension types (`arrow.opaque`, `arrow.bool8`, `arrow.variable_shape_tensor`, "
           "pandas' or your own)")


def refused(data, name, match):
    with pytest.raises(ValueError, match=f"'{name}'.*{match}"):
        fl.Arrow(data, columns=[name])
    with pytest.raises(ValueError, match="not read natively|is of the extension type"):
        fl.Loader(data, batch_size=2)


@row(REFUSED, "pyarrow")
def test_refused_pyarrow():
    media = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    cases = {
        "m": (pa.array([{"a": 1}], pa.map_(pa.string(), pa.int32())), "map"),
        "u": (pa.UnionArray.from_sparse(pa.array([0], pa.int8()), [pa.array([1]), pa.array(["a"])]), "union"),
        "d": (pa.array([1], pa.decimal128(5, 2)), "decimal"),
        "ll": (pa.array([[[1]]], pa.list_(pa.list_(pa.int32()))), "declared shape"),
        "ls": (pa.array([["a"]], pa.list_(pa.string())), "lists of strings"),
        "n": (pa.array([None], pa.null()), "null"),
        "img": (pa.array([{"bytes": b"\x89PNG", "path": "a.png"}], media), "struct<bytes, path>"),
        "o": (pa.ExtensionArray.from_storage(pa.opaque(pa.binary(), "geometry", "vendor"), pa.array([b"x"])),
              "extension type 'arrow.opaque'"),
        "b8": (pa.ExtensionArray.from_storage(pa.bool8(), pa.array([1], pa.int8())), "extension type 'arrow.bool8'"),
    }
    for name, (arr, match) in cases.items():
        refused(pa.table({name: arr, "ok": [1]}), name, match)


@row(REFUSED, "datasets")
def test_refused_hf():
    datasets = pytest.importorskip("datasets")
    media = pa.array([{"bytes": b"\x89PNG", "path": None}], pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    image = datasets.Dataset(pa.table({"img": media, "ok": [1]}).replace_schema_metadata(
        {"huggingface": '{"info": {"features": {"img": {"_type": "Image"}, "ok": {"dtype": "int64", "_type": "Value"}}}}'}))
    refused(image, "img", "encoded image or audio")
    nested = datasets.Dataset.from_dict({"ll": [[[1], [2, 3]]], "ls": [["a", "b"]]}, features=datasets.Features(
        {"ll": datasets.Sequence(datasets.Sequence(datasets.Value("int32"))),
         "ls": datasets.Sequence(datasets.Value("string"))}))
    refused(nested, "ll", "declared shape")
    refused(nested, "ls", "lists of strings")


@row(REFUSED, "polars")
def test_refused_polars():
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"d": pl.Series(["1.5"]).cast(pl.Decimal(10, 2)), "ls": [["a"]], "n": pl.Series([None]),
                       "ll": [[[1]]]})
    refused(df, "d", "decimal")
    refused(df, "ls", "lists of strings")
    refused(df, "n", "null")
    refused(df, "ll", "declared shape")


@row(REFUSED, "pandas")
def test_refused_pandas():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"p": pd.period_range("2024-01", periods=2, freq="M"), "iv": pd.interval_range(0, 2),
                       "ok": [1, 2]})
    refused(df, "p", "extension type 'pandas.period'")
    refused(df, "iv", "extension type 'pandas.interval'")  # its struct storage is not flattened into fields
    assert fl.Arrow(df, columns=["ok"]).names == ["ok"]


# --------------------------------------------------------------------------- the guard
def test_every_row_of_the_type_table_is_tested():
    rows = table_rows()
    assert rows and set(rows) == set(TESTED), (set(rows) ^ set(TESTED))
    for first_cell, producers in TESTED.items():
        named = {p for p, words in (("datasets", ("HF",)), ("polars", ("Polars",)), ("pandas", ("pandas",)))
                 if any(w in first_cell for w in words)}
        assert named <= producers, f"{first_cell!r} names {named - producers} but is not tested with it"
        assert "pyarrow" in producers or first_cell.startswith("HF"), first_cell
    assert re.search(r"tests/test_arrow_type_table\.py", TABLE.read_text())
