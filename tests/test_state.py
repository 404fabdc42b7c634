"""Mid-epoch resume on one process: the state counts batches handed out, is small and versioned,
and a fresh loader continues exactly at the next batch."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fastload as fl

N = 1000


def make(**kw):
    kw.setdefault("batch_size", 32)
    kw.setdefault("shuffle", True)
    kw.setdefault("seed", 5)
    return fl.Loader(fl.Dataset({"x": np.arange(N)}), with_index=True, **kw)


def ids(batches):
    return [b["index"].numpy().copy() for b in batches]


@pytest.mark.parametrize("k", [0, 1, 7, 31])  # 32 = the whole epoch: see the epoch-end test
def test_resume_mid_epoch_continues_at_the_next_batch(k):
    ref = make()
    ref.set_epoch(3)
    full = ids(ref)
    run = make(prefetch=6, num_threads=2)
    run.set_epoch(3)
    it = iter(run)
    first = ids(next(it) for _ in range(k))
    state = run.state_dict()  # batches built ahead (prefetch) are not counted
    assert json.loads(json.dumps(state)) == state  # small and plain
    resumed = make()
    resumed.load_state_dict(state)
    rest = ids(resumed)
    assert len(first) + len(rest) == len(full)
    for a, b in zip(first + rest, full):
        assert np.array_equal(a, b)


def test_resume_honours_set_epoch_of_the_saved_epoch_and_continues_with_the_next():
    run = make()
    run.set_epoch(2)
    it = iter(run)
    next(it)
    state = run.state_dict()
    assert state["epoch"] == 2 and state["position"] == 32 and state["version"] == fl.STATE_VERSION
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # the usual loop calls set_epoch(saved epoch): the position is kept
    assert len(list(resumed)) == len(run) - 1
    ref = make()
    ref.set_epoch(3)
    assert all(np.array_equal(a, b) for a, b in zip(ids(resumed), ids(ref)))  # next iter(): epoch 3


def test_state_at_epoch_end_points_at_the_next_epoch():
    run = make()
    list(run)
    state = run.state_dict()
    assert (state["epoch"], state["position"]) == (1, 0)
    fresh = make().state_dict()
    assert (fresh["epoch"], fresh["position"]) == (0, 0)


def test_set_epoch_other_than_the_saved_one_starts_from_the_beginning():
    run = make()
    it = iter(run)
    next(it)
    resumed = make()
    resumed.load_state_dict(run.state_dict())
    resumed.set_epoch(5)
    assert len(list(resumed)) == len(run)


def test_resume_with_another_batch_size_starts_at_the_same_sample():
    run = make(batch_size=30)
    it = iter(run)
    seen = [next(it)["index"] for _ in range(4)]
    resumed = make(batch_size=50)
    resumed.load_state_dict(run.state_dict())
    rest = [b["index"] for b in resumed]
    everything = torch.cat(seen + rest).numpy()
    ref = make(batch_size=1)
    assert np.array_equal(everything, torch.cat([b["index"] for b in ref]).numpy())
    assert all(len(b) == 50 for b in rest[:-1])


def test_state_is_refused_for_another_dataset_or_order():
    state = make().state_dict()
    other = fl.Loader(fl.Dataset({"x": np.arange(N + 1)}), batch_size=32, shuffle=True)
    with pytest.raises(ValueError, match=f"saved for a dataset of {N} samples.*{N + 1}"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle"):
        make(shuffle=False).load_state_dict(state)
    with pytest.raises(ValueError, match="version"):
        make().load_state_dict({**state, "version": 99})
    with pytest.raises(ValueError, match="missing"):
        make().load_state_dict({"version": 1})
    with pytest.raises(TypeError, match="dict"):
        make().load_state_dict([1, 2])


def test_resume_adopts_the_saved_seed():
    run = make(seed=11)
    it = iter(run)
    next(it)
    resumed = make(seed=0)
    resumed.load_state_dict(run.state_dict())
    ref = make(seed=11)
    assert np.array_equal(np.concatenate(ids(resumed)), np.concatenate(ids(ref))[32:])


def test_state_values_are_checked_and_numpy_integers_accepted():
    run = make()
    it = iter(run)
    next(it)
    state = run.state_dict()
    with pytest.raises(ValueError, match=r"state\['seed'\] must be a non-negative integer"):
        make().load_state_dict({**state, "seed": -5})
    with pytest.raises(ValueError, match=r"state\['position'\]"):
        make().load_state_dict({**state, "position": True})
    resumed = make()
    resumed.load_state_dict({**state, "position": np.int64(state["position"]), "epoch": np.int64(0)})
    assert len(list(resumed)) == len(run) - 1
