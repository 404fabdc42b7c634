"""fl.Arrow and Arrow data given to the Loader: every type gathered natively against a pyarrow
reference (`take` + numpy padding), for random orders, threads, ranks and resume; Hugging Face
datasets through their indices mappings; nulls refused and filled; unsupported types refused."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import fastload as fl

pa = pytest.importorskip("pyarrow")
from arrow_reference import check_batch, flat_columns  # noqa: E402


def mixed_table(rows: int = 300, chunks: int = 4, seed: int = 0) -> pa.Table:
    """Every supported type, over several chunks of uneven sizes."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, rows), size=chunks - 1, replace=False))
    pieces = []
    for a, b in zip(np.r_[0, cuts], np.r_[cuts, rows]):
        n = int(b - a)
        ids = np.arange(a, b)
        lens = rng.integers(0, 9, n)
        tokens = [list(rng.integers(0, 50_000, k).astype(np.int32)) for k in lens]
        emb = rng.standard_normal((n, 3, 2)).astype(np.float32)
        pieces.append(pa.table({
            "id": pa.array(ids, pa.int64()),
            "u8": pa.array((ids % 251).astype(np.uint8)),
            "i16": pa.array((ids * 7 % 30000 - 15000).astype(np.int16)),
            "f16": pa.array(rng.standard_normal(n).astype(np.float16)),
            "f64": pa.array(rng.standard_normal(n)),
            "flag": pa.array(rng.random(n) < 0.5),
            "flags": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(3 * n) < 0.5), 3),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(4 * n).astype(np.float32)), 4),
            "grid": pa.FixedSizeListArray.from_arrays(
                pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 2), 3),
            "tokens": pa.array(tokens, pa.list_(pa.int32())),
            "big": pa.array([list(range(k)) for k in lens], pa.large_list(pa.int64())),
            "pairs": pa.array([[[i, i + 1] for i in range(k % 4)] for k in lens],
                              pa.list_(pa.list_(pa.int16(), 2))),
            "text": pa.array(["é" * (k % 5) + str(k) for k in lens], pa.string()),
            "blob": pa.array([bytes(range(k)) for k in lens], pa.large_binary()),
            "meta": pa.StructArray.from_arrays([pa.array(ids * 2, pa.int32()),
                                                pa.StructArray.from_arrays([pa.array(ids % 3 == 0)], ["odd"])],
                                               ["score", "deep"]),
            "label": pa.array((ids % 3 * 10).astype(np.int16)).dictionary_encode(),
            "animal": pa.array(np.array(["cat", "dog", "emu"])[ids % 3]).dictionary_encode(),
            "fixed": pa.array([bytes([i % 256] * 3) for i in ids], pa.binary(3)),
            "day": pa.array(ids.astype("datetime64[D]")),
        }))
    return pa.concat_tables(pieces)


TEXT = {"text": 12, "blob": 6, "animal": 3}


def batches(loader):
    return list(iter(loader))


def test_every_type_matches_take_reference_over_random_orders():
    table = mixed_table()
    assert len(table.column("id").chunks) == 4
    src = fl.Arrow(table, max_length=TEXT, pad={"tokens": -1})
    assert src.shard_rows == [len(c) for c in table.column("id").chunks]
    assert "meta.score" in src.names and "meta.deep.odd" in src.names and "tokens_lengths" in src.names
    for threads in (1, 2, 3):
        loader = fl.Loader(src, batch_size=32, shuffle=True, seed=threads, num_threads=threads, with_index=True,
                           device="cpu")
        seen = 0
        for b in loader:
            seen += check_batch(b, table, max_length=TEXT, pad={"tokens": -1})
            assert b["flag"].dtype.is_floating_point is False and str(b["flag"].dtype) == "torch.bool"
            assert tuple(b["grid"].shape[1:]) == (3, 2) and tuple(b["pairs"].shape[2:]) == (2,)
            assert str(b["f16"].dtype) == "torch.float16" and str(b["day"].dtype) == "torch.int32"
        assert seen == len(table)


def test_shapes_and_dtypes():
    table = mixed_table(rows=50, chunks=2)
    b = next(iter(fl.Loader(fl.Arrow(table, max_length=TEXT), batch_size=8, device="cpu")))
    longest = max(len(x) for x in table.column("tokens").to_pylist())
    assert tuple(b["tokens"].shape) == (8, longest) and str(b["tokens"].dtype) == "torch.int32"
    assert str(b["tokens_lengths"].dtype) == "torch.int64"
    assert tuple(b["text"].shape) == (8, 12) and str(b["text"].dtype) == "torch.uint8"
    assert tuple(b["flags"].shape) == (8, 3) and str(b["flags"].dtype) == "torch.bool"
    assert tuple(b["fixed"].shape) == (8, 3)
    assert str(b["label"].dtype) == "torch.int16" and tuple(b["animal"].shape) == (8, 3)


def test_sliced_tables_and_offsets():
    # Slices give arrays with non-zero offsets at every level (record batch, column, list values).
    table = mixed_table(rows=200, chunks=3).slice(17, 150)
    table = pa.concat_tables([table.slice(0, 40), table.slice(40, 0), table.slice(40, 110)])
    loader = fl.Loader(fl.Arrow(table, max_length=TEXT), batch_size=16, shuffle=True, with_index=True,
                       device="cpu", num_threads=2)
    assert sum(check_batch(b, table, max_length=TEXT) for b in loader) == 150


def test_record_batch_and_stream_producers():
    table = mixed_table(rows=64, chunks=1).select(["id", "tokens", "vec"])
    rb = table.to_batches()[0]
    for data in (rb, pa.RecordBatchReader.from_batches(table.schema, table.to_batches())):
        b = next(iter(fl.Loader(data, batch_size=64, with_index=True, device="cpu")))
        check_batch(b, table)


def test_max_length_cuts_and_pads():
    table = mixed_table(rows=80, chunks=2)
    opts = {"max_length": {"tokens": 3, "text": 2, "blob": 1}, "pad": {"tokens": 7}}
    src = fl.Arrow(table, ["tokens", "text", "blob"], **opts)
    for b in fl.Loader(src, batch_size=20, with_index=True, shuffle=True, device="cpu"):
        check_batch(b, table, **opts)
        assert b["tokens_lengths"].max() <= 3


def test_columns_select_and_struct_parent():
    table = mixed_table(rows=30, chunks=2)
    src = fl.Arrow(table, columns=["meta", "id"])
    assert src.names == ["meta.score", "meta.deep.odd", "id"]
    with pytest.raises(ValueError, match="no column 'nope'"):
        fl.Arrow(table, columns=["nope"])


def test_ranks_resume_and_order_match_an_array_source():
    table = mixed_table(rows=257, chunks=5)
    # The reference: arrays with the same shards (an order over shards depends on them).
    starts = np.cumsum([0] + [len(c) for c in table.column("id").chunks])
    ids = [np.arange(a, b) for a, b in zip(starts[:-1], starts[1:])]
    for kw in ({"shuffle": True, "seed": 3}, {"shuffle": True, "order": "block"}, {"shuffle": False}):
        for rank in range(3):
            a = fl.Loader(fl.Arrow(table, ["id", "tokens"]), batch_size=10, rank=rank, world_size=3,
                          with_index=True, device="cpu", num_threads=2, **kw)
            ref = fl.Loader(fl.Dataset({"x": ids}), batch_size=10, rank=rank, world_size=3, with_index=True,
                            device="cpu", **kw)
            got = batches(a)
            want = batches(ref)
            assert [g["index"].tolist() for g in got] == [w["index"].tolist() for w in want]
            for g in got:
                check_batch(g, table)
    # Resume mid-epoch: the rest of the epoch is what an uninterrupted run gives.
    src = fl.Arrow(table, ["id", "tokens"])
    full = [b["index"].tolist() for b in fl.Loader(src, batch_size=16, shuffle=True, seed=9, with_index=True,
                                                    device="cpu")]
    loader = fl.Loader(src, batch_size=16, shuffle=True, seed=9, with_index=True, device="cpu", num_threads=3)
    it = iter(loader)
    head = [next(it)["index"].tolist() for _ in range(5)]
    state = loader.state_dict()
    del it
    resumed = fl.Loader(src, batch_size=16, shuffle=True, seed=9, with_index=True, device="cpu", num_threads=1)
    resumed.load_state_dict(state)
    rest = []
    for b in resumed:
        check_batch(b, table)
        rest.append(b["index"].tolist())
    assert head + rest == full


def test_partition_shards_gives_whole_chunks():
    table = mixed_table(rows=400, chunks=4)
    starts = np.cumsum([0] + [len(c) for c in table.column("id").chunks])
    for rank in range(2):
        loader = fl.Loader(fl.Arrow(table, ["id"]), batch_size=8, shuffle=True, partition="shards", rank=rank,
                           world_size=2, with_index=True, device="cpu")
        got = np.concatenate([b["index"].numpy() for b in loader])
        chunks = set(np.searchsorted(starts, got, side="right") - 1)
        assert len(chunks) <= 3  # whole chunks per rank (balanced by rows)
        for b in loader:
            np.testing.assert_array_equal(b["id"].numpy(), b["index"].numpy())


def test_mix_steps_split_and_stats():
    table = mixed_table(rows=100, chunks=2)
    other = fl.Dataset({"id": np.arange(1000, 1500, dtype=np.int64)})
    mix = fl.Mix({"arrow": fl.Arrow(table, ["id"]), "arr": other}, with_source=True)
    loader = fl.Loader(mix, batch_size=10, shuffle=True, steps=30, device="cpu")
    seen_arrow = 0
    for b in loader:
        src = b["source"].numpy()
        ids = b["id"].numpy()
        assert np.all((ids[src == 0] >= 0) & (ids[src == 0] < 100))
        assert np.all(ids[src == 1] >= 1000)
        seen_arrow += int((src == 0).sum())
    assert seen_arrow > 0 and loader.stats() is not None
    # A pyarrow Table goes into a Mix as it is.
    mix2 = fl.Mix([table.select(["id"]), other])
    assert len(mix2) == 600
    its = fl.Loader(fl.Arrow(table, ["id", "tokens"]), batch_size=10, with_index=True, device="cpu").split(["cpu", "cpu"])
    for it in its:
        for b in it:
            check_batch(b, table)


def test_nulls_refused_naming_column_and_row():
    t = pa.table({"x": pa.array([1, 2, None, 4, None], pa.int64()), "y": pa.array([1, 2, 3, 4, 5])})
    with pytest.raises(ValueError, match=r"'x' holds nulls \(the first at row 2\).*fill_null"):
        fl.Arrow(t)
    with pytest.raises(ValueError, match="row 2"):
        fl.Loader(t, batch_size=2)
    assert fl.Arrow(t, columns=["y"]).names == ["y"]
    # Second chunk: the row is counted across chunks.
    t2 = pa.concat_tables([t.slice(3, 2).select(["y"]), pa.table({"y": pa.array([1, None], pa.int64())})])
    with pytest.raises(ValueError, match="first at row 3"):
        fl.Arrow(t2)
    # A null struct parent makes its fields null.
    s = pa.table({"s": pa.StructArray.from_arrays([pa.array([1, 2, 3])], ["a"], mask=pa.array([False, True, False]))})
    with pytest.raises(ValueError, match=r"'s.a' holds nulls \(the first at row 1\)"):
        fl.Arrow(s)


def test_nulls_filled_with_valid():
    rng = np.random.default_rng(1)
    n = 120
    mask = rng.random(n) < 0.3
    lists = [None if m else list(range(i % 5)) for i, m in enumerate(mask)]
    t = pa.table({
        "x": pa.array(np.arange(n), mask=mask),
        "f": pa.array(rng.random(n).astype(np.float32), mask=mask),
        "b": pa.array(rng.random(n) < 0.5, mask=mask),
        "v": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * n, dtype=np.int16)), 2,
                                               mask=pa.array(mask)),
        "l": pa.array(lists, pa.list_(pa.int64())),
        "s": pa.array([None if m else "ab" * (i % 3) for i, m in enumerate(mask)]),
    })
    t = pa.concat_tables([t.slice(0, 50), t.slice(50)])
    fill = {"x": -1, "f": 0.5, "b": True, "v": 9, "l": [], "s": []}
    src = fl.Arrow(t, fill_null=fill, with_valid=True, max_length={"s": 4})
    assert "x_valid" in src.names and "l_valid" in src.names
    total = 0
    for b in fl.Loader(src, batch_size=16, shuffle=True, with_index=True, device="cpu", num_threads=2):
        total += check_batch(b, t, fill_null=fill, max_length={"s": 4})
        np.testing.assert_array_equal(b["x_valid"].numpy(), ~mask[b["index"].numpy()])
    assert total == n
    with pytest.raises(ValueError, match="cannot be stored as int64"):
        fl.Arrow(t, fill_null={**fill, "x": 1.5}, max_length={"s": 4})
    with pytest.raises(ValueError, match=r"give \[\]"):
        fl.Arrow(t, fill_null={**fill, "l": 0}, max_length={"s": 4})


def test_nested_nulls_and_unsupported_types_refused():
    t = pa.table({"l": pa.array([[1, None], [2]], pa.list_(pa.int32()))})
    with pytest.raises(ValueError, match="'l'.*nulls inside"):
        fl.Arrow(t)
    cases = {
        "m": pa.array([{"a": 1}], pa.map_(pa.string(), pa.int32())),
        "img": pa.array([{"bytes": b"\x89PNG", "path": "a.png"}],
                        pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "d": pa.array([1], pa.decimal128(5, 2)),
        "ll": pa.array([[[1]]], pa.list_(pa.list_(pa.int32()))),
    }
    for name, arr in cases.items():
        with pytest.raises(ValueError, match=f"'{name}'.*columns=") as e:
            fl.Arrow(pa.table({name: arr, "ok": [1]}))
        assert "Python dataset" in str(e.value)
        assert fl.Arrow(pa.table({name: arr, "ok": [1]}), columns=["ok"]).names == ["ok"]


def test_bad_arguments():
    t = pa.table({"x": [1, 2], "l": [[1], [2, 3]], "index": [0, 1]})
    with pytest.raises(ValueError, match="reserves"):
        fl.Arrow(t)
    t = t.drop(["index"])
    with pytest.raises(ValueError, match="max_length names columns \\['zz'\\]"):
        fl.Arrow(t, max_length={"zz": 2})
    with pytest.raises(ValueError, match="not a list"):
        fl.Arrow(t, max_length={"x": 2})
    with pytest.raises(ValueError, match="positive int"):
        fl.Arrow(t, max_length={"l": 0})
    with pytest.raises(ValueError, match="cannot be stored"):
        fl.Arrow(t, pad={"l": 1.5})
    with pytest.raises(TypeError, match="fl.Arrow reads Arrow data"):
        fl.Arrow([1, 2, 3])
    with pytest.raises(ValueError, match="collate_fn"):
        fl.Loader(t, batch_size=2, collate_fn=lambda x: x)
    with pytest.raises(ValueError, match="no rows"):
        fl.Arrow(t.slice(0, 0))


def test_buffers_stay_alive_without_the_producer():
    table = mixed_table(rows=100, chunks=3)
    loader = fl.Loader(fl.Arrow(table.select(["tokens", "id"])), batch_size=25, with_index=True, device="cpu")
    ref = table.select(["tokens", "id"])
    copy = pa.table({n: ref.column(n) for n in ref.column_names})
    del table, ref
    gc.collect()
    for b in loader:
        check_batch(b, copy)


def test_polars_and_duckdb_producers():
    pl = pytest.importorskip("polars")
    df = pl.DataFrame({"a": np.arange(40), "t": [[1] * (i % 4) for i in range(40)]})
    b = next(iter(fl.Loader(df, batch_size=40, with_index=True, device="cpu")))
    np.testing.assert_array_equal(b["a"].numpy(), np.arange(40))
    np.testing.assert_array_equal(b["t_lengths"].numpy(), np.arange(40) % 4)


# ----------------------------------------------------------------- Hugging Face datasets

def hf_dataset(tmp_path, rows: int = 500):
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 20, rows)
    ds = datasets.Dataset.from_dict({
        "input_ids": [list(rng.integers(0, 50_000, k).astype(np.int32)) for k in lens],
        "label": list(range(rows)),
        "emb": [rng.standard_normal(4).astype(np.float32) for _ in range(rows)],
    }, features=datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("int32")),
        "label": datasets.ClassLabel(num_classes=rows),
        "emb": datasets.Sequence(datasets.Value("float32"), length=4),
    }))
    path = tmp_path / "ds"
    ds.save_to_disk(str(path))
    return datasets.load_from_disk(str(path))


def test_hf_dataset_direct_and_through_indices(tmp_path):
    ds = hf_dataset(tmp_path)
    table = ds.data.table
    loader = fl.Loader(ds, batch_size=32, shuffle=True, with_index=True, device="cpu", num_threads=2)
    assert set(loader.dataset.names) == {"input_ids", "input_ids_lengths", "label", "emb"}
    assert sum(check_batch(b, table) for b in loader) == len(ds)
    for view in (ds.select([5, 3, 3, 499, 0, 17] * 10), ds.shuffle(seed=1), ds.shuffle(seed=2).select(range(100)),
                 ds.with_format("torch").shuffle(seed=3)):
        mapping = view._indices.column("indices").to_numpy()
        assert len(fl.Arrow(view)) == len(view) == len(mapping)
        total = 0
        for b in fl.Loader(view, batch_size=16, shuffle=True, with_index=True, device="cpu", num_threads=3):
            total += check_batch(b, table, row_of=mapping)
            # The same rows HF itself gives (its own formatting).
            first = int(b["index"][0])
            assert b["label"][0].item() == view.with_format(None)[first]["label"]
        assert total == len(view)


def test_hf_dataset_rewritten_file_refused(tmp_path):
    ds = hf_dataset(tmp_path, rows=50)
    loader = fl.Loader(ds, batch_size=10, device="cpu")
    assert len(batches(loader)) == 5
    arrow_file = ds.cache_files[0]["filename"]
    st = os.stat(arrow_file)
    os.utime(arrow_file, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    with pytest.raises(ValueError, match="rewritten"):
        iter(loader)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_hf_open_reads_nothing_but_the_schema(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows, width = 100_000, 64  # 26 MB of tokens, memory-mapped
    values = pa.array(np.arange(rows * width, dtype=np.int32))
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    table = pa.table({"input_ids": pa.ListArray.from_arrays(offsets, values), "label": np.arange(rows)})
    datasets.Dataset(table).save_to_disk(str(tmp_path / "big"), max_shard_size="10MB")
    del table, values, offsets
    gc.collect()
    ds = datasets.load_from_disk(str(tmp_path / "big"))
    before = _rss()
    src = fl.Arrow(ds, max_length={"input_ids": 8})  # max_length given: not even the offsets are read
    grown = _rss() - before
    assert len(src) == rows and src.shard_rows == [len(c) for c in ds.data.table.column("label").chunks]
    assert grown < 4 << 20, f"opening grew RSS by {grown >> 20} MiB"
    b = next(iter(fl.Loader(src, batch_size=4, with_index=True, device="cpu")))
    np.testing.assert_array_equal(b["input_ids"][:, 0].numpy(), np.arange(4) * width)


def test_quick_start_in_docs_runs(tmp_path, monkeypatch):
    """The quick start of docs/arrow.md, as written there."""
    pytest.importorskip("datasets")
    with open(os.path.join(os.path.dirname(__file__), "..", "docs", "arrow.md")) as f:
        text = f.read()
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    scope: dict = {"__name__": "quickstart"}
    exec(compile(code, "docs/arrow.md", "exec"), scope)
    assert scope["steps"] == 400 // 16


def test_strings_as_lists_of_values():
    rng = np.random.default_rng(3)
    n = 200
    mask = rng.random(n) < 0.2
    words = ["", "a", "héllo", "日本語", "x" * 40]
    t = pa.table({
        "id": np.arange(n),
        "s": pa.array([words[i % 5] for i in range(n)], pa.string()),
        "ls": pa.array([words[(i * 3) % 5] for i in range(n)], pa.large_string()),
        "b": pa.array([bytes([i % 256]) * (i % 4) for i in range(n)], pa.binary()),
        "cat": pa.array([words[i % 3] for i in range(n)]).dictionary_encode(),
        "maybe": pa.array([None if m else words[i % 5] for i, m in enumerate(mask)]),
    })
    t = pa.concat_tables([t.slice(0, 70), t.slice(70)])
    src = fl.Arrow(t, fill_null={"maybe": None}, with_valid=True, max_length={"ls": 8})
    assert src.string_lists == ["s", "b", "cat", "maybe"]
    assert "s_lengths" not in src.names and "ls_lengths" in src.names
    total = 0
    for threads in (1, 3):
        for b in fl.Loader(src, batch_size=32, shuffle=True, seed=threads, num_threads=threads, with_index=True,
                           device="cpu"):
            assert isinstance(b["s"], list) and isinstance(b["b"][0], bytes)
            total += check_batch(b, t, max_length={"ls": 8})
    assert total == 2 * n
    with pytest.raises(ValueError, match="gives string columns \\[\\] as lists.*gives \\['s'\\]"):
        fl.Mix([fl.Arrow(t, ["id", "s"]), fl.Dataset({"id": np.arange(5)})])


def test_mix_of_sources_with_strings_as_lists(tmp_path):
    """A Mix carries each batch's string lists: every source's rows' values, in the batch's row order."""
    pq = pytest.importorskip("pyarrow.parquet")
    words = ["", "a", "héllo", "日本語", "x" * 40]
    a = pa.table({"id": np.arange(120), "s": [words[i % 5] * (i % 3) for i in range(120)],
                  "b": pa.array([bytes([i % 256]) * (i % 4) for i in range(120)], pa.binary())})
    b = pa.table({"id": np.arange(1000, 1090), "s": pa.array([f"row {i}" for i in range(90)]).dictionary_encode(),
                  "b": pa.array([b"z" * (i % 5) for i in range(90)], pa.binary())})
    pq.write_table(b, tmp_path / "b.parquet", row_group_size=16)
    tables = [a, b.cast(pa.schema([("id", pa.int64()), ("s", pa.string()), ("b", pa.binary())]))]
    for second in (fl.Arrow(b), fl.Parquet(tmp_path / "b.parquet")):
        mix = fl.Mix({"a": fl.Arrow(a), "b": second}, with_source=True)
        seen = 0
        for threads in (1, 2):
            for batch in fl.Loader(mix, batch_size=32, shuffle=True, seed=threads, num_threads=threads,
                                   with_index=True, device="cpu"):
                which, index = batch["source"].numpy(), batch["index"].numpy()
                local = np.where(which == 0, index, index - len(a))
                assert isinstance(batch["s"], list) and len(batch["s"]) == len(index)
                for col in ("s", "b"):
                    want = [tables[w].column(col)[int(i)].as_py() for w, i in zip(which, local)]
                    assert batch[col] == want, col
                np.testing.assert_array_equal(batch["id"].numpy(),
                                              [tables[w].column("id")[int(i)].as_py() for w, i in zip(which, local)])
                seen += len(index)
        assert seen >= 2 * (len(a) + len(b))  # an epoch of the Mix, in whole batches
        steps = fl.Loader(mix, batch_size=16, steps=12, shuffle=True, device="cpu")
        assert all(len(x["s"]) == len(x["id"]) for x in steps)


class _Unpicklable:
    """An Arrow producer that does not pickle (a stream's reader and a lambda in it)."""

    def __init__(self, table):
        self.table, self.hook = table, lambda: None

    def __arrow_c_stream__(self, requested_schema=None):
        return self.table.__arrow_c_stream__(requested_schema)


def test_arrow_pickles_through_its_producer(tmp_path):
    import pickle

    t = mixed_table(rows=150, chunks=3)
    lengths = {"tokens": 6, "text": 6}
    src = fl.Arrow(t, ["id", "vec", "tokens", "text", "animal"], max_length=lengths)
    again = pickle.loads(pickle.dumps(src))
    assert again.names == src.names and again.string_lists == ["animal"] and len(again) == len(src)
    total = sum(check_batch(b, t, max_length=lengths) for b in fl.Loader(again, batch_size=32, shuffle=True,
                                                                          with_index=True, device="cpu"))
    assert total == len(t)
    ds = hf_dataset(tmp_path).shuffle(seed=1).select(range(0, 400, 2))
    hf = pickle.loads(pickle.dumps(fl.Arrow(ds, max_length={"input_ids": 5})))
    mapping = ds._indices.column("indices").to_numpy()
    total = sum(check_batch(b, ds.data.table, row_of=mapping, max_length={"input_ids": 5})
                for b in fl.Loader(hf, batch_size=16, shuffle=True, with_index=True, device="cpu"))
    assert total == len(ds)
    with pytest.raises(TypeError, match="_Unpicklable.*cannot be pickled"):
        pickle.dumps(fl.Arrow(_Unpicklable(t), ["id"]))


def test_parquet_strings_as_lists(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    t = pa.table({"id": np.arange(100), "s": [f"row {i} " * (i % 4) for i in range(100)]})
    pq.write_table(t, tmp_path / "s.parquet", row_group_size=16)
    src = fl.Parquet(tmp_path / "s.parquet")
    assert sum(check_batch(b, t) for b in fl.Loader(src, batch_size=10, shuffle=True, with_index=True,
                                                    device="cpu", num_threads=2)) == 100


def test_even_modes_over_ranks():
    table = mixed_table(rows=101, chunks=3)
    for even in ("pad", "drop", "mask"):
        seen = []
        for rank in range(4):
            loader = fl.Loader(fl.Arrow(table, ["id"]), batch_size=8, shuffle=True, rank=rank, world_size=4,
                               even=even, with_index=True, device="cpu")
            lens = []
            for b in loader:
                np.testing.assert_array_equal(b["id"].numpy(), b["index"].numpy())
                keep = b["valid"].numpy() if even == "mask" else np.ones(len(b["id"]), bool)
                seen += b["id"].numpy()[keep].tolist()
                lens.append(len(b["id"]))
            assert len(lens) == len(loader)
        if even == "drop":
            assert len(set(seen)) == len(seen) == 100
        else:
            assert set(seen) == set(range(101))
