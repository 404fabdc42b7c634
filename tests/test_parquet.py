"""fl.Parquet against a pyarrow reference (the files read whole, then `take` + numpy padding):
files and directories from several writers, row groups as shards decoded on demand, every
loader contract (orders, threads, ranks, resume, Mix, steps), nulls, and rewritten files."""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import fastload as fl

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
from arrow_reference import check_batch  # noqa: E402

LENGTHS = {"tokens": 6, "text": 5}


def make_table(rows: int, seed: int = 0, start: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + rows)
    lens = rng.integers(0, 9, rows)
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "f": pa.array(rng.standard_normal(rows).astype(np.float32)),
        "ok": pa.array(rng.random(rows) < 0.5),
        "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(3 * rows).astype(np.float32)), 3),
        "tokens": pa.array([list(range(k)) for k in lens], pa.list_(pa.int32())),
        "text": pa.array([("ab" * k)[:k] for k in lens]),
        "meta": pa.StructArray.from_arrays([pa.array(ids % 7, pa.int16())], ["k"]),
    })


def write_dir(tmp_path, parts: int = 3, rows: int = 230, row_group_size: int = 40) -> tuple[str, pa.Table]:
    d = tmp_path / "pq"
    d.mkdir()
    tables = []
    for k in range(parts):
        t = make_table(rows + 17 * k, seed=k, start=sum(len(x) for x in tables))
        pq.write_table(t, d / f"part-{k:05d}.snappy.parquet", row_group_size=row_group_size)
        tables.append(t)
    (d / "_SUCCESS").write_bytes(b"")
    (d / ".part-00000.snappy.parquet.crc").write_bytes(b"junk")
    return str(d), pa.concat_tables(tables)


def test_directory_matches_reference_over_orders_and_threads(tmp_path):
    path, table = write_dir(tmp_path)
    src = fl.Parquet(path, max_length=LENGTHS)
    assert len(src.files) == 3 and len(src) == len(table)
    assert sum(src.shard_rows) == len(table) and max(src.shard_rows) == 40
    for threads in (1, 2, 3):
        for order in ("block", "random"):
            loader = fl.Loader(src, batch_size=32, shuffle=True, order=order, seed=threads, num_threads=threads,
                               with_index=True, device="cpu")
            assert sum(check_batch(b, table, max_length=LENGTHS) for b in loader) == len(table)


def test_default_order_is_block_and_decodes_each_group_about_once(tmp_path):
    path, table = write_dir(tmp_path, parts=2, rows=8000, row_group_size=1000)
    groups = len(fl.Parquet(path, ["id"]).shard_rows)
    src = fl.Parquet(path, ["id"], cache_bytes=0)  # the floor only: two windows of 5 groups, 2 per thread
    loader = fl.Loader(src, batch_size=16, shuffle=True, num_threads=1, device="cpu")
    assert loader.config.order == "block"
    ids = np.concatenate([b["id"].numpy() for b in loader])
    assert sorted(ids.tolist()) == list(range(len(table)))
    block_decodes = src.decode_stats()[0]
    assert block_decodes <= 2 * groups
    rnd = fl.Parquet(path, ["id"], cache_bytes=0)
    for _ in fl.Loader(rnd, batch_size=16, shuffle=True, order="random", num_threads=1, device="cpu"):
        pass
    assert rnd.decode_stats()[0] > 3 * block_decodes  # random order over row groups: decoded again and again


def test_ranks_shards_resume_steps(tmp_path):
    path, table = write_dir(tmp_path)
    src = fl.Parquet(path, ["id", "tokens"], max_length={"tokens": 4})
    # Whole row groups per rank.
    starts = np.cumsum([0] + src.shard_rows)
    seen = []
    for rank in range(2):
        loader = fl.Loader(src, batch_size=10, shuffle=True, partition="shards", rank=rank, world_size=2,
                           with_index=True, device="cpu")
        got = np.concatenate([b["index"].numpy() for b in loader])
        groups = set(np.searchsorted(starts, got, side="right") - 1)
        for g in groups:
            assert set(range(starts[g], starts[g + 1])) <= set(got.tolist())
        seen.append(got)
    assert set(seen[0].tolist()).isdisjoint(seen[1].tolist())
    # Resume mid-epoch: the rest is what an uninterrupted run gives, whatever the threads.
    kw = dict(batch_size=16, shuffle=True, seed=5, with_index=True, device="cpu")
    full = [b["index"].tolist() for b in fl.Loader(src, num_threads=1, **kw)]
    loader = fl.Loader(src, num_threads=3, **kw)
    it = iter(loader)
    head = [next(it)["index"].tolist() for _ in range(4)]
    state = loader.state_dict()
    del it
    again = fl.Loader(src, num_threads=2, **kw)
    again.load_state_dict(state)
    rest = []
    for b in again:
        check_batch(b, table, max_length={"tokens": 4})
        rest.append(b["index"].tolist())
    assert head + rest == full
    # steps= across epochs, and a Mix with arrays.
    loader = fl.Loader(src, batch_size=50, steps=40, shuffle=True, with_index=True, device="cpu")
    assert sum(1 for _ in loader) == 40
    mix = fl.Mix({"pq": fl.Parquet(path, ["id"]), "arr": fl.Dataset({"id": np.arange(-100, 0)})}, with_source=True)
    for b in fl.Loader(mix, batch_size=20, shuffle=True, steps=10, device="cpu"):
        ids, which = b["id"].numpy(), b["source"].numpy()
        assert np.all(ids[which == 0] >= 0) and np.all(ids[which == 1] < 0)


def test_writers_pandas_polars_duckdb(tmp_path):
    table = make_table(300).select(["id", "f", "tokens"])
    written = []
    pd = pytest.importorskip("pandas")
    df = table.to_pandas()
    (tmp_path / "pandas").mkdir()
    df.iloc[:150].to_parquet(tmp_path / "pandas" / "part-0.parquet", row_group_size=50, index=False)
    df.iloc[150:].to_parquet(tmp_path / "pandas" / "part-1.parquet", row_group_size=50, index=False)
    written.append(str(tmp_path / "pandas"))
    try:
        import polars as pl
    except ImportError:
        pl = None
    if pl is not None:
        pl.from_arrow(table).write_parquet(tmp_path / "polars.parquet", row_group_size=64)
        written.append(str(tmp_path / "polars.parquet"))
    try:
        import duckdb
    except ImportError:
        duckdb = None
    if duckdb is not None:
        con = duckdb.connect()
        con.register("t", table)
        out = tmp_path / "duck"
        con.execute(f"COPY (SELECT * FROM t ORDER BY id) TO '{out}' (FORMAT PARQUET, PER_THREAD_OUTPUT TRUE, "
                    "ROW_GROUP_SIZE 100)")
        written.append(str(out))
    del pd
    for path in written:
        src = fl.Parquet(path, max_length={"tokens": 8})
        loader = fl.Loader(src, batch_size=25, shuffle=True, with_index=True, device="cpu", num_threads=2)
        ref = pa.concat_tables([pq.read_table(f) for f in src.files])
        ref = ref.select(["id", "f", "tokens"]).cast(table.select(["id", "f", "tokens"]).schema)
        assert sum(check_batch(b, ref, max_length={"tokens": 8}) for b in loader) == 300, path


def test_list_of_files_and_bad_paths(tmp_path):
    path, table = write_dir(tmp_path, parts=2)
    files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.startswith("part-"))
    assert len(fl.Parquet(files[::-1], ["id"])) == len(table)
    with pytest.raises(FileNotFoundError):
        fl.Parquet(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no Parquet files"):
        fl.Parquet(tmp_path / "empty")
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"z": [1.0]}), other)
    with pytest.raises(ValueError, match="another schema"):
        fl.Parquet([files[0], str(other)])
    with pytest.raises(ValueError, match="max_length"):
        fl.Parquet(path)  # a list column's longest row is unknown without decoding
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet at all")
    with pytest.raises(ValueError, match=r"bad.parquet is not a Parquet file \(it does not end with PAR1\)"):
        fl.Parquet(bad)
    tiny = tmp_path / "tiny.parquet"
    tiny.write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"tiny.parquet is not a Parquet file \(4 bytes; the smallest holds 12\)"):
        fl.Parquet(tiny)
    torn = tmp_path / "torn.parquet"
    torn.write_bytes(b"PAR1" + b"\0" * 8 + (10**6).to_bytes(4, "little") + b"PAR1")
    with pytest.raises(ValueError, match=r"torn.parquet is not a readable Parquet file \(a footer of"):
        fl.Parquet(torn)


def test_nulls_refused_and_filled(tmp_path):
    x = pa.array([1, 2, None, 4] * 25, pa.int64())
    lst = pa.array([[1], None, [2, 3], []] * 25, pa.list_(pa.int64()))
    t = pa.table({"x": x, "l": lst, "y": np.arange(100)})
    pq.write_table(t, tmp_path / "n.parquet", row_group_size=30)
    with pytest.raises(ValueError, match=r"'x' holds nulls.*row group 0.*fill_null"):
        fl.Parquet(tmp_path / "n.parquet", ["x"])
    # A list column's nulls are found when its row group is decoded.
    loader = fl.Loader(fl.Parquet(tmp_path / "n.parquet", ["l", "y"], max_length=3), batch_size=10, device="cpu")
    with pytest.raises(Exception, match=r"'l' holds nulls \(the first at row 1"):
        list(loader)
    fill = {"x": -7, "l": []}
    src = fl.Parquet(tmp_path / "n.parquet", ["x", "l", "y"], max_length={"l": 3}, fill_null=fill, with_valid=True)
    total = 0
    for b in fl.Loader(src, batch_size=16, shuffle=True, with_index=True, device="cpu", num_threads=2):
        total += check_batch(b, t, max_length={"l": 3}, fill_null=fill)
    assert total == 100


def test_rewritten_file_refused(tmp_path):
    path, table = write_dir(tmp_path, parts=2)
    loader = fl.Loader(fl.Parquet(path, ["id"]), batch_size=50, device="cpu")
    assert sum(len(b["id"]) for b in loader) == len(table)
    target = os.path.join(path, "part-00001.snappy.parquet")
    pq.write_table(make_table(10), target)
    with pytest.raises(ValueError, match="rewritten"):
        iter(loader)


def test_decode_threads_read_the_order_ahead(tmp_path):
    """The decode threads decode the row groups of the batches to come; the batches are the same
    with or without them, whatever the collation threads, and block order still decodes each
    row group about once."""
    path, table = write_dir(tmp_path, parts=2, rows=3000, row_group_size=100)
    kw = dict(batch_size=32, shuffle=True, seed=3, with_index=True, device="cpu")
    runs = {}
    for ahead in (0, 1, 3):
        for threads in (1, 3):
            src = fl.Parquet(path, ["id", "tokens", "text"], max_length=LENGTHS, decode_threads=ahead)
            assert src.decode_threads == ahead
            got = []
            for b in fl.Loader(src, num_threads=threads, **kw):
                check_batch(b, table, max_length=LENGTHS)
                got.append(b["index"].tolist())
            runs[(ahead, threads)] = got
            decodes, _, ahead_decodes = src.decode_stats()
            groups = len(src.shard_rows)
            assert decodes <= groups + 2 * 8, (ahead, threads, decodes)  # about once per group
            if ahead == 0:
                assert ahead_decodes == 0
            else:
                assert ahead_decodes > 0, (ahead, threads)  # how many depends on the threads' timing
            src.close()
            src.close()  # twice is harmless
    first = runs[(0, 1)]
    assert all(r == first for r in runs.values())
    with pytest.raises(ValueError, match="decode_threads"):
        fl.Parquet(path, ["id"], decode_threads=-1)


def test_decode_threads_read_ahead_inside_a_mix(tmp_path):
    """Inside an fl.Mix a Parquet source reads its view of the mixture's plan (its own rows of
    each batch) ahead: its decode threads decode row groups before the batches need them, and the
    batches are the same with or without them, by epochs and by steps, on 1 or 3 threads."""
    path, table = write_dir(tmp_path, parts=2, rows=1500, row_group_size=50)
    runs = {}
    for ahead in (0, 2):
        for threads in (1, 3):
            for by in ("epochs", "steps"):
                src = fl.Parquet(path, ["id", "tokens"], max_length={"tokens": 6}, decode_threads=ahead)
                mix = fl.Mix({"pq": src, "arr": fl.Dataset({"id": np.arange(-400, 0),
                                                             "tokens": np.zeros((400, 6), np.int32),
                                                             "tokens_lengths": np.zeros(400, np.int64)})},
                             with_source=True)
                kw = dict(steps=60) if by == "steps" else {}
                got = []
                for b in fl.Loader(mix, batch_size=40, shuffle=True, seed=5, num_threads=threads, device="cpu", **kw):
                    ids, which = b["id"].numpy(), b["source"].numpy()
                    mine = ids[which == 0]
                    assert np.all(mine >= 0) and np.all(ids[which == 1] < 0)
                    want = table.take(pa.array(mine))["tokens"].to_pylist()
                    for row, length, tokens in zip(b["tokens"][which == 0].tolist(),
                                                   b["tokens_lengths"][which == 0].tolist(), want):
                        assert length == min(len(tokens), 6) and row[:length] == tokens[:6]
                    got.append((ids.tolist(), which.tolist()))
                runs[(ahead, threads, by)] = got
                decodes, _, ahead_decodes = src.decode_stats()
                if ahead:
                    assert ahead_decodes > 0, (threads, by)  # how many depends on the threads' timing
                else:
                    assert ahead_decodes == 0
                src.close()
    for by in ("epochs", "steps"):
        first = runs[(0, 1, by)]
        assert all(r == first for k, r in runs.items() if k[2] == by), by


def test_decode_threads_stop_with_the_source(tmp_path):
    import gc
    import threading

    path, _ = write_dir(tmp_path, parts=1, rows=500, row_group_size=50)
    before = threading.active_count()
    native_before = len(os.listdir("/proc/self/task"))
    for _ in range(5):
        src = fl.Parquet(path, ["id"], decode_threads=2)
        it = iter(fl.Loader(src, batch_size=10, shuffle=True, device="cpu"))
        next(it)
        del it, src
        gc.collect()
    assert threading.active_count() == before
    # The decode threads went with their sources (a loader's threads may take a moment).
    for _ in range(100):
        if len(os.listdir("/proc/self/task")) <= native_before + 2:
            break
        import time
        time.sleep(0.05)
    assert len(os.listdir("/proc/self/task")) <= native_before + 2


def test_pickle_round_trip_and_spawned_process(tmp_path):
    import multiprocessing
    import pickle

    from arrow_reference import batches_in_child

    path, table = write_dir(tmp_path)
    src = fl.Parquet(path, ["id", "tokens", "text"], max_length=LENGTHS, cache_bytes=1 << 20)
    again = pickle.loads(pickle.dumps(src))
    assert again.files == src.files and again.shard_rows == src.shard_rows and again.names == src.names
    kw = dict(batch_size=32, shuffle=True, seed=2, with_index=True, device="cpu")
    mine = [b["index"].tolist() for b in fl.Loader(src, **kw)]
    total = 0
    for b in fl.Loader(again, **kw):
        total += check_batch(b, table, max_length=LENGTHS)
    assert total == len(table)
    # In a spawned process (as DDP's mp.spawn and spawned workers receive it).
    text_src = fl.Arrow(table.select(["id", "text"]))  # strings as lists, from a pyarrow Table
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        got, got_text = pool.starmap(batches_in_child, [(src, kw), (text_src, kw)])
    assert [b["index"].tolist() for b in got] == mine
    for b in got:
        check_batch({k: torch.from_numpy(v) for k, v in b.items()}, table, max_length=LENGTHS)
    assert sum(len(b["text"]) for b in got_text) == len(table)
    for b in got_text:
        assert b["text"] == table.column("text").take(pa.array(b["index"])).to_pylist()
    # A file rewritten since the source was opened: the copy refuses it.
    blob = pickle.dumps(src)
    pq.write_table(make_table(10), os.path.join(path, "part-00001.snappy.parquet"))
    with pytest.raises(ValueError, match="rewritten"):
        pickle.loads(blob)
