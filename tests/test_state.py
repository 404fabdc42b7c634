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


# ---------------------------------------------------------------- set_epoch with a live iterator
# Lightning makes the epoch's iterator first and calls set_epoch(current_epoch) after (in
# on_train_epoch_start): set_epoch with the live iterator's own epoch changes nothing, so that
# state_dict() keeps counting its batches (issue 26, item 1).
@pytest.mark.parametrize("epoch", [0, 1])
def test_set_epoch_with_the_live_iterators_epoch_keeps_counting(epoch):
    run = make()
    for _ in range(epoch):  # epochs before: each iter() runs the next one
        list(run)
    it = iter(run)
    run.set_epoch(epoch)
    taken = ids(next(it) for _ in range(10))
    state = run.state_dict()
    assert (state["epoch"], state["position"]) == (epoch, 320)
    resumed = make()
    resumed.load_state_dict(state)
    resumed_it = iter(resumed)
    resumed.set_epoch(epoch)  # the same recipe on resume: nothing changes
    ref = make()
    ref.set_epoch(epoch)
    assert all(np.array_equal(a, b) for a, b in zip(taken + ids(resumed_it), ids(ref), strict=True))


def test_set_epoch_with_the_live_epoch_after_split_keeps_counting():
    run = make()
    its = run.split(["cpu", "cpu"])
    run.set_epoch(0)
    for _ in range(3):
        for it in its:
            next(it)
    state = run.state_dict()
    assert (state["epoch"], state["position"]) == (0, 3 * 64)


def test_set_epoch_with_another_epoch_while_live_applies_to_the_next_iter_and_counts_the_live_one():
    run = make()
    it = iter(run)
    next(it)
    next(it)
    run.set_epoch(4)
    assert (run.state_dict()["epoch"], run.state_dict()["position"]) == (0, 64)  # the live one still counts
    next(it)  # the live iterator goes on with its own epoch, counted
    assert (run.state_dict()["epoch"], run.state_dict()["position"]) == (0, 96)
    ref = make()
    ref.set_epoch(4)
    assert all(np.array_equal(a, b) for a, b in zip(ids(run), ids(ref), strict=True))  # then epoch 4


def test_set_epoch_with_another_epoch_before_anything_is_taken_is_the_state():
    run = make()
    it = iter(run)  # nothing taken: the iterator does not use up its epoch
    run.set_epoch(6)
    assert (run.state_dict()["epoch"], run.state_dict()["position"]) == (6, 0)
    del it


def test_set_epoch_after_the_epoch_ended_reruns_it():
    run = make()
    first = ids(run)
    run.set_epoch(0)  # the iterator is exhausted: not live, so epoch 0 again
    assert run.state_dict()["epoch"] == 0 and run.state_dict()["position"] == 0
    assert all(np.array_equal(a, b) for a, b in zip(ids(run), first, strict=True))


def test_set_epoch_with_the_live_epoch_cancels_an_earlier_other_one():
    run = make()
    it = iter(run)
    next(it)
    run.set_epoch(3)
    run.set_epoch(0)  # the live epoch again: the last call wins, nothing pending
    list(it)
    assert run.state_dict()["epoch"] == 1
    ref = make()
    ref.set_epoch(1)
    assert all(np.array_equal(a, b) for a, b in zip(ids(run), ids(ref), strict=True))


def test_set_epoch_with_the_live_epoch_of_a_mix_keeps_counting():
    def mixed():
        return fl.Loader(fl.Mix({"a": fl.Dataset({"x": np.arange(300)}), "b": fl.Dataset({"x": np.arange(500)})},
                                weights={"a": 0.5, "b": 0.5}), batch_size=16, shuffle=True, seed=1)

    run = mixed()
    it = iter(run)
    run.set_epoch(0)
    taken = [next(it)["x"].numpy().copy() for _ in range(5)]
    state = run.state_dict()
    assert state["step"] == 5
    resumed = mixed()
    resumed.load_state_dict(state)
    ref = [b["x"].numpy() for b in mixed()]
    assert all(np.array_equal(a, b)
               for a, b in zip(taken + [b["x"].numpy() for b in resumed], ref, strict=True))


# A peek, then the README's loop (issue 33, item 7): set_epoch(e) followed by iter() before any
# other batch is taken runs epoch e again from its start, as plan(e) says; Lightning's order
# (iter(), set_epoch, then the batches) keeps counting the live iterator, as above.
def _epochs_after_a_peek(loader, epochs):
    next(iter(loader))
    seen = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        seen.append(ids(loader))
    return seen


@pytest.mark.parametrize("peeks", [1, 3])
def test_set_epoch_after_a_peek_runs_that_epoch_as_plan_says(peeks):
    run = make()
    it = iter(run)
    for _ in range(peeks):
        next(it)
    seen = []
    for epoch in range(3):
        run.set_epoch(epoch)
        seen.append(np.concatenate(ids(run)))
    for epoch, got in enumerate(seen):
        np.testing.assert_array_equal(got, run.plan(epoch))
        ref = make()
        ref.set_epoch(epoch)
        np.testing.assert_array_equal(got, np.concatenate(ids(ref)))
    assert not np.array_equal(seen[0], seen[1])


def test_set_epoch_after_a_peek_with_the_peeked_iterator_collected():
    import gc

    run = make()
    next(iter(run))
    gc.collect()
    run.set_epoch(0)
    np.testing.assert_array_equal(np.concatenate(ids(run)), run.plan(0))
    run.set_epoch(1)
    np.testing.assert_array_equal(np.concatenate(ids(run)), run.plan(1))


def test_set_epoch_of_the_live_epoch_then_batches_then_iter_moves_on():
    """Lightning with limit_train_batches: iter(), set_epoch(e), a few batches, then the next
    epoch's iter(): the call was about the live iterator, so the next iter() runs e + 1."""
    run = make()
    it = iter(run)
    next(it)
    run.set_epoch(0)
    next(it)
    next(it)
    np.testing.assert_array_equal(np.concatenate(ids(run)), run.plan(1))


def test_set_epoch_of_the_live_epoch_then_state_dict_counts_the_live_iterator():
    run = make()
    it = iter(run)
    next(it)
    next(it)
    run.set_epoch(0)
    assert (run.state_dict()["epoch"], run.state_dict()["position"]) == (0, 64)
    next(it)
    assert (run.state_dict()["epoch"], run.state_dict()["position"]) == (0, 96)
    del it


def test_set_epoch_after_a_peek_on_split_outputs():
    run = make()
    its = run.split(["cpu", "cpu"])
    next(its[0])
    next(its[1])
    run.set_epoch(0)
    again = run.split(["cpu", "cpu"])
    ref = make()
    ref_its = ref.split(["cpu", "cpu"])
    for a, b in zip(again, ref_its, strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(ids(a), ids(b), strict=True))


def test_set_epoch_after_a_peek_of_a_mix_runs_that_epoch():
    def mixed():
        return fl.Loader(fl.Mix({"a": fl.Dataset({"x": np.arange(300)}), "b": fl.Dataset({"x": np.arange(500)})},
                                weights={"a": 0.5, "b": 0.5}), batch_size=16, shuffle=True, seed=1)

    run = mixed()
    next(iter(run))
    seen = []
    for epoch in range(2):
        run.set_epoch(epoch)
        seen.append(np.concatenate([b["x"].numpy() for b in run]))
    for epoch in range(2):
        ref = mixed()
        ref.set_epoch(epoch)
        np.testing.assert_array_equal(seen[epoch], np.concatenate([b["x"].numpy() for b in ref]))


def test_load_state_dict_with_a_live_iterator_ends_it_and_the_state_is_the_loaded_one():
    run = make()
    it = iter(run)
    next(it)
    saved = make()
    saved.set_epoch(2)
    saved_it = iter(saved)
    for _ in range(3):
        next(saved_it)
    state = saved.state_dict()
    run.load_state_dict(state)  # the live iterator's epoch ends: its batches no longer count
    assert run.state_dict() == state
    with pytest.raises(RuntimeError, match="ended by a newer iter"):
        next(it)
    run.set_epoch(2)  # the loaded epoch: the position is kept
    ref = make()
    ref.set_epoch(2)
    rest = ids(run)
    assert all(np.array_equal(a, b) for a, b in zip(rest, ids(ref)[3:], strict=True))


def test_set_epoch_with_another_epoch_after_split_applies_to_the_next_split_and_counts_the_live_one():
    run = make()
    its = run.split(["cpu", "cpu"])
    for it in its:
        next(it)
    run.set_epoch(5)
    assert (run.state_dict()["epoch"], run.state_dict()["position"]) == (0, 64)
    its = run.split(["cpu", "cpu"])
    assert (run.state_dict()["epoch"], run.state_dict()["position"]) == (5, 0)
    for it in its:
        next(it)
    assert (run.state_dict()["epoch"], run.state_dict()["position"]) == (5, 64)
