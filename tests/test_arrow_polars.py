"""Polars DataFrames given to the Loader as they are: Polars exports strings as string_view,
binaries as binary_view, categoricals and enums as dictionaries of views, lists as large_list,
arrays as fixed-size lists. Every dtype a frame of training data holds, with nulls, against the
values the frame was built from."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

import fastload as fl

pl = pytest.importorskip("polars")
pytest.importorskip("pyarrow")
from arrow_reference import epoch as _epoch  # noqa: E402


def epoch(source, **kw) -> dict:
    return _epoch(source, batch_size=9, **kw)



def frame(n: int = 60, seed: int = 0):
    rng = np.random.default_rng(seed)
    words = ["", "a", "twelve bytes", "héllo wörld, long enough", "日本語" * 4]
    data = {
        "i8": rng.integers(-100, 100, n).astype(np.int8), "u32": rng.integers(0, 1 << 31, n).astype(np.uint32),
        "i64": rng.integers(-(1 << 40), 1 << 40, n), "f32": rng.standard_normal(n).astype(np.float32),
        "f64": rng.standard_normal(n), "flag": rng.random(n) < 0.5,
        "text": [words[k] for k in rng.integers(0, len(words), n)],
        "raw": [bytes(rng.integers(0, 256, k).astype(np.uint8)) for k in rng.integers(0, 20, n)],
        "cat": [["cat", "dog", "emu"][k] for k in rng.integers(0, 3, n)],
        "tokens": [rng.integers(0, 1000, k).tolist() for k in rng.integers(0, 8, n)],
        "mask": [(rng.random(k) < 0.5).tolist() for k in rng.integers(0, 8, n)],
        "vec": rng.standard_normal((n, 3)).astype(np.float32),
        "day": [dt.date(2024, 1, 1) + dt.timedelta(days=int(k)) for k in rng.integers(0, 400, n)],
    }
    df = pl.DataFrame({
        **{k: data[k] for k in ("i8", "u32", "i64", "f32", "f64", "flag", "text", "raw", "tokens", "mask", "day")},
        "cat": pl.Series(data["cat"], dtype=pl.Categorical),
        "level": pl.Series(data["cat"], dtype=pl.Enum(["cat", "dog", "emu"])),
        "vec": pl.Series(data["vec"].tolist(), dtype=pl.Array(pl.Float32, 3)),
        "meta": pl.DataFrame({"score": data["f64"], "name": data["text"]}).to_struct(),
    })
    return df, data


def test_a_polars_frame_of_every_common_dtype():
    df, data = frame()
    got = epoch(df, shuffle=True, with_index=True)
    rows = got["index"]
    for name in ("i8", "u32", "i64", "f32", "f64", "flag"):
        assert got[name].dtype == np.asarray(data[name]).dtype, name
        np.testing.assert_array_equal(got[name], np.asarray(data[name])[rows], err_msg=name)
    assert got["text"] == [data["text"][r] for r in rows]
    assert got["raw"] == [data["raw"][r] for r in rows]
    assert got["cat"] == [data["cat"][r] for r in rows] and got["level"] == got["cat"]
    assert got["meta.name"] == got["text"]
    np.testing.assert_array_equal(got["meta.score"], data["f64"][rows])
    np.testing.assert_array_equal(got["vec"], data["vec"][rows])
    days = np.array([(d - dt.date(1970, 1, 1)).days for d in data["day"]], np.int32)
    np.testing.assert_array_equal(got["day"], days[rows])  # date32: days since the epoch
    for name in ("tokens", "mask"):
        longest = max(len(t) for t in data[name])
        assert got[name].shape == (len(rows), longest)
        for i, r in enumerate(rows):
            k = len(data[name][r])
            assert got[name + "_lengths"][i] == k
            np.testing.assert_array_equal(got[name][i, :k], data[name][r])
            assert not got[name][i, k:].any()


def test_polars_strings_padded_and_cut():
    df, data = frame(seed=1)
    got = epoch(fl.Arrow(df, ["text"], max_length={"text": 8}), with_index=True)
    for i, r in enumerate(got["index"]):
        raw = data["text"][r].encode()[:8]
        assert bytes(got["text"][i, :got["text_lengths"][i]]) == raw


def test_polars_nulls_refused_then_filled():
    df = pl.DataFrame({"x": [1, None, 3, 4], "s": ["a", None, "c", None], "l": [[1], None, [2, 3], []],
                       "c": pl.Series(["u", "v", None, "u"], dtype=pl.Categorical), "f": [0.5, 1.5, None, 2.5]})
    with pytest.raises(ValueError, match=r"'x' holds nulls \(the first at row 1\)"):
        fl.Loader(df, batch_size=2)
    fill = {"x": -1, "s": "?", "l": [], "c": "none", "f": float("nan")}
    got = epoch(fl.Arrow(df, fill_null=fill, with_valid=True))
    np.testing.assert_array_equal(got["x"], [1, -1, 3, 4])
    assert got["s"] == ["a", "?", "c", "?"] and got["c"] == ["u", "v", "none", "u"]
    np.testing.assert_array_equal(got["l"], [[1, 0], [0, 0], [2, 3], [0, 0]])
    np.testing.assert_array_equal(got["l_lengths"], [1, 0, 2, 0])
    np.testing.assert_array_equal(got["s_valid"], [1, 0, 1, 0])
    assert np.isnan(got["f"][2])


def test_polars_lazy_and_sliced_frames():
    df, data = frame(n=50, seed=2)
    sliced = df.slice(7, 30)
    got = epoch(sliced.select(["i64", "text", "tokens"]), with_index=True)
    np.testing.assert_array_equal(got["i64"], data["i64"][7:37][got["index"]])
    assert got["text"] == [data["text"][7 + r] for r in got["index"]]
    collected = df.lazy().filter(pl.col("flag")).select(["i64", "text"]).collect()
    kept = np.flatnonzero(data["flag"])
    got = epoch(collected, with_index=True)
    np.testing.assert_array_equal(got["i64"], data["i64"][kept][got["index"]])
    assert got["text"] == [data["text"][k] for k in kept[got["index"]]]


def test_polars_types_fastload_does_not_read_are_refused_by_name():
    df = pl.DataFrame({"d": pl.Series(["1.5"]).cast(pl.Decimal(10, 2)), "words": [["a", "b"]], "ok": [1]})
    with pytest.raises(ValueError, match="'d' of type decimal"):
        fl.Arrow(df)
    with pytest.raises(ValueError, match="'words' of type large_list<string_view>.*lists of strings"):
        fl.Arrow(df, columns=["words"])
    assert fl.Arrow(df, columns=["ok"]).names == ["ok"]


def test_a_lazy_frame_or_a_series_says_what_to_pass():
    df = pl.DataFrame({"a": [1, 2], "s": ["x", "y"]})
    with pytest.raises(TypeError, match=r"Polars LazyFrame.*lf\.collect\(\)"):
        fl.Loader(df.lazy(), batch_size=2)
    with pytest.raises(ValueError, match=r"got string_view: one column or array.*to_frame\(\)"):
        fl.Loader(df["s"], batch_size=2)
    got = epoch(df["s"].to_frame())
    assert got["s"] == ["x", "y"]
