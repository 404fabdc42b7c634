"""fl.Pack against the slow reference packer (tests/pack_reference.py), batch by batch: threads,
ranks, even= modes, split= modes, max_segments, pad per column, labels packed with their input
ids, the packing rule itself; segment_ids / position_ids / cu_seqlens consistent on every batch;
every document exactly once per epoch across ranks."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload as fl
from pack_reference import document_order, epoch_rows, pack_window, reference_epoch

pa = pytest.importorskip("pyarrow")


def make_docs(rng: np.random.Generator, n: int, longest: int = 40, *, empty: float = 0.05,
              long_share: float = 0.0, long: int = 0) -> list[np.ndarray]:
    """Documents of token ids (int32): lengths uniform in [1, longest], some empty, some long."""
    docs = []
    for _ in range(n):
        r = rng.random()
        m = 0 if r < empty else int(rng.integers(longest, long + 1)) if r < empty + long_share else int(rng.integers(1, longest + 1))
        docs.append(rng.integers(1, 30000, m).astype(np.int32))
    return docs


def arrow_source(docs: list[np.ndarray], chunks: int = 3) -> fl.Arrow:
    """input_ids (int32) and labels (int64: the negated ids, so a misaligned label shows)."""
    bounds = np.linspace(0, len(docs), chunks + 1).astype(int)
    batches = [pa.record_batch({"input_ids": pa.array([d.tolist() for d in docs[a:b]], pa.list_(pa.int32())),
                                "labels": pa.array([(-d.astype(np.int64)).tolist() for d in docs[a:b]],
                                                   pa.list_(pa.int64()))})
               for a, b in zip(bounds[:-1], bounds[1:])]
    return fl.Arrow(pa.Table.from_batches(batches))


def columns_of(docs: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
    return {"input_ids": docs, "labels": [-d.astype(np.int64) for d in docs]}


def lengths_of(docs: list[np.ndarray]) -> np.ndarray:
    return np.array([len(d) for d in docs], dtype=np.int64)


def assert_consistent(batch: dict, length: int) -> None:
    """cu_seqlens, segment_ids and position_ids say the same segments (what attention kernels
    read), and max_seqlen is the longest of them."""
    seg, pos, cu = batch["segment_ids"].numpy(), batch["position_ids"].numpy(), batch["cu_seqlens"].numpy()
    rows = seg.shape[0]
    assert cu[0] == 0 and cu[-1] == rows * length and np.all(np.diff(cu) > 0)
    # Boundaries from segment_ids: a new segment where the id changes or a row starts.
    flat = seg.reshape(-1)
    starts = np.flatnonzero(np.r_[True, flat[1:] != flat[:-1]] | (np.arange(flat.size) % length == 0))
    np.testing.assert_array_equal(cu[:-1], starts)
    # position_ids restart at each segment start and count up within it.
    want = np.arange(flat.size) - np.repeat(starts, np.diff(np.r_[starts, flat.size]))
    np.testing.assert_array_equal(pos.reshape(-1), want)
    assert batch["max_seqlen"] == int(np.diff(cu).max())
    assert batch["cu_seqlens"].dtype == torch.int32 and batch["segment_ids"].dtype == torch.int32
    assert batch["position_ids"].dtype == torch.int64


def compare(got: list[dict], want: list[dict], names: list[str]) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        for name in names:
            gv = g[name].numpy() if isinstance(g[name], torch.Tensor) else g[name]
            np.testing.assert_array_equal(gv, w[name], err_msg=f"batch {k}, {name}")


PARTS = ["input_ids", "labels", "segment_ids", "position_ids", "cu_seqlens", "max_seqlen"]


# ---------------------------------------------------------------- the packing rule itself

def test_window_rule_by_hand():
    # Lengths 5, 3, 6, 2, 4 into rows of 8: 6 opens row A (room 2), 5 opens B (room 3), 4 opens C
    # (room 4), 3 goes to B (least room that fits: 3), 2 to A (room 2). Rows in window order of
    # their first segment: B (docs 0, 1), A (2, 3), C (4).
    rows = pack_window([10, 11, 12, 13, 14], [5, 3, 6, 2, 4], 8)
    assert rows == [[(10, 0, 5), (11, 0, 3)], [(12, 0, 6), (13, 0, 2)], [(14, 0, 4)]]
    assert pack_window([1, 2], [3, 3], 8, max_segments=1) == [[(1, 0, 3)], [(2, 0, 3)]]
    assert pack_window([1], [19], 8, split="split") == [[(1, 0, 8)], [(1, 8, 8)], [(1, 16, 3)]]
    assert pack_window([1, 2], [19, 0], 8) == [[(1, 0, 8)]]


@pytest.mark.parametrize("split", ["truncate", "split"])
@pytest.mark.parametrize("max_segments", [None, 1, 3])
def test_rows_match_reference_packer(rng, split, max_segments):
    docs = make_docs(rng, 700, 50, long_share=0.05, long=200)
    pack = fl.Pack(arrow_source(docs), 64, window=97, split=split, max_segments=max_segments)
    sampler = fl._C.PackSampler(pack.native_source(), 1, 1, 0, 7, True, "random", "pad", False, 4096, [], 4, 2)
    order = document_order(len(docs), 7, 3)
    want = epoch_rows(lengths_of(docs), 64, 97, order, split, max_segments)
    assert sampler.rows(3) == len(want)
    for r in range(0, len(want), 7):
        assert [tuple(s) for s in sampler.row_segments(3, r)] == want[r]


def test_every_document_once_per_epoch(rng):
    docs = make_docs(rng, 1000, 60, long_share=0.03, long=300)
    for split in ("truncate", "split"):
        pack = fl.Pack(arrow_source(docs), 64, split=split)
        seen = {}
        for rank in range(3):
            loader = fl.Loader(pack, 5, shuffle=True, seed=4, world_size=3, rank=rank, even="mask", with_index=True,
                               num_threads=2)
            for b in loader:
                for row, valid in zip(b["documents"].numpy(), b["valid"].numpy()):
                    assert valid or np.all(row == -1)
                    for d in row[row >= 0]:
                        seen[int(d)] = seen.get(int(d), 0) + 1
        nonempty = {i for i, d in enumerate(docs) if len(d)}
        assert set(seen) == nonempty
        if split == "truncate":
            assert set(seen.values()) == {1}
        else:  # a split document appears once per piece
            assert all(seen[i] == max(1, -(-len(docs[i]) // 64)) for i in nonempty)


# ---------------------------------------------------------------- batches against the reference

@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_batches_match_reference_by_threads_and_ranks(rng, threads, world_size):
    docs = make_docs(rng, 400, 30)
    pack = fl.Pack(arrow_source(docs), 48, pad={"labels": -100}, window=64)
    for rank in range(world_size):
        loader = fl.Loader(pack, 4, shuffle=True, seed=11, world_size=world_size, rank=rank, num_threads=threads,
                           prefetch=3)
        for epoch in range(2):
            loader.set_epoch(epoch)
            got = list(loader)
            want = reference_epoch(lengths_of(docs), columns_of(docs), length=48, window=64, batch_size=4, seed=11,
                                   epoch=epoch, world_size=world_size, rank=rank, pads={"labels": -100})
            compare(got, want, PARTS)
            for b in got:
                assert_consistent(b, 48)


@pytest.mark.parametrize("even", ["pad", "drop", "mask"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_even_modes_and_drop_last(rng, even, drop_last):
    docs = make_docs(rng, 300, 25)
    pack = fl.Pack(arrow_source(docs), 32, window=50)
    counts = set()
    for rank in range(3):
        loader = fl.Loader(pack, 3, shuffle=True, seed=2, world_size=3, rank=rank, even=even, drop_last=drop_last,
                           with_index=True, num_threads=2)
        batches = len(loader)  # of the epoch the next iter() runs (then of the next one)
        got = list(loader)
        want = reference_epoch(lengths_of(docs), columns_of(docs), length=32, window=50, batch_size=3, seed=2,
                               world_size=3, rank=rank, even=even, drop_last=drop_last)
        compare(got, want, PARTS + ["index", "documents"] + (["valid"] if even == "mask" else []))
        counts.add(len(got))
        assert batches == len(got)
        for b in got:
            assert_consistent(b, 32)
    assert len(counts) == 1  # every rank the same number of batches


@pytest.mark.parametrize("split", ["truncate", "split"])
@pytest.mark.parametrize("max_segments", [None, 2])
def test_split_modes_and_max_segments(rng, split, max_segments):
    docs = make_docs(rng, 250, 30, long_share=0.1, long=150)
    pack = fl.Pack(arrow_source(docs), 40, split=split, max_segments=max_segments, pad=7)
    loader = fl.Loader(pack, 6, shuffle=True, seed=5, num_threads=2, with_index=True)
    got = list(loader)
    want = reference_epoch(lengths_of(docs), columns_of(docs), length=40, window=pack.window, batch_size=6, seed=5,
                           split=split, max_segments=max_segments, pads={"input_ids": 7, "labels": 7})
    compare(got, want, PARTS + ["documents"])
    for b in got:
        assert_consistent(b, 40)
        if max_segments:
            assert b["segment_ids"].max() <= max_segments
            assert b["documents"].shape[1] == max_segments
    stats = loader.stats().packing
    assert stats.rows == len(epoch_rows(lengths_of(docs), 40, pack.window, document_order(len(docs), 5, 0), split,
                                        max_segments))
    assert stats.tokens == sum(min(len(d), 40) if split == "truncate" else len(d) for d in docs)
    assert stats.truncated_tokens == (sum(max(0, len(d) - 40) for d in docs) if split == "truncate" else 0)
    assert stats.empty_documents == sum(len(d) == 0 for d in docs)
    assert stats.efficiency == pytest.approx(stats.tokens / (stats.rows * 40))


def test_labels_packed_with_their_input_ids(rng):
    docs = make_docs(rng, 200, 20)
    pack = fl.Pack(arrow_source(docs), 64, pad={"input_ids": 0, "labels": -100})
    for b in fl.Loader(pack, 8, shuffle=True, num_threads=3):
        ids, labels, seg = b["input_ids"].numpy(), b["labels"].numpy(), b["segment_ids"].numpy()
        np.testing.assert_array_equal(labels[seg > 0], -ids[seg > 0].astype(np.int64))
        assert np.all(labels[seg == 0] == -100) and np.all(ids[seg == 0] == 0)
        assert b["input_ids"].dtype == torch.int32 and b["labels"].dtype == torch.int64


def test_no_shuffle_keeps_document_order(rng):
    docs = make_docs(rng, 120, 10, empty=0)
    pack = fl.Pack(arrow_source(docs), 16, window=1000)
    got = list(fl.Loader(pack, 4, num_threads=2, with_index=True))
    want = reference_epoch(lengths_of(docs), columns_of(docs), length=16, window=1000, batch_size=4, shuffle=False)
    compare(got, want, PARTS + ["documents"])
    firsts = [int(r[0]) for b in got for r in b["documents"].numpy()]
    assert firsts == sorted(firsts)  # rows in the order of their first document


def test_epochs_differ_and_plan_matches_batches(rng):
    docs = make_docs(rng, 500, 40)
    pack = fl.Pack(arrow_source(docs), 64)
    loader = fl.Loader(pack, 4, shuffle=True, seed=3, with_index=True, num_threads=2)
    plans = [loader.plan(e) for e in range(3)]
    for e in range(3):
        loader.set_epoch(e)
        ids = np.concatenate([b["index"].numpy() for b in loader])
        np.testing.assert_array_equal(ids, plans[e])
        assert len(loader) == -(-len(plans[e]) // 4)
    rows = [fl._C.PackSampler(pack.native_source(), 1, 1, 0, 3, True, "random", "pad", False, 4096, [], 4, 1).rows(e)
            for e in range(3)]
    assert all(len(p) == r for p, r in zip(plans, rows))
    firsts = [loader.plan(e)[:4].tolist() for e in range(3)]
    segs = [fl._C.PackSampler(pack.native_source(), 1, 1, 0, 3, True, "random", "pad", False, 4096, [], 4, 1)
            .row_segments(e, 0) for e in range(3)]
    assert segs[0] != segs[1] or segs[1] != segs[2]  # the order of documents changes per epoch
    assert firsts[0] == [0, 1, 2, 3]


def test_packing_efficiency_on_lognormal_lengths():
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, 6000).astype(np.int64), 1, None)
    docs = [np.ones(n, dtype=np.int32) for n in lengths]
    values = np.ones(int(lengths.sum()), dtype=np.int32)
    offsets = np.r_[0, np.cumsum(lengths)]
    pack = fl.Pack(fl.Dataset({"input_ids": fl.Ragged(values, offsets)}), 4096)
    loader = fl.Loader(pack, 8, shuffle=True)
    stats = loader.stats().packing
    assert stats.efficiency > 0.98  # the default window's promise on these lengths (docs/packing.md)
    assert stats.tokens == int(np.minimum(lengths, 4096).sum())
    del docs
