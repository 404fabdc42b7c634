"""loader.stats(): each counter against what the test counts itself; the stall hint."""
from __future__ import annotations

import logging
import time

import numpy as np
import pytest

import fastload as fl


def test_counts_match_what_the_loop_saw():
    x = np.zeros((1000, 3), np.float32)
    loader = fl.Loader(fl.Dataset({"x": x, "y": np.arange(1000)}), 64, with_index=True, device="cpu", prefetch=4)
    t0 = time.perf_counter()
    batches = samples = 0
    waited = 0.0
    it = iter(loader)
    while True:
        t = time.perf_counter()
        try:
            b = next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - t
        batches += 1
        samples += len(b["x"])
    wall = time.perf_counter() - t0
    s = loader.stats()
    assert (s.epoch, s.batches, s.samples) == (0, batches, samples) == (0, 16, 1000)
    assert s.bytes == samples * (3 * 4 + 8 + 8)  # x, y and the index
    assert 0 < s.wait_s <= waited + 1e-3
    assert 0 < s.wall_s <= wall + 0.5
    assert 0 <= s.wait_share <= 1
    assert 0 <= s.ready_mean <= 4
    assert s.collation.count == 16 and s.collation.busy_s > 0
    assert 0 < s.collation.p50_s <= s.collation.p99_s
    assert s.copy == {}
    mem = loader._memory()
    assert (s.host_bytes, s.pinned_bytes, s.device_bytes) == (mem["host_bytes"], 0, 0)
    assert s.host_allocations == mem["host_allocations"] > 0
    # The documented bound: (prefetch + 2) batches of host memory, one buffer per part (x, y, index).
    assert 0 < s.host_bytes <= (4 + 2) * 64 * (3 * 4 + 8 + 8)
    # At least one buffer per part; how many more depends on timing (each part's pool trims and
    # refills on its own), so the count need not be a multiple of 3.
    assert s.host_allocations >= 3
    assert s.collation.busy_s <= s.wall_s * mem["num_threads"]
    assert "handed out" in str(s) and "16 batches" in str(s)


def test_a_slow_training_step_waits_little_and_finds_batches_ready():
    loader = fl.Loader(fl.Dataset({"x": np.zeros((400, 8), np.float32)}), 20, device="cpu", prefetch=4)
    for _ in loader:
        time.sleep(0.005)  # the "model"
    s = loader.stats()
    assert s.wait_share < 0.2, s
    assert s.ready_mean > 2, s


def test_stats_start_again_with_each_epoch_and_before_any():
    loader = fl.Loader(fl.Dataset({"x": np.arange(100)}), 10, device="cpu")
    assert loader.stats().batches == 0
    for _ in loader:
        pass
    it = iter(loader)
    next(it)
    s = loader.stats()
    assert (s.epoch, s.batches, s.samples) == (1, 1, 10)


def test_the_stall_hint_is_logged_once_and_names_a_knob(caplog):
    # One collation thread gathering 16 MiB batches from beyond the caches (milliseconds each),
    # a training step of ~0.1 ms: the loop waits most of the time, and the collation thread is
    # busy nearly all the time, so the hint names num_threads.
    tokens = np.ones(80 << 20, np.uint8)
    loader = fl.Loader(fl.Windows(tokens, length=1 << 20, stride=16 << 10), 16, shuffle=True, device="cpu",
                       num_threads=1, prefetch=8)
    assert len(loader) > 256
    with caplog.at_level(logging.WARNING, logger="fastload"):
        for _ in range(2):
            for _b in loader:
                time.sleep(0.0001)
    hints = [r for r in caplog.records if r.name == "fastload"]
    assert len(hints) == 1, [r.getMessage() for r in hints]
    message = hints[0].getMessage()
    assert "waited for data" in message and "num_threads" in message, message


def test_the_stall_hint_says_when_the_loop_itself_takes_no_time(caplog):
    """A loop that only takes batches (a benchmark) waits for any loader, and which stage looks
    busiest varies between runs (issue 33, newcomer notes): the hint says so."""
    tokens = np.ones(80 << 20, np.uint8)
    loader = fl.Loader(fl.Windows(tokens, length=1 << 20, stride=16 << 10), 16, shuffle=True, device="cpu",
                       num_threads=1, prefetch=8)
    with caplog.at_level(logging.WARNING, logger="fastload"):
        for _ in range(2):
            for _b in loader:
                pass
    hints = [r.getMessage() for r in caplog.records if r.name == "fastload"]
    assert len(hints) == 1 and "the loop itself took under 5% of the time between batches" in hints[0], hints


@pytest.mark.parametrize("share, noted", [(0.99, True), (0.96, True), (0.9, False), (0.3, False)])
def test_the_idle_loop_note_follows_the_loops_own_share(share, noted):
    from fastload._advice import stall_message

    message = stall_message(share=share, collating=0.95, copying=0.0, releasing=0.0, user_share=-1.0,
                            fetch_share=0.0, processes=False, num_threads=2, copy_streams=1, prefetch=8, window=256)
    assert message.startswith(f"fastload: the training loop waited for data {int(share * 100)}% of the time over "
                              "the last 256 batches; collation is the bottleneck (2 threads)"), message
    assert ("the loop itself took under 5%" in message) == noted, message
    assert message.endswith("See loader.stats().")


def test_no_hint_when_the_loop_is_the_bottleneck(caplog):
    loader = fl.Loader(fl.Dataset({"x": np.zeros((600, 8), np.float32)}), 2, device="cpu", prefetch=8)
    with caplog.at_level(logging.WARNING, logger="fastload"):
        for _ in loader:
            time.sleep(0.0005)
    assert not [r for r in caplog.records if r.name == "fastload"]


@pytest.mark.parametrize("collating, copying, knob", [
    (0.95, 0.0, "raise num_threads"),     # the collation threads are the bottleneck
    (0.95, 0.95, "raise num_threads"),    # both busy: more threads first, copies wait on them
    (0.5, 0.9, "raise copy_streams (now 2)"),  # a GPU's copy streams are the bottleneck
    (0.7, 0.7, "raise prefetch (now 8)"), # neither busier than 70%: batches came unevenly
    (0.1, 0.0, "raise prefetch (now 8)"),
])
def test_the_stall_hint_names_the_busiest_stage(collating, copying, knob):
    from fastload._advice import stall_advice
    advice = stall_advice(collating, copying, num_threads=3, copy_streams=2, prefetch=8)
    assert knob in advice, advice
    if "num_threads" in knob:
        assert "(3 threads)" in advice


@pytest.mark.parametrize("collating, copying", [(0.1, 0.1), (0.95, 0.95)])
def test_the_stall_hint_names_the_step_when_copies_wait_for_the_gpu(collating, copying):
    # The copies waited most of the time for the consumer's GPU work to release memory: the
    # training step is the bottleneck, whatever else was busy, and no loader knob is named.
    from fastload._advice import stall_advice
    advice = stall_advice(collating, copying, num_threads=3, copy_streams=2, prefetch=8, releasing=0.9)
    assert "training step is the bottleneck" in advice and "90%" in advice, advice
    assert "raise" not in advice
    assert "raise copy_streams" in stall_advice(0.1, 0.9, num_threads=3, copy_streams=2, prefetch=8, releasing=0.5)


@pytest.mark.parametrize("fetch_share, knob", [(0.8, "waited for object storage 80% of their time"),
                                               (0.3, "collation is the bottleneck (3 threads)")])
def test_the_stall_hint_tells_downloads_from_collation(fetch_share, knob):
    # A remote source's collation threads wait inside the gather for files being fetched: that
    # time is theirs, but the knob is not num_threads when most of it was spent on downloads.
    from fastload._advice import stall_advice
    advice = stall_advice(0.95, 0.0, num_threads=3, copy_streams=2, prefetch=8, fetch_share=fetch_share)
    assert knob in advice, advice
    assert ("num_threads" in advice) == (fetch_share < 0.5)


def test_stats_repr_is_a_table():
    loader = fl.Loader(fl.Dataset({"x": np.arange(10)}), 5, device="cpu")
    list(loader)
    text = repr(loader.stats())
    assert text.startswith("LoaderStats(") and "data wait" in text and "collation" in text
