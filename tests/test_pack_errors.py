"""fl.Pack's bad input: each a clear error naming the argument, the column or the document."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload as fl
from test_pack import arrow_source, make_docs

pa = pytest.importorskip("pyarrow")


@pytest.fixture
def source(rng):
    return arrow_source(make_docs(rng, 50, 10))


@pytest.mark.parametrize("length,error,match", [(0, ValueError, "length must be positive, got 0"),
                                                (-3, ValueError, "length must be positive, got -3"),
                                                (2**31, ValueError, "length must be below 2"),
                                                ("8", TypeError, "length must be an integer"),
                                                (True, TypeError, "length must be an integer")])
def test_length(source, length, error, match):
    with pytest.raises(error, match=match):
        fl.Pack(source, length)


def test_options(source):
    with pytest.raises(ValueError, match="max_segments must be at least 1, got 0"):
        fl.Pack(source, 8, max_segments=0)
    with pytest.raises(ValueError, match="window must be positive, got 0"):
        fl.Pack(source, 8, window=0)
    with pytest.raises(ValueError, match=r"split must be one of \('truncate', 'split', 'error'\), got 'cut'"):
        fl.Pack(source, 8, split="cut")
    with pytest.raises(TypeError, match="columns must be a list of column names, got the string 'input_ids'"):
        fl.Pack(source, 8, columns="input_ids")
    with pytest.raises(ValueError, match="columns names 'text', which the source does not read"):
        fl.Pack(source, 8, columns=["input_ids", "text"])
    with pytest.raises(ValueError, match=r"pad names columns \['text'\] that are not packed"):
        fl.Pack(source, 8, pad={"text": 0})
    with pytest.raises(ValueError, match=r"pad\['input_ids'\]=1.5 cannot be stored as int32"):
        fl.Pack(source, 8, pad=1.5)


def test_unequal_lengths_name_the_document():
    ids = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    labels = [[1, 2, 3], [4, 5, 0], [6, 7, 8, 9]]
    with pytest.raises(ValueError, match="document 1: column 'labels' has 3 items and column 'input_ids' 2"):
        fl.Pack(fl.Arrow(pa.table({"input_ids": ids, "labels": labels})), 8)
    ds = fl.Dataset({"a": fl.Ragged.from_rows([np.arange(k) for k in (1, 2, 3)]),
                     "b": fl.Ragged.from_rows([np.arange(k) for k in (1, 2, 4)])})
    with pytest.raises(ValueError, match="document 2: column 'b' has 4 items and column 'a' 3"):
        fl.Pack(ds, 8)


def test_non_list_columns_named(rng):
    docs = make_docs(rng, 20, 5)
    t = pa.table({"input_ids": [d.tolist() for d in docs], "text": ["x"] * 20, "score": np.arange(20.0)})
    with pytest.raises(ValueError, match=r"column 'text' is a string column \(string\), not a list column.*"
                                         r"columns=\['input_ids'\]"):
        fl.Pack(t, 8)
    with pytest.raises(ValueError, match="column 'score' is a float64 column, not a list column"):
        fl.Pack(t, 8, columns=["input_ids", "score"])
    assert fl.Pack(t, 8, columns=["input_ids"]).columns == ["input_ids"]


def test_split_error_names_the_document():
    t = pa.table({"input_ids": [[1] * 5, [2] * 9, [3] * 2]})
    with pytest.raises(ValueError, match="document 1 has 9 tokens, more than length=8 \\(split='error'"):
        fl.Pack(t, 8, split="error")
    fl.Pack(t, 9, split="error")


def test_empty_documents(rng):
    t = pa.table({"input_ids": pa.array([[], []], pa.list_(pa.int32()))})
    with pytest.raises(ValueError, match="every one of the 2 documents is empty: nothing to pack"):
        fl.Pack(t, 8)
    t = pa.table({"input_ids": pa.array([[], [1, 2], []], pa.list_(pa.int32()))})
    pack = fl.Pack(t, 8)
    assert pack.scan["empty_documents"] == 2
    stats = fl.Loader(pack, 1).stats().packing
    assert stats.empty_documents == 2 and stats.rows == 1 and stats.tokens == 2


def test_nulls_refused():
    t = pa.table({"input_ids": pa.array([[1, 2], None, [3]], pa.list_(pa.int32()))})
    with pytest.raises(ValueError, match="column 'input_ids' holds nulls \\(the first at row 1"):
        fl.Pack(t, 8)  # fl.Arrow's own check
    with pytest.raises(ValueError, match="list column 'input_ids' holds nulls \\(the first at row 1\\): a packed "
                                         "document cannot be null"):
        fl.Pack(fl.Arrow(t, fill_null={"input_ids": []}), 8)


def test_sources_it_does_not_pack(source, rng):
    with pytest.raises(TypeError, match="already an fl.Pack"):
        fl.Pack(fl.Pack(source, 8), 8)
    with pytest.raises(TypeError, match="fl.Pack over an fl.Mix is not supported"):
        fl.Pack(fl.Mix([source, source]), 8)
    with pytest.raises(TypeError, match="Mix source '0' is an fl.Pack"):
        fl.Mix([fl.Pack(source, 8), source])
    with pytest.raises(TypeError, match="fl.Pack packs the list columns of fl.Arrow"):
        fl.Pack([np.arange(3)], 8)
    with pytest.raises(TypeError, match="fl.Pack packs the list columns of fl.Arrow"):
        fl.Pack(fl.Windows(np.arange(100, dtype=np.uint16), 8), 8)
    with pytest.raises(ValueError, match="column 'x' has a name fl.Pack gives|'segment_ids' has a name fl.Pack"):
        fl.Pack(pa.table({"segment_ids": [[1, 2]]}), 8)


def test_loader_options_it_refuses(source):
    pack = fl.Pack(source, 8)
    with pytest.raises(ValueError, match="partition='shards' needs a source with shard boundaries"):
        fl.Loader(pack, 4, partition="shards")
    # cu_seqlens is int32: a batch's tokens must count in it (the native sampler's check; a batch
    # that large is refused for memory first on any machine of today).
    with pytest.raises(ValueError, match="batch_size x length must be below 2\\*\\*31"):
        fl._C.PackSampler(fl.Pack(source, 2**20).native_source(), 2**11, 1, 0, 0, True, "random", "pad", False,
                          4096, [], 4, 1)
    with pytest.raises(ValueError, match="apply to Python datasets"):
        fl.Loader(pack, 4, pad={"x": 0})


def test_with_index_documents_part(source):
    pack = fl.Pack(source, 16, max_segments=3)
    b = next(iter(fl.Loader(pack, 4, with_index=True)))
    assert b["documents"].shape == (4, 3) and b["documents"].dtype == torch.int64
    assert b["index"].tolist() == [0, 1, 2, 3]
    assert "documents" not in next(iter(fl.Loader(pack, 4)))


def test_plans_outlive_the_python_objects_they_read():
    """The next epoch is planned ahead on a thread of its own, and a native sampler may outlive the
    Pack: both read the documents' offsets, which the native reader keeps alive (a regression: the
    Python arrays went first, and the thread planning ahead read freed memory)."""
    import gc

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 50, 300_000)
    offsets = np.r_[0, np.cumsum(lengths)]
    pack = fl.Pack(fl.Dataset({"input_ids": fl.Ragged(np.zeros(int(offsets[-1]), np.int32), offsets)}), 64)
    loader = fl.Loader(pack, 4, shuffle=True)
    sampler = loader._schedule.samplers(1)[0]
    next(iter(loader))  # epoch 1 is being planned ahead now
    rows = sampler.rows(0)
    del pack, loader, offsets, lengths
    gc.collect()
    assert sampler.rows(0) == rows and sampler.rows(7) > 0  # plans a new epoch from the kept offsets
    for _ in range(3):  # a source dropped while it plans ahead: the thread stops, nothing is read after
        p = fl.Pack(fl.Dataset({"input_ids": fl.Ragged(np.zeros(3_000_000, np.int32),
                                                       np.r_[0, np.cumsum(np.full(300_000, 10))])}), 64)
        loader = fl.Loader(p, 4, shuffle=True)
        next(iter(loader))
        del p, loader
        gc.collect()
