"""Arrow layouts the issue found read wrongly or refused, each against a reference built from the
values the arrays were made of: columns whose flattened names clash (refused, naming both),
extension types (fixed_shape_tensor kept in shape, the rest read as stored or refused by name),
string/binary views (inline and out-of-line, several variadic buffers), list views, lists of
bool, null scans that honour the slice, string fill values, dictionary values that are null."""
from __future__ import annotations

import json

import numpy as np
import pytest

import fastload as fl

pa = pytest.importorskip("pyarrow")
from arrow_reference import check_batch, epoch  # noqa: E402



# ------------------------------------------------------------------------------ name clashes

def test_a_column_and_a_struct_field_of_one_flattened_name_are_refused_naming_both():
    t = pa.table({"meta.id": [1, 2], "meta": pa.array([{"id": 10}, {"id": 20}])})
    for columns in (None, ["meta"], ["meta.id"]):
        with pytest.raises(ValueError, match=r"the column 'meta.id' and the field 'id' of the struct 'meta'"):
            fl.Arrow(t, columns=columns)
    with pytest.raises(ValueError, match="clash"):
        fl.Loader(t, batch_size=2)
    # Nested: a struct field named "b.c" beside a struct b with a field c.
    inner = pa.array([{"b.c": 1, "b": {"c": 2}}])
    with pytest.raises(ValueError, match=r"field path \['a', 'b.c'\].*field path \['a', 'b', 'c'\]"):
        fl.Arrow(pa.table({"a": inner}))
    # Two top-level columns of one name (pyarrow allows it).
    twice = pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["x", "x"])
    with pytest.raises(ValueError, match="the column 'x' and the column 'x'"):
        fl.Arrow(twice)
    # A column not read may clash with nothing: the others read.
    assert fl.Arrow(t.append_column("ok", pa.array([3, 4])), columns=["ok"]).names == ["ok"]
    # <name>_lengths and <name>_valid beside a real column.
    with pytest.raises(ValueError, match=r"<name>_lengths.*\['l_lengths'\]"):
        fl.Arrow(pa.table({"l": [[1], [2, 3]], "l_lengths": [0, 0]}))
    with pytest.raises(ValueError, match=r"<name>_valid.*\['x_valid'\]"):
        fl.Arrow(pa.table({"x": [1, None], "x_valid": [0, 0]}), fill_null={"x": 0}, with_valid=True)


def test_parquet_refuses_a_clash_too(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"meta.id": [1, 2], "meta": pa.array([{"id": 10}, {"id": 20}])}), tmp_path / "c.parquet")
    with pytest.raises(ValueError, match="Parquet columns clash: the column 'meta.id' and the field 'id'"):
        fl.Parquet(tmp_path / "c.parquet")


# ------------------------------------------------------------------------------ extension types

def test_fixed_shape_tensor_keeps_its_shape():
    rng = np.random.default_rng(0)
    for dtype, shape in ((np.int32, (2, 3)), (np.float32, (4, 1, 2)), (np.uint8, (5,))):
        values = rng.integers(0, 100, (23, *shape)).astype(dtype)
        column = pa.FixedShapeTensorArray.from_numpy_ndarray(values)
        assert column.type.extension_name == "arrow.fixed_shape_tensor"
        t = pa.table({"t": column, "id": np.arange(23)}).slice(3)
        got = epoch(t, shuffle=True, with_index=True)
        assert got["t"].shape == (20, *shape) and got["t"].dtype == dtype
        np.testing.assert_array_equal(got["t"], values[3:][got["index"]])
    # With dim_names (names only: the layout is the same).
    typ = pa.fixed_shape_tensor(pa.int16(), (2, 2), dim_names=["h", "w"])
    storage = pa.array([[1, 2, 3, 4], [5, 6, 7, 8]], pa.list_(pa.int16(), 4))
    got = epoch(pa.table({"t": pa.ExtensionArray.from_storage(typ, storage)}))
    np.testing.assert_array_equal(got["t"], [[[1, 2], [3, 4]], [[5, 6], [7, 8]]])
    # A null tensor is filled like any fixed row.
    nulls = pa.ExtensionArray.from_storage(typ, pa.array([[1, 2, 3, 4], None], pa.list_(pa.int16(), 4)))
    np.testing.assert_array_equal(epoch(fl.Arrow(pa.table({"t": nulls}), fill_null={"t": 9}))["t"][1], np.full((2, 2), 9))


def test_a_permuted_fixed_shape_tensor_is_refused_naming_the_permutation():
    typ = pa.fixed_shape_tensor(pa.int32(), (2, 3), permutation=[1, 0])
    column = pa.ExtensionArray.from_storage(typ, pa.array([list(range(6))], pa.list_(pa.int32(), 6)))
    with pytest.raises(ValueError, match=r"'t' is an arrow.fixed_shape_tensor of shape \[2, 3\] with the permutation \[1, 0\]"):
        fl.Arrow(pa.table({"t": column}))
    identity = pa.fixed_shape_tensor(pa.int32(), (2, 3), permutation=[0, 1])
    column = pa.ExtensionArray.from_storage(identity, pa.array([list(range(6))], pa.list_(pa.int32(), 6)))
    np.testing.assert_array_equal(epoch(pa.table({"t": column}))["t"], [np.arange(6).reshape(2, 3)])


class _Named(pa.ExtensionType):
    """An extension type of any name and storage (as another library would register it)."""

    def __init__(self, storage, name):
        super().__init__(storage, name)

    def __arrow_ext_serialize__(self):
        return b""

    @classmethod
    def __arrow_ext_deserialize__(cls, storage_type, serialized):
        raise NotImplementedError


def test_other_extension_types_are_read_as_stored_or_refused_by_name():
    uuids = [bytes(range(i, i + 16)) for i in range(5)]
    u = pa.ExtensionArray.from_storage(pa.uuid(), pa.array(uuids, pa.binary(16)))
    got = epoch(pa.table({"u": u}))
    np.testing.assert_array_equal(got["u"], np.frombuffer(b"".join(uuids), np.uint8).reshape(5, 16))
    docs = ['{"a": 1}', "[1, 2]", "null"]
    j = pa.ExtensionArray.from_storage(pa.json_(), pa.array(docs))
    assert epoch(pa.table({"j": j}))["j"] == docs
    refused = {
        "arrow.bool8": pa.ExtensionArray.from_storage(pa.bool8(), pa.array([0, 1, 2], pa.int8())),
        "arrow.opaque": pa.ExtensionArray.from_storage(pa.opaque(pa.binary(), "geometry", "vendor"),
                                                       pa.array([b"x"] * 3)),
        "arrow.variable_shape_tensor": pa.ExtensionArray.from_storage(
            _Named(pa.struct([("data", pa.list_(pa.float32())), ("shape", pa.list_(pa.int32(), 2))]),
                   "arrow.variable_shape_tensor"),
            pa.array([{"data": [1.0, 2.0], "shape": [1, 2]}] * 3,
                     pa.struct([("data", pa.list_(pa.float32())), ("shape", pa.list_(pa.int32(), 2))]))),
        "pandas.period": pa.ExtensionArray.from_storage(_Named(pa.int64(), "pandas.period"), pa.array([1, 2, 3])),
    }
    for ext, column in refused.items():
        t = pa.table({"e": column, "ok": [1, 2, 3]})
        with pytest.raises(ValueError, match=f"'e' is of the extension type '{ext}'.*Cast it to its storage type"):
            fl.Arrow(t)
        assert fl.Arrow(t, columns=["ok"]).names == ["ok"]
    # Inside a list, any extension type is refused.
    inner = pa.ListArray.from_arrays(pa.array([0, 2], pa.int32()), u.slice(0, 2))
    with pytest.raises(ValueError, match="extension type 'arrow.uuid' inside it"):
        fl.Arrow(pa.table({"l": inner}))


# ------------------------------------------------------------------------------ views

def _words(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    pool = ["", "a", "twelve bytes", "thirteen byte", "héllo wörld, long enough", "日本語" * 5, "x" * 300]
    return [pool[k] for k in rng.integers(0, len(pool), n)]


def test_string_and_binary_views_inline_and_out_of_line_over_variadic_buffers():
    words = _words(500, 1)
    # Concatenated chunks, each with its own data buffers, then sliced: offsets everywhere.
    chunks = [pa.array(words[a:b], pa.string_view()) for a, b in ((0, 200), (200, 260), (260, 500))]
    t = pa.table({"s": pa.chunked_array(chunks),
                  "b": pa.chunked_array([pa.array([w.encode() for w in words[a:b]], pa.binary_view())
                                         for a, b in ((0, 200), (200, 260), (260, 500))])}).slice(13, 470)
    t = pa.concat_tables([t, pa.table({"s": pa.array(words[:30], pa.string_view()),
                                       "b": pa.array([w.encode() for w in words[:30]], pa.binary_view())})])
    # A views array whose out-of-line strings live in several variadic buffers.
    multi = pa.concat_arrays([pa.array(words[:100], pa.string_view()), pa.array(words[100:200], pa.string_view())])
    t2 = pa.table({"s": multi})
    for table, n in ((t, 500), (t2, 200)):
        want = table.column("s").to_pylist()
        got = epoch(table, with_index=True, shuffle=True)
        assert [want[i] for i in got["index"]] == got["s"]
        if "b" in table.column_names:
            assert [w.encode() for w in (want[i] for i in got["index"])] == got["b"]
        assert len(got["s"]) == n
        padded = epoch(fl.Arrow(table, max_length={"s": 20}), with_index=True)
        for i, row, k in zip(padded["index"], padded["s"], padded["s_lengths"]):
            raw = want[i].encode()[:20]
            assert bytes(row[:k]) == raw and k == len(raw) and not row[k:].any()


def test_list_views_in_any_order_and_with_nulls():
    values = pa.array(np.arange(20, dtype=np.int32))
    offsets = pa.array([10, 0, 5, 0, 18], pa.int32())
    sizes = pa.array([3, 5, 0, 2, 2], pa.int32())
    lv = pa.ListViewArray.from_arrays(offsets, sizes, values, mask=pa.array([False, False, False, True, False]))
    t = pa.table({"l": lv, "big": pa.array(lv.to_pylist(), pa.large_list_view(pa.int64()))})
    got = epoch(fl.Arrow(t, fill_null={"l": [-1], "big": []}, with_valid=True))
    np.testing.assert_array_equal(got["l"], [[10, 11, 12, 0, 0], [0, 1, 2, 3, 4], [0] * 5, [-1, 0, 0, 0, 0],
                                             [18, 19, 0, 0, 0]])
    np.testing.assert_array_equal(got["l_lengths"], [3, 5, 0, 1, 2])
    np.testing.assert_array_equal(got["big_lengths"], [3, 5, 0, 0, 2])
    np.testing.assert_array_equal(got["l_valid"], [1, 1, 1, 0, 1])


def test_lists_of_bool_unpacked_at_any_bit_offset():
    rng = np.random.default_rng(4)
    rows = [list(rng.random(k) < 0.5) for k in rng.integers(0, 11, 300)]
    rows[7] = None
    for typ in (pa.list_(pa.bool_()), pa.large_list(pa.bool_()), pa.list_view(pa.bool_()),
                pa.list_(pa.list_(pa.bool_(), 3))):
        data = rows if not pa.types.is_fixed_size_list(typ.value_type) else \
            [None if r is None else [[v, not v, v] for v in r] for r in rows]
        t = pa.table({"f": pa.array(data, typ)}).slice(5)  # the bits start mid-byte
        got = epoch(fl.Arrow(t, fill_null={"f": []}, pad={"f": True}), with_index=True, shuffle=True)
        want = t.column("f").to_pylist()
        for i, row, k in zip(got["index"], got["f"], got["f_lengths"]):
            w = want[i] or []
            assert k == len(w)
            np.testing.assert_array_equal(row[:k], np.asarray(w, bool).reshape(row[:k].shape))
            assert row[k:].all()  # padded with True


# ------------------------------------------------------------------------------ nulls

def test_null_scans_honour_the_slice_at_every_level():
    """A null outside the rows a slice holds (of the column, of a list's items, of a fixed-size
    list's elements, below a null row) refuses nothing."""
    cases = {
        "top": (pa.array([1, None, 3, 4, 5]), 2),
        "list items": (pa.array([[1, None], [2, 3], [4]]), 1),
        "large list items": (pa.array([[1], [2, 3], [None]], pa.large_list(pa.int64())), 0),
        "fixed elements": (pa.FixedSizeListArray.from_arrays(pa.array([1, None, 3, 4, 5, 6]), 2), 1),
        "nested fixed": (pa.array([[[1, None]], [[2, 3]]], pa.list_(pa.list_(pa.int32(), 2))), 1),
        "bool items": (pa.array([[True, None], [False]], pa.list_(pa.bool_())), 1),
        "struct child": (pa.StructArray.from_arrays([pa.array([1, None, 3])], ["a"]), 2),
        "string view": (pa.array([None, "b", "c"], pa.string_view()), 1),
    }
    for label, (arr, start) in cases.items():
        full = pa.table({"c": arr})
        kept = full.slice(start, 2) if label == "large list items" else full.slice(start)
        np.testing.assert_equal(epoch(kept, with_index=True)["index"], np.arange(kept.num_rows), err_msg=label)
        with pytest.raises(ValueError, match="nulls"):
            fl.Arrow(full)
    # The items below a null row are not looked at (a fixed-size list's nulls there are the norm).
    t = pa.table({"v": pa.array([[1, 2], None, [5, 6]], pa.list_(pa.int64(), 2))})
    got = epoch(fl.Arrow(t, fill_null={"v": 0}))
    np.testing.assert_array_equal(got["v"], [[1, 2], [0, 0], [5, 6]])
    # A null item inside a row that is read is still refused, naming the row.
    with pytest.raises(ValueError, match=r"'l'.*nulls inside its values.*first in row 1"):
        fl.Arrow(pa.table({"l": pa.array([[1], [2, None], [3]])}))
    # Several chunks: the row is counted across them.
    chunked = pa.table({"l": pa.chunked_array([pa.array([[1], [2]]), pa.array([[3], [None]])])})
    with pytest.raises(ValueError, match="first in row 3"):
        fl.Arrow(chunked)


def test_a_dictionary_value_that_is_null_makes_its_rows_null():
    d = pa.DictionaryArray.from_arrays(pa.array([1, 0, 1, 2, 0], pa.int8()), pa.array([None, 5, 7]))
    with pytest.raises(ValueError, match=r"'d' holds nulls \(the first at row 1\)"):
        fl.Arrow(pa.table({"d": d}))
    got = epoch(fl.Arrow(pa.table({"d": d}), fill_null={"d": -1}, with_valid=True))
    np.testing.assert_array_equal(got["d"], [5, -1, 5, 7, -1])
    np.testing.assert_array_equal(got["d_valid"], [1, 0, 1, 1, 0])
    # Rows that do not point at the null value read without a fill.
    np.testing.assert_array_equal(epoch(pa.table({"d": d}).slice(2, 2))["d"], [5, 7])
    s = pa.DictionaryArray.from_arrays(pa.array([0, 1, 1], pa.int32()), pa.array(["a", None]))
    got = epoch(fl.Arrow(pa.table({"s": s}), fill_null={"s": "?"}))
    assert got["s"] == ["a", "?", "?"]


def test_string_fill_values():
    t = pa.table({"label": pa.array(["cat", None, "dog", None]), "blob": pa.array([b"a", None, b"bc", None]),
                  "v": pa.array(["x", None, "y", "z"], pa.string_view())})
    got = epoch(fl.Arrow(t, fill_null={"label": "?", "blob": b"\x00\x01", "v": "missing"}, with_valid=True))
    assert got["label"] == ["cat", "?", "dog", "?"] and got["blob"] == [b"a", b"\x00\x01", b"bc", b"\x00\x01"]
    assert got["v"] == ["x", "missing", "y", "z"]
    np.testing.assert_array_equal(got["label_valid"], [1, 0, 1, 0])
    assert epoch(fl.Arrow(t, fill_null={"label": None, "blob": "", "v": None}))["label"] == ["cat", None, "dog", None]
    padded = epoch(fl.Arrow(t, ["label"], fill_null={"label": "n/a"}, max_length={"label": 2}))
    np.testing.assert_array_equal(padded["label"], [list(b"ca"), list(b"n/"), list(b"do"), list(b"n/")])
    np.testing.assert_array_equal(padded["label_lengths"], [2, 2, 2, 2])
    with pytest.raises(ValueError, match=r"fill_null\['label'\].*give a str"):
        fl.Arrow(t, fill_null={"label": 3, "blob": b"", "v": ""})
    with pytest.raises(ValueError, match=r"fill_null\['blob'\].*give bytes"):
        fl.Arrow(t, fill_null={"label": "", "blob": "text", "v": ""})
    # A list column's fill is the items of the null row.
    lists = pa.table({"l": pa.array([[1, 2], None, [3]])})
    got = epoch(fl.Arrow(lists, fill_null={"l": [7, 7, 7]}, max_length={"l": 2}))
    np.testing.assert_array_equal(got["l"], [[1, 2], [7, 7], [3, 0]])
    np.testing.assert_array_equal(got["l_lengths"], [2, 2, 1])
    with pytest.raises(ValueError, match=r"give \[\]"):
        fl.Arrow(lists, fill_null={"l": 0})


def test_reference_check_over_a_table_of_every_new_layout():
    """The arrow_reference comparison (pyarrow's own take) over views, list views and bool lists."""
    rng = np.random.default_rng(9)
    n = 120
    words = _words(n, 2)
    t = pa.table({
        "id": np.arange(n),
        "sv": pa.array(words, pa.string_view()),
        "bools": pa.array([list(rng.random(k) < 0.5) for k in rng.integers(0, 6, n)], pa.list_(pa.bool_())),
        "tokens": pa.array([list(range(k)) for k in rng.integers(0, 6, n)], pa.list_view(pa.int32())),
        "cat": pa.array([words[i % 7] for i in range(n)], pa.string_view()).dictionary_encode(),
    })
    t = pa.concat_tables([t.slice(0, 50), t.slice(50)])
    # The reference's own layouts (pyarrow's take does not read views), from the same values.
    plain = pa.table({"id": t.column("id"), "sv": pa.array(t.column("sv").to_pylist()),
                      "bools": pa.array(t.column("bools").to_pylist(), pa.list_(pa.bool_())),
                      "tokens": pa.array(t.column("tokens").to_pylist(), pa.list_(pa.int32())),
                      "cat": pa.array(t.column("cat").to_pylist()).dictionary_encode()})
    src = fl.Arrow(t, max_length={"sv": 9})
    total = 0
    for b in fl.Loader(src, batch_size=16, shuffle=True, with_index=True, device="cpu", num_threads=3):
        total += check_batch(b, plain, max_length={"sv": 9})
    assert total == n


def test_hf_metadata_shape_json_is_read_with_none():
    meta = json.dumps({"info": {"features": {"g": {"shape": [None, 2], "dtype": "int8", "_type": "Array2D"}}}})
    t = pa.table({"g": pa.array([[[1, 2]], [[3, 4], [5, 6]]], pa.list_(pa.list_(pa.int8())))})
    got = epoch(t.replace_schema_metadata({"huggingface": meta}))
    np.testing.assert_array_equal(got["g"], [[[1, 2], [0, 0]], [[3, 4], [5, 6]]])
    np.testing.assert_array_equal(got["g_lengths"], [1, 2])
    bad = pa.table({"g": pa.array([[[1, 2]], [[3, 4, 5]]], pa.list_(pa.list_(pa.int8())))})
    with pytest.raises(ValueError, match=r"'g': row 1 does not have the declared shape \(None, 2\)"):
        epoch(bad.replace_schema_metadata({"huggingface": meta}))


def test_parquet_reads_the_same_extension_shapes_and_fills(tmp_path):
    """fl.Parquet plans its columns as fl.Arrow does: a fixed_shape_tensor keeps its shape, a string
    fill is accepted, an extension type it does not read is refused by name."""
    pq = pytest.importorskip("pyarrow.parquet")
    rng = np.random.default_rng(5)
    tensors = rng.integers(0, 9, (50, 2, 3)).astype(np.int32)
    labels = [None if i % 4 == 0 else f"label {i}" for i in range(50)]
    # from_numpy_ndarray sets the identity permutation, which pyarrow's schema.empty_table() cannot
    # build (NotImplementedError in pyarrow 26): fl.Parquet makes its empty tables from storage.
    column = pa.FixedShapeTensorArray.from_numpy_ndarray(tensors)
    assert list(column.type.permutation) == [0, 1]
    t = pa.table({"t": column, "label": labels})
    pq.write_table(t, tmp_path / "t.parquet", row_group_size=16)
    got = epoch(fl.Parquet(tmp_path / "t.parquet", fill_null={"label": "?"}, with_valid=True), with_index=True)
    np.testing.assert_array_equal(got["t"], tensors[got["index"]])
    plain = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.int32(), (2, 3)), column.storage)
    pq.write_table(pa.table({"t": plain}), tmp_path / "plain.parquet", row_group_size=16)
    as_stored = epoch(fl.Parquet(tmp_path / "plain.parquet"), with_index=True)
    np.testing.assert_array_equal(as_stored["t"], tensors[as_stored["index"]])
    permuted = pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.int32(), (2, 3), permutation=[1, 0]),
                                              column.storage)
    pq.write_table(pa.table({"t": permuted}), tmp_path / "permuted.parquet")
    with pytest.raises(ValueError, match=r"'t' is an arrow.fixed_shape_tensor of shape \[2, 3\] with the permutation"):
        fl.Parquet(tmp_path / "permuted.parquet")
    pq.write_table(pa.table({"n": pa.array([], pa.null()), "x": pa.array([], pa.int64())}), tmp_path / "none.parquet")
    with pytest.raises(ValueError, match="hold no rows"):  # said before the null column's type
        fl.Parquet(tmp_path / "none.parquet")
    assert got["label"] == ["?" if labels[i] is None else labels[i] for i in got["index"]]
    np.testing.assert_array_equal(got["label_valid"], [labels[i] is not None for i in got["index"]])
    pq.write_table(pa.table({"e": pa.ExtensionArray.from_storage(pa.bool8(), pa.array([0, 1], pa.int8()))}),
                   tmp_path / "e.parquet")
    with pytest.raises(ValueError, match="Parquet column 'e' is of the extension type 'arrow.bool8'"):
        fl.Parquet(tmp_path / "e.parquet")
