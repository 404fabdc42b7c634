"""fl.Pack over each kind of source it reads, against the reference packer: fl.Dataset with fl.Ragged
columns (shards, item shapes), dataset directories (mapped eagerly and lazily), fl.Parquet (row
groups decoded; order="block" over them by default), Hugging Face datasets (through their
indices mapping after select/shuffle), and list columns of vectors."""
from __future__ import annotations

import numpy as np
import pytest

import fastload as fl
from fastload._columns import mapping as _mapping
from pack_reference import reference_epoch
from test_pack import PARTS, assert_consistent, columns_of, compare, lengths_of, make_docs

pa = pytest.importorskip("pyarrow")


def ragged(docs, dtype=None, shards=1):
    """A ragged column of these documents (as `shards` shards)."""
    arrays = [np.asarray(d if dtype is None else d.astype(dtype)) for d in docs]
    if shards == 1:
        return fl.Ragged.from_rows(arrays)
    cuts = np.linspace(0, len(arrays), shards + 1).astype(int)
    values, offsets = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        part = arrays[a:b]
        values.append(np.concatenate(part) if part else np.empty(0, arrays[0].dtype))
        offsets.append(np.r_[0, np.cumsum([len(p) for p in part])].astype(np.int64))
    return fl.Ragged(values, offsets)


@pytest.mark.parametrize("shards", [1, 4])
def test_dataset_with_ragged_columns(rng, shards):
    docs = make_docs(rng, 300, 30)
    ds = fl.Dataset({"input_ids": ragged(docs, shards=shards),
                     "labels": ragged([-d.astype(np.int64) for d in docs], shards=shards)})
    pack = fl.Pack(ds, 32, pad={"labels": -100}, window=40)
    for rank in range(2):
        got = list(fl.Loader(pack, 3, shuffle=True, seed=8, world_size=2, rank=rank, num_threads=2))
        want = reference_epoch(lengths_of(docs), columns_of(docs), length=32, window=40, batch_size=3, seed=8,
                               world_size=2, rank=rank, pads={"labels": -100})
        compare(got, want, PARTS)


def test_columns_picks_the_lists_and_drops_the_rest(rng):
    docs = make_docs(rng, 100, 20)
    ds = fl.Dataset({"input_ids": ragged(docs), "score": np.arange(100, dtype=np.float32),
                     "labels": ragged([-d.astype(np.int64) for d in docs])})
    with pytest.raises(ValueError, match="column 'score' is a column of fixed-size rows, not a list column.*"
                                         r"columns=\['input_ids', 'labels'\]"):
        fl.Pack(ds, 32)
    pack = fl.Pack(ds, 32, columns=["input_ids"])
    b = next(iter(fl.Loader(pack, 4)))
    assert set(b) == {"input_ids", "segment_ids", "position_ids", "cu_seqlens", "max_seqlen"}


def test_token_vectors_keep_their_item_shape(rng):
    docs = make_docs(rng, 80, 12)
    vecs = [np.stack([d, d * 2], axis=1).astype(np.float32) for d in docs]  # (tokens, 2) per document
    ds = fl.Dataset({"emb": fl.Ragged.from_rows(vecs)})
    pack = fl.Pack(ds, 16, pad=-1.5)
    got = list(fl.Loader(pack, 4, shuffle=True, seed=1))
    want = reference_epoch(lengths_of(docs), {"emb": vecs}, length=16, window=pack.window, batch_size=4, seed=1,
                           pads={"emb": -1.5})
    compare(got, want, ["emb", "segment_ids", "position_ids", "cu_seqlens"])
    assert got[0]["emb"].shape == (4, 16, 2)


@pytest.mark.parametrize("lazy", [False, True])
def test_dataset_directory_with_ragged_columns(rng, tmp_path, lazy):
    docs = make_docs(rng, 240, 25)
    fl.write_dataset(tmp_path / "d", {"input_ids": docs, "labels": [-d.astype(np.int64) for d in docs]},
                     rows_per_shard=20, fsync=False, checksum=False)
    budget = 6 if lazy else 10_000
    with _mapping.mapping_budget(budget):
        ds = fl.Dataset.open(tmp_path / "d")
        pack = fl.Pack(ds, 32, window=50)
        assert (type(ds._maps).__name__ == "_LazyShards") == lazy  # 12 shards x 4 files: past a budget of 6
        for threads in (1, 3):
            got = list(fl.Loader(pack, 4, shuffle=True, seed=3, num_threads=threads))
            want = reference_epoch(lengths_of(docs), columns_of(docs), length=32, window=50, batch_size=4, seed=3)
            compare(got, want, PARTS)


def write_parquet(path, docs, rows_per_group):
    import pyarrow.parquet as pq

    table = pa.table({"input_ids": pa.array([d.tolist() for d in docs], pa.list_(pa.int32())),
                      "labels": pa.array([(-d.astype(np.int64)).tolist() for d in docs], pa.list_(pa.int64())),
                      "source": pa.array(["web"] * len(docs))})
    pq.write_table(table, path, row_group_size=rows_per_group)


@pytest.mark.parametrize("order", ["block", "random"])
def test_parquet_row_groups(rng, tmp_path, order):
    docs = make_docs(rng, 400, 30)
    write_parquet(tmp_path / "a.parquet", docs, 50)
    source = fl.Parquet(tmp_path / "a.parquet", columns=["input_ids", "labels"], max_length=32, cache_bytes=1 << 16)
    pack = fl.Pack(source, 32, window=60)
    assert pack.default_order == "block"
    loader = fl.Loader(pack, 4, shuffle=True, seed=2, num_threads=2, order=order)
    got = list(loader)
    want = reference_epoch(lengths_of(docs), columns_of(docs), length=32, window=60, batch_size=4, seed=2,
                           order=order, shard_rows=[50] * 8)
    compare(got, want, PARTS)
    for b in got:
        assert_consistent(b, 32)


def test_parquet_non_list_column_refused_unless_dropped(rng, tmp_path):
    docs = make_docs(rng, 50, 10)
    write_parquet(tmp_path / "a.parquet", docs, 20)
    with pytest.raises(ValueError, match="column 'source' is a string column"):
        fl.Pack(fl.Parquet(tmp_path / "a.parquet", max_length=8), 16)
    pack = fl.Pack(fl.Parquet(tmp_path / "a.parquet", max_length=8), 16, columns=["input_ids", "labels"])
    assert sum(int((b["segment_ids"] > 0).sum()) for b in fl.Loader(pack, 4)) == sum(min(len(d), 16) for d in docs)


def hf_dataset(docs):
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset.from_dict(
        {"input_ids": [d.tolist() for d in docs], "labels": [(-d.astype(np.int64)).tolist() for d in docs]},
        features=datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int32")),
                                    "labels": datasets.Sequence(datasets.Value("int64"))}))


def test_hugging_face_dataset_and_its_indices_mapping(rng):
    docs = make_docs(rng, 300, 30)
    ds = hf_dataset(docs)
    pack = fl.Pack(ds, 32, pad={"labels": -100})  # wrapped in fl.Arrow
    got = list(fl.Loader(pack, 4, shuffle=True, seed=5, num_threads=2))
    compare(got, reference_epoch(lengths_of(docs), columns_of(docs), length=32, window=pack.window, batch_size=4,
                                 seed=5, pads={"labels": -100}), PARTS)
    picked = ds.shuffle(seed=1).select(range(0, 300, 2))  # an indices mapping
    mapped = [docs[i] for i in picked._indices.column(0).to_pylist()]
    pack = fl.Pack(fl.Arrow(picked), 32)
    got = list(fl.Loader(pack, 4, shuffle=True, seed=5, num_threads=2, with_index=True))
    compare(got, reference_epoch(lengths_of(mapped), columns_of(mapped), length=32, window=pack.window, batch_size=4,
                                 seed=5), PARTS)


def test_list_of_vectors_column(rng):
    docs = make_docs(rng, 60, 10, empty=0)
    vec = [np.stack([d, -d], axis=1).astype(np.float32) for d in docs]
    t = pa.table({"v": pa.array([v.tolist() for v in vec], pa.list_(pa.list_(pa.float32(), 2)))})
    pack = fl.Pack(fl.Arrow(t), 20)
    got = list(fl.Loader(pack, 3, shuffle=True))
    want = reference_epoch(lengths_of(docs), {"v": vec}, length=20, window=pack.window, batch_size=3, seed=0)
    compare(got, want, ["v", "segment_ids", "cu_seqlens"])
    assert got[0]["v"].shape == (3, 20, 2)


def test_arrow_list_views_and_large_lists_pack_like_lists(rng):
    docs = make_docs(rng, 90, 12, empty=0)
    lists = pa.array([d.tolist() for d in docs], pa.list_(pa.int32()))
    want = reference_epoch(lengths_of(docs), {"input_ids": docs}, length=16, window=30, batch_size=3, seed=4)
    for column in (lists, lists.cast(pa.large_list(pa.int32())), pa.ListViewArray.from_arrays(
            lists.offsets[:-1], pa.array(lengths_of(docs), pa.int32()), lists.values)):
        got = list(fl.Loader(fl.Pack(fl.Arrow(pa.table({"input_ids": column})), 16, window=30), 3, shuffle=True, seed=4))
        compare(got, want, ["input_ids", "segment_ids", "cu_seqlens"])


@pytest.mark.parametrize("column", [pa.array([[[1, 2], [3]], [[4]]], pa.list_(pa.list_(pa.int32()))),
                                    pa.array([[True, False], [True]], pa.list_(pa.bool_()))])
def test_lists_of_lists_and_of_booleans_are_not_tokens(column):
    with pytest.raises(ValueError, match=r"column 'x' of type list<(list<int32>|bool)>"):
        fl.Pack(fl.Arrow(pa.table({"x": column})), 8)
