"""Step-based training over one source: Loader(source, batch_size, steps=N) yields exactly N full
batches across as many source epochs as it takes, resumes exactly at any step (also at another
world size with the same global batch, and re-anchored at another one), and is checked against the
epoch plans of a loader without steps= and the brute-force stream (tests/mix_reference.py)."""
from __future__ import annotations

import numpy as np
import pytest

import fastload as fl
from fastload import _C

import mix_reference as ref
from elastic import four_to_two


def epochs_concat(source, batch_size, epochs, **kw) -> np.ndarray:
    """The epoch permutations of a loader without steps=, one after another."""
    plain = fl.Loader(source, batch_size, **kw)
    return np.concatenate([plain.plan(e) for e in range(epochs)])


def ids_of(batches) -> np.ndarray:
    return np.concatenate([b["index"].numpy() for b in batches]) if batches else np.zeros(0, np.int64)


def make(n=23, sharded=False):
    x = np.arange(n, dtype=np.int64) * 10
    if sharded:
        parts = np.array_split(x, 4)
        return fl.Dataset({"x": [p.copy() for p in parts]}), x
    return fl.Dataset({"x": x}), x


@pytest.mark.parametrize("shuffle,order,sharded", [(True, "random", False), (False, "random", False),
                                                   (True, "block", False), (True, "block", True),
                                                   (True, "random", True)])
def test_one_source_runs_the_epoch_permutations_one_after_another(shuffle, order, sharded):
    ds, x = make(23, sharded)
    steps, b = 17, 5
    loader = fl.Loader(ds, b, steps=steps, shuffle=shuffle, order=order, seed=9, with_index=True)
    assert len(loader) == steps
    batches = list(loader)
    assert len(batches) == steps and all(len(bt["x"]) == b for bt in batches)
    ids = ids_of(batches)
    expected = epochs_concat(ds, b, 5, shuffle=shuffle, order=order, seed=9)[: steps * b]
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(np.concatenate([bt["x"].numpy() for bt in batches]), x[ids])
    np.testing.assert_array_equal(loader.plan(), expected)
    np.testing.assert_array_equal(loader.plan(steps=(3, 7)), expected[3 * b: 7 * b])


def test_every_source_epoch_holds_each_sample_once():
    ds, _ = make(7)
    ids = ids_of(list(fl.Loader(ds, 3, steps=14, shuffle=True, seed=1, with_index=True)))
    assert len(ids) == 42
    for e in range(6):
        assert sorted(ids[e * 7:(e + 1) * 7]) == list(range(7))


def test_batches_larger_than_the_source_span_several_epochs():
    ds, _ = make(3)
    ids = ids_of(list(fl.Loader(ds, 8, steps=3, shuffle=True, seed=2, with_index=True)))
    for e in range(8):
        assert sorted(ids[e * 3:(e + 1) * 3]) == [0, 1, 2]


def test_iter_continues_with_the_next_step_and_ends_after_n():
    ds, _ = make(11)
    loader = fl.Loader(ds, 2, steps=9, shuffle=True, seed=4, with_index=True)
    whole = loader.plan()
    it = iter(loader)
    assert len(it) == 9
    first = [next(it) for _ in range(4)]
    assert len(it) == 5
    it2 = iter(loader)  # continues at step 4
    assert len(it2) == 5
    rest = list(it2)
    np.testing.assert_array_equal(ids_of(first + rest), whole)
    assert list(iter(loader)) == [] and len(iter(loader)) == 0


def test_an_iter_nothing_was_taken_from_does_not_use_up_steps():
    ds, _ = make(11)
    loader = fl.Loader(ds, 2, steps=5, with_index=True)
    iter(loader)
    assert len(list(loader)) == 5


def test_resume_at_every_step():
    ds, _ = make(7)
    kw = dict(steps=11, shuffle=True, seed=5, with_index=True)
    whole = ids_of(list(fl.Loader(ds, 3, **kw)))
    for k in range(12):
        a = fl.Loader(ds, 3, **kw)
        it = iter(a)
        head = [next(it) for _ in range(k)]
        state = a.state_dict()
        assert state["step"] == k
        b = fl.Loader(ds, 3, **kw)
        b.load_state_dict(state)
        assert b.state_dict() == state
        tail = list(b)
        np.testing.assert_array_equal(ids_of(head + tail), whole)


def test_state_before_any_iter_and_after_the_end():
    ds, _ = make(7)
    loader = fl.Loader(ds, 3, steps=4, shuffle=True)
    assert loader.state_dict()["step"] == 0
    list(loader)
    end = loader.state_dict()
    assert end["step"] == 4
    again = fl.Loader(ds, 3, steps=4, shuffle=True)
    again.load_state_dict(end)
    assert list(again) == []
    longer = fl.Loader(ds, 3, steps=6, shuffle=True, with_index=True)  # more steps: the run goes on
    longer.load_state_dict(end)
    np.testing.assert_array_equal(ids_of(list(longer)), fl.Loader(ds, 3, steps=6, shuffle=True).plan()[12:])


def test_ranks_are_disjoint_equal_and_cover_each_global_step():
    ds, _ = make(13)
    world, b, steps = 3, 4, 10
    per_rank = [[bt["index"].numpy() for bt in fl.Loader(ds, b, steps=steps, shuffle=True, seed=8, rank=r,
                                                         world_size=world, with_index=True)]
                for r in range(world)]
    assert all(len(p) == steps for p in per_rank)
    single = fl.Loader(ds, b * world, steps=steps, shuffle=True, seed=8).plan().reshape(steps, b * world)
    for s in range(steps):
        got = np.concatenate([per_rank[r][s] for r in range(world)])
        assert sorted(got) == sorted(single[s])
        # the round-robin deal: rank r takes global batch positions r, r + W, ...
        for r in range(world):
            np.testing.assert_array_equal(per_rank[r][s], single[s][r::world])


def test_elastic_resume_with_the_same_global_batch():
    ds, _ = make(19)
    kw = dict(steps=12, shuffle=True, seed=3, with_index=True)
    state, rest = four_to_two(lambda b, r, w: fl.Loader(ds, b, rank=r, world_size=w, **kw), 2, steps=5,
                              saved_rank=0)
    assert state["step"] == 5 and state["global_batch_size"] == 8
    single = fl.Loader(ds, 8, **kw).plan().reshape(12, 8)
    for s in range(7):
        assert sorted(np.concatenate([rest[0][s], rest[1][s]])) == sorted(single[5 + s])
        np.testing.assert_array_equal(rest[1][s], single[5 + s][1::2])


def test_another_global_batch_on_resume_continues_the_stream_without_repeats_or_gaps():
    ds, _ = make(9)
    a = fl.Loader(ds, 4, steps=10, shuffle=True, seed=6, with_index=True)
    it = iter(a)
    head = [next(it) for _ in range(3)]  # 12 samples: one epoch and 3 of the next
    state = a.state_dict()
    b = fl.Loader(ds, 5, steps=10, shuffle=True, seed=6, with_index=True)
    b.load_state_dict(state)
    tail = list(b)
    assert len(tail) == 7  # steps are counted on: steps 3..9
    ids = ids_of(head + tail)
    np.testing.assert_array_equal(ids, epochs_concat(ds, 4, 10, shuffle=True, seed=6)[: len(ids)])
    assert b.state_dict()["schedule"]["origin"] == 3


def test_split_devices_share_the_global_step():
    ds, _ = make(17)
    loader = fl.Loader(ds, 3, steps=6, shuffle=True, seed=2, with_index=True)
    its = loader.split(["cpu", "cpu"])
    assert [len(i) for i in its] == [6, 6]
    got = [[bt["index"].numpy() for bt in i] for i in its]
    single = fl.Loader(ds, 6, steps=6, shuffle=True, seed=2).plan().reshape(6, 6)
    for s in range(6):
        np.testing.assert_array_equal(got[0][s], single[s][0::2])
        np.testing.assert_array_equal(got[1][s], single[s][1::2])


def test_matches_the_brute_force_stream():
    ds, _ = make(10)
    perm = fl.Loader(ds, 1, shuffle=True, seed=7)
    for world in (1, 3):
        for r in range(world):
            got = fl.Loader(ds, 4, steps=8, shuffle=True, seed=7, rank=r, world_size=world).plan().reshape(8, 4)
            expected = ref.ref_stream_batches([10], [perm.plan], [4 * world], [0], 0, 4, world, r, 0, 8)
            for s in range(8):
                np.testing.assert_array_equal(got[s], expected[s][0])


def test_stream_options_are_checked():
    ds, _ = make(10)
    with pytest.raises(ValueError, match="even='mask' has nothing to mask"):
        fl.Loader(ds, 2, steps=3, even="mask")
    with pytest.raises(ValueError, match="partition='shards' is not available"):
        fl.Loader(make(12, sharded=True)[0], 2, steps=3, partition="shards")
    for bad in (0, -1):
        with pytest.raises(ValueError, match="steps must be a positive"):
            fl.Loader(ds, 2, steps=bad)
    with pytest.raises(TypeError, match="steps must be an integer"):
        fl.Loader(ds, 2, steps=2.5)
    loader = fl.Loader(ds, 2, steps=3, even="drop", drop_last=True)  # accepted: every step is full
    assert len(list(loader)) == 3
    with pytest.raises(ValueError, match="has no epochs"):
        loader.set_epoch(1)
    with pytest.raises(ValueError, match="has no epochs"):
        loader.plan(0)
    with pytest.raises(ValueError, match=r"steps must be \(first, end\)"):
        loader.plan(steps=(3, 1))


def test_states_of_the_other_mode_are_refused():
    ds, _ = make(10)
    plain, stream = fl.Loader(ds, 2), fl.Loader(ds, 2, steps=3)
    with pytest.raises(ValueError, match="step-based"):
        plain.load_state_dict(stream.state_dict())
    with pytest.raises(ValueError, match="without steps="):
        stream.load_state_dict(plain.state_dict())
    other = fl.Loader(make(11)[0], 2, steps=3)
    with pytest.raises(ValueError, match="refusing to resume on other data"):
        other.load_state_dict(stream.state_dict())


def test_plan_memory_is_checked_before_allocating():
    ds, _ = make(10)
    loader = fl.Loader(ds, 2**20, steps=2**40)
    with pytest.raises(MemoryError, match="more than this machine's memory"):
        loader.plan()


def test_first_batch_of_a_huge_stream_is_instant():
    tokens = np.zeros(2**20 + 1, np.uint16)
    win = fl.Windows(tokens, length=2, stride=1)
    loader = fl.Loader(win, 8, steps=2**50 // 8, shuffle=True)
    assert len(loader) == 2**47
    batch = next(iter(loader))
    assert tuple(batch["tokens"].shape) == (8, 2)
    assert len(loader.plan(steps=(2**46, 2**46 + 2))) == 16


def test_python_dataset_with_steps():
    class Squares:
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"v": np.int64(i * i), "r": fl.sample_rng().integers(1 << 30)}

    loader = fl.Loader(Squares(), 4, steps=5, shuffle=True, seed=1, with_index=True, num_workers=2)
    batches = list(loader)
    ids = ids_of(batches)
    np.testing.assert_array_equal(ids, epochs_concat(fl.Dataset({"x": np.zeros(6)}), 4, 4, shuffle=True, seed=1)[:20])
    np.testing.assert_array_equal(np.concatenate([b["v"].numpy() for b in batches]), ids * ids)
    # per-sample randomness is keyed by the global step: a sample drawn again in a later epoch of
    # its source gets another stream, and a re-run gets the same ones
    again = list(fl.Loader(Squares(), 4, steps=5, shuffle=True, seed=1, num_workers=1))
    np.testing.assert_array_equal(np.concatenate([b["r"].numpy() for b in batches]),
                                  np.concatenate([b["r"].numpy() for b in again]))
    r = np.concatenate([b["r"].numpy() for b in batches])
    assert len(set(r.tolist())) > 15


def test_sampler_seeds_and_phase():
    ds, _ = make(10)
    s = _C.StreamSampler([10], [0], [[]], 5, True, "random", 4096, 4, 2, 1, 0, [2], [0], 0, [0])
    assert s.seeds == [5] and s.phase == _C.mix_phase(5)
    two = _C.StreamSampler([10, 4], [0, 10], [[], []], 5, True, "random", 4096, 4, 2, 1, 0, [1, 1], [0, 0], 0, [0, 0])
    assert len(set(two.seeds)) == 2 and 5 not in two.seeds


@pytest.mark.parametrize("batch, steps", [(4, 2**61), (1, 2**62), (1, 2**61)])
def test_steps_beyond_what_the_stream_can_hold_are_refused_at_construction(batch, steps):
    ds = fl.Dataset({"x": np.arange(100)})
    with pytest.raises(ValueError, match=rf"steps={steps} is more than a stream at global batch {batch} .*at most \d+"):
        fl.Loader(ds, batch, steps=steps, num_threads=1)


def test_the_largest_steps_accepted_at_construction_also_starts():
    ds = fl.Dataset({"x": np.arange(100)})
    most = (2**62 - 1) // 5
    loader = fl.Loader(ds, 4, steps=most, num_threads=1)
    assert len(next(iter(loader))["x"]) == 4
    loader.close()
