"""fl.Pack's resume and steps=: exact mid-epoch resume, across world sizes (elastic: the same global
steps, or the same stream of rows at another global batch), states that belong to another
packing refused, and steps= over the endless stream of packed rows (epoch 0's rows, then 1's)."""
from __future__ import annotations

import numpy as np
import pytest

import fastload as fl
from pack_reference import build_batch, document_order, epoch_rows, reference_epoch
from test_pack import PARTS, arrow_source, columns_of, compare, lengths_of, make_docs

pa = pytest.importorskip("pyarrow")


@pytest.fixture
def docs(rng):
    return make_docs(rng, 500, 40, long_share=0.05, long=120)


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


@pytest.mark.parametrize("threads", [1, 3])
def test_mid_epoch_resume_is_exact(docs, threads):
    pack = fl.Pack(arrow_source(docs), 48, split="split")
    loader = fl.Loader(pack, 4, shuffle=True, seed=9, num_threads=threads, prefetch=4)
    loader.set_epoch(2)
    first = take(loader, 5)
    state = loader.state_dict()
    assert state["epoch"] == 2 and state["position"] == 20 and state["packing"]["length"] == 48
    again = fl.Loader(fl.Pack(arrow_source(docs), 48, split="split"), 4, shuffle=True, seed=9, num_threads=threads)
    again.load_state_dict(state)
    rest = list(again)
    want = reference_epoch(lengths_of(docs), columns_of(docs), length=48, window=pack.window, batch_size=4, seed=9,
                           epoch=2, split="split")
    compare(first + rest, want, PARTS)
    # The next iter() runs epoch 3 from its start.
    want3 = reference_epoch(lengths_of(docs), columns_of(docs), length=48, window=pack.window, batch_size=4, seed=9,
                            epoch=3, split="split")
    compare(list(again), want3, PARTS)


@pytest.mark.parametrize("saved,resumed", [((2, 3), (3, 2)), ((2, 3), (1, 6)), ((3, 2), (2, 5))])
def test_elastic_resume_across_world_sizes(docs, saved, resumed):
    """Saved at world W (batch B), resumed at W' (batch B'): the rows after the saved position
    are dealt to the new ranks; every row of the epoch is seen exactly once."""
    (w, b), (w2, b2) = saved, resumed
    pack = fl.Pack(arrow_source(docs), 40)
    seen = []
    states = []
    for rank in range(w):
        loader = fl.Loader(pack, b, shuffle=True, seed=1, world_size=w, rank=rank, with_index=True, num_threads=2)
        for batch in take(loader, 3):
            seen += batch["index"].tolist()
        states.append(loader.state_dict())
    assert len({s["position"] for s in states}) == 1
    position = states[0]["position"]
    rows = len(epoch_rows(lengths_of(docs), 40, pack.window, document_order(len(docs), 1, 0)))
    for rank in range(w2):
        loader = fl.Loader(pack, b2, shuffle=True, seed=1, world_size=w2, rank=rank, with_index=True, num_threads=2)
        loader.load_state_dict(states[0])
        got = list(loader)
        want = reference_epoch(lengths_of(docs), columns_of(docs), length=40, window=pack.window, batch_size=b2,
                               seed=1, world_size=w2, rank=rank, start=position)
        compare(got, want, PARTS + ["index"])
        seen += [i for batch in got for i in batch["index"].tolist()]
    real = [i for i in seen if i < rows]
    assert sorted(real) == list(range(rows))  # each row once; the rest are empty padding rows


def test_states_of_another_packing_are_refused(docs):
    loader = fl.Loader(fl.Pack(arrow_source(docs), 48), 4, shuffle=True)
    take(loader, 2)
    state = loader.state_dict()
    other = fl.Loader(fl.Pack(arrow_source(docs), 32), 4, shuffle=True)
    with pytest.raises(ValueError, match="other packing.*length: 48 there, 32 here"):
        other.load_state_dict(state)
    plain = fl.Loader(arrow_source(docs), 4, shuffle=True)
    with pytest.raises(ValueError, match="fl.Pack's packed rows"):
        plain.load_state_dict(state)
    with pytest.raises(ValueError, match="unpacked samples"):
        loader.load_state_dict(plain.state_dict())
    stepped = fl.Loader(fl.Pack(arrow_source(docs), 48), 4, shuffle=True, steps=10)
    with pytest.raises(ValueError, match="steps= over fl.Pack"):
        stepped.load_state_dict(state)
    with pytest.raises(ValueError, match="steps= over fl.Pack"):
        loader.load_state_dict(stepped.state_dict())


def test_untouched_iterator_reruns_its_epoch(docs):
    loader = fl.Loader(fl.Pack(arrow_source(docs), 48), 4, shuffle=True, seed=2)
    iter(loader)  # Lightning makes one before training
    got = list(loader)
    want = reference_epoch(lengths_of(docs), columns_of(docs), length=48, window=loader.dataset.window, batch_size=4,
                           seed=2, epoch=0)
    compare(got, want, PARTS)


# ---------------------------------------------------------------- steps=

def stream_batches(docs, pack, *, steps, batch_size, world_size, rank, seed, first=0):
    """Steps [first, steps) of the stream of packed rows (epoch after epoch) for one rank."""
    lengths = lengths_of(docs)
    rows: list = []
    epoch = 0
    g = batch_size * world_size
    while len(rows) < steps * g:
        rows += epoch_rows(lengths, pack.length, pack.window, document_order(len(docs), seed, epoch), pack.split,
                           pack.max_segments)
        epoch += 1
    out = []
    for s in range(first, steps):
        lo = s * g + rank * batch_size
        out.append(build_batch(rows[lo:lo + batch_size], columns_of(docs), pack.length, {}))
    return out


def test_steps_run_across_epochs(docs):
    pack = fl.Pack(arrow_source(docs), 40)
    rows0 = len(epoch_rows(lengths_of(docs), 40, pack.window, document_order(len(docs), 4, 0)))
    steps = rows0 // 6 + 20  # past the end of epoch 0
    for rank in range(2):
        loader = fl.Loader(pack, 3, shuffle=True, seed=4, world_size=2, rank=rank, steps=steps, num_threads=2)
        assert len(loader) == steps
        got = list(loader)
        compare(got, stream_batches(docs, pack, steps=steps, batch_size=3, world_size=2, rank=rank, seed=4), PARTS)
        assert list(loader) == []  # the run is over
        # Row ids in steps= are stream positions: step s, rank r holds [6s + 3r, 6s + 3r + 3).
        want = np.concatenate([np.arange(s * 6 + rank * 3, s * 6 + rank * 3 + 3) for s in (2, 3)])
        np.testing.assert_array_equal(loader.plan(steps=(2, 4)), want)


@pytest.mark.parametrize("resumed", [(2, 3), (3, 2), (1, 4)])
def test_steps_resume_same_and_other_global_batch(docs, resumed):
    pack = fl.Pack(arrow_source(docs), 40)
    rows0 = len(epoch_rows(lengths_of(docs), 40, pack.window, document_order(len(docs), 6, 0)))
    steps = rows0 // 6 + 10
    loader = fl.Loader(pack, 3, shuffle=True, seed=6, world_size=2, rank=0, steps=steps, num_threads=2)
    taken = rows0 // 6 - 2  # stop just before epoch 0's end
    take(loader, taken)
    state = loader.state_dict()
    assert state["step"] == taken and state["position"] == taken * 6 and state["epoch"] == 0
    w2, b2 = resumed
    seen = []
    for rank in range(w2):
        again = fl.Loader(fl.Pack(arrow_source(docs), 40), b2, shuffle=True, seed=6, world_size=w2, rank=rank,
                          steps=steps, num_threads=2, with_index=True)
        again.load_state_dict(state)
        got = list(again)
        assert len(got) == steps - taken
        seen += [i for b in got for i in b["index"].tolist()]
        # The stream continues at the saved position whatever the new global batch.
        lengths = lengths_of(docs)
        rows = epoch_rows(lengths, 40, pack.window, document_order(len(docs), 6, 0))
        rows += epoch_rows(lengths, 40, pack.window, document_order(len(docs), 6, 1))
        g2 = w2 * b2
        want = [build_batch(rows[taken * 6 + k * g2 + rank * b2: taken * 6 + k * g2 + rank * b2 + b2],
                            columns_of(docs), 40, {}) for k in range(steps - taken)]
        compare(got, want, PARTS)
    assert sorted(seen) == list(range(taken * 6, taken * 6 + (steps - taken) * w2 * b2))
    st = again.state_dict()
    assert st["epoch"] >= 0 and st["epoch_start"] <= st["position"]


def test_steps_state_carries_its_epoch(docs):
    pack = fl.Pack(arrow_source(docs), 40)
    rows0 = len(epoch_rows(lengths_of(docs), 40, pack.window, document_order(len(docs), 0, 0)))
    loader = fl.Loader(pack, 4, shuffle=True, steps=rows0 // 4 + 5, num_threads=2)
    take(loader, rows0 // 4 + 2)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["epoch_start"] == rows0
    assert loader.stats().packing.epoch == 1
    with pytest.raises(ValueError, match="no epochs"):
        loader.set_epoch(1)
    with pytest.raises(ValueError, match="even='mask' has nothing to mask"):
        fl.Loader(pack, 4, steps=3, even="mask")
