"""The distributed sampling contract (shared/DESIGN.md, "Sampling contract") with real processes:
torchrun launches tests/distributed_worker.py on the gloo backend (CPU); each rank writes what it
saw to tmp_path and the checks run here, against a reference built from the contract itself:

    P = fastload._C.Sampler(...).permutation(epoch, 0, N)   (the epoch's order, nothing more)
    pad/mask wrap P[N + i] = P[i mod N]; drop cuts to a multiple of W; G = batch_size * W;
    step s, rank r: positions [s*G + r*B, s*G + (r+1)*B); the last short step is split evenly.

Each launch runs several configurations, so the whole file takes well under a minute or two.
"""
from __future__ import annotations

import collections
import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import fastload as fl
from fastload import _C

pytestmark = pytest.mark.distributed

if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available", allow_module_level=True)

WORKER = Path(__file__).with_name("distributed_worker.py")
LAUNCH_TIMEOUT = 150  # seconds per torchrun launch; a hang fails the test instead of blocking it
EVENS = ("pad", "drop", "mask")


def _worker_module() -> Any:
    spec = importlib.util.spec_from_file_location("fastload_distributed_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------------------- launching
def launch(tmp_path: Path, mode: str, world: int, cfg: dict[str, Any], timeout: float = LAUNCH_TIMEOUT) -> list[dict]:
    """Runs the worker's MODE on `world` ranks; returns each rank's JSON result, in rank order."""
    out = tmp_path / f"out_{mode}"
    out.mkdir()
    config = tmp_path / f"config_{mode}.json"
    config.write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world),
           "--rdzv-backend=c10d", "--rdzv-endpoint=localhost:0", "--max-restarts", "0",
           str(WORKER), mode, str(config), str(out)]
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    log = tmp_path / f"{mode}.log"
    with open(log, "w") as log_file:  # a file, not a pipe: a stray rank can never block the reader
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc, out)
            pytest.fail(f"torchrun {mode} with {world} ranks did not finish within {timeout}s (a hang?); "
                        f"output:\n{log.read_text()[-8000:]}")
    if proc.returncode != 0:
        pytest.fail(f"torchrun {mode} with {world} ranks failed (exit {proc.returncode}); "
                    f"output:\n{log.read_text()[-8000:]}")
    return [json.loads((out / f"{mode}_rank{r}.json").read_text()) for r in range(world)]


def _stop(proc: subprocess.Popen, out: Path) -> None:
    """Ends a launch that ran out of time: SIGTERM to torchrun (it stops its ranks), then SIGKILL
    to whatever is left of it and of the ranks (each in its own session; they wrote their pids)."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for pid_file in out.glob("pid_rank*.txt"):
        try:
            pid = int(pid_file.read_text())
            if WORKER.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():  # still our rank
                os.kill(pid, signal.SIGKILL)
        except (ValueError, FileNotFoundError, ProcessLookupError, PermissionError):
            pass


# ---------------------------------------------------------------------------- the reference
def permutation(n: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The epoch's order P. Built for one rank of batch 1: the order must not depend on them."""
    return _C.Sampler(n, 1, 1, 0, seed, shuffle, "random", "pad", False).permutation(epoch, 0, n)


def reference(n: int, b: int, w: int, r: int, *, seed: int = 0, epoch: int = 0, even: str = "pad",
              drop_last: bool = False, shuffle: bool = True, start: int = 0) -> list[tuple[list, list]]:
    """Rank r's batches as (ids, valid) per the sampling contract, from global position `start`."""
    perm = permutation(n, seed, epoch, shuffle)
    remaining = max(n - start, 0)
    rounded = remaining // w * w if even == "drop" else -(-remaining // w) * w
    g = b * w
    full = rounded // g
    share = (rounded - full * g) // w
    spans = [(start + s * g + r * b, b) for s in range(full)]
    if share and not drop_last:
        spans.append((start + full * g + r * share, share))
    out = []
    for first, count in spans:
        pos = np.arange(first, first + count)
        out.append((perm[pos % n].tolist(), (pos < n).tolist()))
    return out


def ref_ids(*args: Any, **kw: Any) -> list[list[int]]:
    return [ids for ids, _ in reference(*args, **kw)]


def ids_of(batches: list[dict]) -> list[list[int]]:
    return [b["ids"] for b in batches]


def flat(batches: list[dict]) -> list[int]:
    return [i for b in batches for i in b["ids"]]


def global_steps(per_rank: list[list[dict]]) -> list[list[int]]:
    """Global step s = rank 0's batch s, then rank 1's, ... (all ranks have the same count)."""
    return [sum((rank[s]["ids"] for rank in per_rank), []) for s in range(len(per_rank[0]))]


def check_batch_format(batches: list[dict], even: str) -> None:
    keys = sorted(["x", "index"] + (["valid"] if even == "mask" else []))
    for b in batches:
        assert b["keys"] == keys
        assert b["index_dtype"] == "torch.int64"
        assert b["rows_match"], "the data rows are not the rows that 'index' names"
        assert (b["valid"] is not None) == (even == "mask")


def test_reference_permutation_is_independent_of_rank_and_batch():
    """The elastic contract rests on P depending only on (N, seed, epoch): check the helper's premise."""
    for n in (1, 7, 100):
        p = permutation(n, 3, 2)
        assert sorted(p.tolist()) == list(range(n))
        for b, w, r, even in ((4, 3, 2, "drop"), (1, 5, 4, "mask"), (8, 2, 1, "pad")):
            assert np.array_equal(_C.Sampler(n, b, w, r, 3, True, "random", even, True).permutation(2, 0, n), p)
    assert not np.array_equal(permutation(100, 3, 0), permutation(100, 3, 1))
    assert np.array_equal(permutation(10, 3, 0, shuffle=False), np.arange(10))


# ---------------------------------------------------------------------------- 1. sharding
SHARD_NS = {2: (37, 1), 3: (100, 2), 4: (50, 3)}   # not divisible by W, and one N < W
SHARD_B = {2: 5, 3: 4, 4: 3}


def shard_cases(world: int) -> list[dict[str, Any]]:
    cases = []
    for n in SHARD_NS[world]:
        for even in EVENS:
            for drop_last in (False, True):
                cases.append({"name": f"n{n}_{even}_{'droplast' if drop_last else 'keep'}", "N": n,
                              "B": SHARD_B[world], "even": even, "drop_last": drop_last, "seed": 7 + n})
    cases.append({"name": "noshuffle", "N": SHARD_NS[world][0], "B": SHARD_B[world], "even": "pad",
                  "drop_last": False, "shuffle": False})
    return cases


def check_epoch_contract(case: dict[str, Any], world: int, per_rank: list[list[dict]], epoch: int) -> None:
    """One epoch's batches on every rank against the reference and the contract's promises."""
    n, b, even, drop_last = case["N"], case["B"], case["even"], case["drop_last"]
    seed, shuffle = case.get("seed", 0), case.get("shuffle", True)
    name = f"{case['name']} epoch {epoch}"
    counts = [len(batches) for batches in per_rank]
    assert len(set(counts)) == 1, f"{name}: ranks have different batch counts {counts} (DDP would hang)"
    for r, batches in enumerate(per_rank):
        check_batch_format(batches, even)
        ref = reference(n, b, world, r, seed=seed, epoch=epoch, even=even, drop_last=drop_last, shuffle=shuffle)
        assert ids_of(batches) == [ids for ids, _ in ref], f"{name}: rank {r}'s ids differ from the contract"
        if even == "mask":
            assert [bt["valid"] for bt in batches] == [v for _, v in ref], f"{name}: rank {r}'s valid flags"

    perm = permutation(n, seed, epoch, shuffle).tolist()
    everything = [i for batches in per_rank for i in flat(batches)]
    padded = -(-n // world) * world
    g = b * world
    if even == "mask":
        valid = [i for batches in per_rank for bt in batches for i, v in zip(bt["ids"], bt["valid"]) if v]
        invalid = [i for batches in per_rank for bt in batches for i, v in zip(bt["ids"], bt["valid"]) if not v]
        assert len(valid) == len(set(valid)), f"{name}: a valid sample appears twice"
        if not drop_last:
            assert sorted(valid) == list(range(n)), f"{name}: the valid samples do not cover the epoch"
            # The mask marks exactly the padding: the wrapped-around start of P.
            assert sorted(invalid) == sorted(perm[i % n] for i in range(padded - n))
    elif even == "pad":
        if not drop_last:
            assert sorted(everything) == sorted(perm + [perm[i % n] for i in range(padded - n)]), \
                f"{name}: not every sample once plus the wrapped padding"
        assert len(set(everything)) == min(len(everything), n)
    else:  # drop
        assert len(everything) == len(set(everything)), f"{name}: a sample appears twice"
        if not drop_last:
            assert len(everything) == n // world * world
            assert sorted(everything) == sorted(perm[: n // world * world])
    if drop_last:
        kept = (padded if even != "drop" else n // world * world) // g * g
        assert len(everything) == kept, f"{name}: drop_last should keep exactly the full global steps"


@pytest.mark.parametrize("world,discovery", [(2, "dist"), (3, "dist"), (4, "dist"), (3, "env")])
def test_sharding_contract(tmp_path, world, discovery):
    """Every even policy x drop_last, N not divisible by W and N < W; ranks discover rank and
    world size from torch.distributed (with RANK made to lie) or from RANK/WORLD_SIZE."""
    cases = shard_cases(world)
    ranks = launch(tmp_path, "shard", world, {"discovery": discovery, "cases": cases})
    for r, out in enumerate(ranks):
        assert out["initialized"] == (discovery == "dist")
    for case in cases:
        res = [out["results"][case["name"]] for out in ranks]
        for r, rr in enumerate(res):
            assert (rr["rank"], rr["world_size"]) == (r, world), f"{case['name']}: rank discovery ({discovery})"
            assert rr["len"] == len(rr["epoch0"]) == len(rr["epoch1"]), f"{case['name']}: len(loader) on rank {r}"
            assert rr["plan"][0] == flat(rr["epoch0"]), f"{case['name']}: plan(0) differs from iteration, rank {r}"
            assert rr["plan"][1] == flat(rr["epoch1"]), f"{case['name']}: plan(1) differs from iteration, rank {r}"
        for epoch in (0, 1):
            check_epoch_contract(case, world, [rr[f"epoch{epoch}"] for rr in res], epoch)
        if case["N"] >= 10 and case.get("shuffle", True):
            assert [flat(rr["epoch0"]) for rr in res] != [flat(rr["epoch1"]) for rr in res], \
                f"{case['name']}: epochs 0 and 1 have the same order"


# ---------------------------------------------------------------------------- 2. DDP training
def test_ddp_training_uneven_dataset(tmp_path):
    """DistributedDataParallel on 3 ranks, N=100, batch 8: every policy finishes on every rank
    (a rank with one batch fewer would block the gradient all-reduce until the timeout), the
    replicas stay identical, and each epoch counts the samples the policy promises."""
    n, b, world = 100, 8, 3
    cases = [{"name": f"{even}_{dl}", "even": even, "drop_last": dl}
             for even, dl in (("pad", False), ("drop", False), ("mask", False), ("mask", True))]
    ranks = launch(tmp_path, "ddp", world, {"N": n, "B": b, "epochs": 2, "cases": cases})
    for case in cases:
        res = [out["results"][case["name"]] for out in ranks]
        ref = [reference(n, b, world, r, even=case["even"], drop_last=case["drop_last"]) for r in range(world)]
        expected_steps = len(ref[0])
        if case["even"] == "mask":
            expected_samples = sum(v for rr in ref for _, valid in rr for v in valid)
        else:
            expected_samples = sum(len(ids) for rr in ref for ids, _ in rr)
        for r, rr in enumerate(res):
            assert rr["steps"] == [expected_steps] * 2, f"{case['name']}: rank {r} steps"
            assert rr["len"] == expected_steps
            assert rr["global_samples"] == [expected_samples] * 2, f"{case['name']}: samples counted per epoch"
            assert np.isfinite(rr["last_loss"])
            assert rr["params"] == res[0]["params"], f"{case['name']}: DDP replicas diverged"
        if case["even"] == "mask" and not case["drop_last"]:
            assert expected_samples == n  # every sample counted exactly once
    # The shuffled epoch leaves some rank with a batch of nothing but padding under "mask":
    # it still takes part in the all-reduce (its loss is 0 with the weights' graph attached).
    assert any(not any(valid) for rr in (reference(n, b, world, r, even="mask") for r in range(world))
               for _, valid in rr)


# ---------------------------------------------------------------------------- 3. elastic resume
ELASTIC_CASES = [
    {"name": "pad64", "N": 64, "even": "pad", "epoch": 0, "k": 2},             # N divisible by G=16
    {"name": "pad70", "N": 70, "even": "pad", "epoch": 1, "k": 2},
    {"name": "pad70_tail", "N": 70, "even": "pad", "epoch": 0, "k": 4},        # only the partial step left
    {"name": "mask69", "N": 69, "even": "mask", "epoch": 2, "k": 3},
    {"name": "drop69", "N": 69, "even": "drop", "epoch": 0, "k": 1},
    {"name": "pad69_droplast", "N": 69, "even": "pad", "drop_last": True, "epoch": 0, "k": 2},
    {"name": "pad70_end", "N": 70, "even": "pad", "epoch": 0, "k": "all"},     # saved after the whole epoch
]
BATCH_SIZE_CASES = [  # same world size (2), another batch size
    {"name": "bs8_to_3", "N": 70, "B": 8, "B2": 3, "even": "pad", "epoch": 1, "k": 2},
    {"name": "bs4_to_7", "N": 70, "B": 4, "B2": 7, "even": "mask", "epoch": 0, "k": 3},
]


def test_elastic_resume(tmp_path):
    """4 ranks x batch 4 interrupted after k steps (rank 0 saves state_dict with torch.save);
    2 ranks x batch 8 (the same global batch 16) load it and finish the epoch."""
    save_cases = [dict(c, B=4, seed=11) for c in ELASTIC_CASES]
    resume_cases = [dict(c, B=8, seed=11) for c in ELASTIC_CASES]
    state_dir = tmp_path / "states"
    state_dir.mkdir()
    before = launch(tmp_path, "elastic_save", 4, {"cases": save_cases, "state_dir": str(state_dir)})
    after = launch(tmp_path, "elastic_resume", 2, {"cases": resume_cases, "state_dir": str(state_dir),
                                                   "batch_size_cases": [dict(c, seed=5) for c in BATCH_SIZE_CASES]})
    g = 16
    for case in save_cases:
        name, n, even, epoch = case["name"], case["N"], case["even"], case["epoch"]
        drop_last = case.get("drop_last", False)
        kw = dict(seed=11, even=even, drop_last=drop_last)
        a = [out["results"][name] for out in before]
        bb = [out["results"][name] for out in after]
        k = a[0]["k"]
        # The interrupted W=4 run and its state.
        for r in range(4):
            assert ids_of(a[r]["full"]) == ref_ids(n, 4, 4, r, epoch=epoch, **kw), f"{name}: W=4 epoch, rank {r}"
            assert ids_of(a[r]["seen"]) == ref_ids(n, 4, 4, r, epoch=epoch, **kw)[:k], f"{name}: W=4 first steps"
            assert a[r]["state"] == a[0]["state"], f"{name}: ranks saved different states"
        state = a[0]["state"]
        if case["k"] == "all":
            assert (state["epoch"], state["position"]) == (epoch + 1, 0), f"{name}: state after the whole epoch"
        else:
            assert (state["epoch"], state["position"]) == (epoch, k * g), f"{name}: state after {k} steps"
        assert state["global_batch_size"] == g
        # The resumed W=2 run.
        for r in range(2):
            assert bb[r]["loaded"] == state
            assert ids_of(bb[r]["full"]) == ref_ids(n, 8, 2, r, epoch=epoch, **kw), f"{name}: W=2 epoch, rank {r}"
            expected = reference(n, 8, 2, r, epoch=state["epoch"], start=state["position"], **kw)
            assert ids_of(bb[r]["resumed"]) == [ids for ids, _ in expected], f"{name}: resumed ids, rank {r}"
            if even == "mask":
                assert [x["valid"] for x in bb[r]["resumed"]] == [v for _, v in expected]
            assert bb[r]["remaining_len"] == len(bb[r]["resumed"]), f"{name}: len() of the resumed iterator"
            # After the resumed epoch: the next one, from its start.
            assert (bb[r]["state_after"]["epoch"], bb[r]["state_after"]["position"]) == (state["epoch"] + 1, 0)
            assert flat(bb[r]["next_epoch"]) == bb[r]["next_plan"] == \
                sum(ref_ids(n, 8, 2, r, epoch=state["epoch"] + 1, **kw), []), f"{name}: epoch after the resumed one"
            if case["k"] != "all":
                # Resuming at W=2 from step k is the uninterrupted W=2 run from step k: the final
                # partial step follows the new world size.
                assert ids_of(bb[r]["resumed"]) == ids_of(bb[r]["full"])[k:], f"{name}: resumed != W=2 run[k:]"
        assert len(bb[0]["resumed"]) == len(bb[1]["resumed"])
        if case["k"] == "all":
            continue
        # Full global steps: the resumed ones are the uninterrupted W=4 run's steps k, k+1, ...
        resumed_steps = global_steps([bb[r]["resumed"] for r in range(2)])
        w4_steps = global_steps([a[r]["full"] for r in range(4)])
        full_resumed = [s for s in resumed_steps if len(s) == g]
        if name in ("pad64", "pad70", "mask69", "drop69", "pad69_droplast"):
            assert full_resumed, f"{name}: the case should resume some full global steps"
        assert full_resumed == w4_steps[k:k + len(full_resumed)], f"{name}: resumed full global steps differ"
        # Before + after = the whole epoch.
        seen = [i for r in range(4) for i in flat(a[r]["seen"])] + [i for r in range(2) for i in flat(bb[r]["resumed"])]
        perm = permutation(n, 11, epoch).tolist()
        if even == "mask":
            valid = [i for r in range(2) for x in bb[r]["resumed"] for i, v in zip(x["ids"], x["valid"]) if v]
            valid += [i for r in range(4) for i in flat(a[r]["seen"])]  # full steps hold no padding here
            assert sorted(valid) == list(range(n)), f"{name}: valid samples before + after != the epoch once"
        elif even == "drop":
            assert sorted(seen) == sorted(perm[: n // 2 * 2]), f"{name}: drop before + after"
        elif drop_last:
            assert sorted(seen) == sorted(perm[: len(seen)]) and len(seen) == len(set(seen))
        else:
            assert sorted(seen) == sorted(perm + perm[: (-(n - k * g)) % 2]), f"{name}: before + after != epoch"
        if name in ("pad64", "pad70"):
            assert sorted(seen) == list(range(n)), f"{name}: every sample exactly once"

    # Another batch size at the same world size: continue from the same global sample position.
    for case in BATCH_SIZE_CASES:
        name, n, epoch = case["name"], case["N"], case["epoch"]
        kw = dict(seed=5, even=case["even"], epoch=epoch)
        res = [out["results"][name] for out in after]
        pos = case["k"] * case["B"] * 2
        for r in range(2):
            assert res[r]["state"]["position"] == pos and res[r]["state"]["epoch"] == epoch
            assert ids_of(res[r]["seen"]) == ref_ids(n, case["B"], 2, r, **kw)[: case["k"]]
            assert ids_of(res[r]["resumed"]) == ref_ids(n, case["B2"], 2, r, start=pos, **kw), \
                f"{name}: rank {r} did not continue from position {pos} with batch size {case['B2']}"
            assert all(len(x["ids"]) <= case["B2"] for x in res[r]["resumed"])
        seen = [i for r in range(2) for i in flat(res[r]["seen"]) + flat(res[r]["resumed"])]
        assert sorted(seen) == list(range(n)), f"{name}: before + after != every sample once"


# ---------------------------------------------------------------------------- 4. split()
def check_split(case: dict[str, Any], world: int, rank: int,
                res: dict[str, Any]) -> tuple[list[list[int]], list[list[int]]]:
    """One rank's split run; returns its devices' ids for the whole epoch and before+after."""
    n, b, d, k, even = case["N"], case["B"], case["devices"], case["k"], case["even"]
    replicas = world * d
    kw = dict(seed=case["seed"], even=even)
    assert (res["rank"], res["world_size"]) == (rank, world)
    counts = [len(x) for x in res["whole"]]
    assert len(set(counts)) == 1, f"devices got different batch counts {counts}"
    assert res["lens"] == counts, "len() of the split iterators"
    for dev in range(d):
        check_batch_format(res["whole"][dev], even)
        ref = reference(n, b, replicas, rank * d + dev, epoch=0, **kw)
        assert ids_of(res["whole"][dev]) == [ids for ids, _ in ref], f"rank {rank} device {dev}: whole epoch"
        if even == "mask":
            assert [x["valid"] for x in res["whole"][dev]] == [v for _, v in ref]
    # Interrupted after k batches on every device, resumed by a new loader that splits again.
    epoch = case["epoch"]
    state = res["state"]
    assert (state["epoch"], state["position"]) == (epoch, k * b * replicas)
    assert state["global_batch_size"] == b * replicas
    for dev in range(d):
        ref = ref_ids(n, b, replicas, rank * d + dev, epoch=epoch, **kw)
        assert ids_of(res["before"][dev]) == ref[:k], f"rank {rank} device {dev}: first {k} batches"
        assert ids_of(res["after"][dev]) == ref[k:], f"rank {rank} device {dev}: resumed batches"
        assert res["remaining"][dev] == len(ref) - k
    assert (res["state_after"]["epoch"], res["state_after"]["position"]) == (epoch + 1, 0)
    return [flat(x) for x in res["whole"]], [flat(x) + flat(y) for x, y in zip(res["before"], res["after"])]


def check_split_coverage(case: dict[str, Any], replicas: int, per_device: list[list[int]], epoch: int) -> None:
    n = case["N"]
    perm = permutation(n, case["seed"], epoch).tolist()
    everything = sum(per_device, [])
    padded = -(-n // replicas) * replicas
    assert sorted(everything) == sorted(perm + [perm[i % n] for i in range(padded - n)]), \
        "devices do not cover the epoch once (plus the wrapped padding)"
    assert len(set(everything)) == n


def test_split_in_process():
    """One process, split(["cpu"] x 3), each iterator on its own Python thread."""
    worker = _worker_module()
    case = {"N": 50, "B": 4, "devices": 3, "k": 2, "even": "pad", "seed": 3, "epoch": 1}
    res = worker.split_run(case, rank=0, world_size=1)
    whole, resumed = check_split(case, 1, 0, res)
    check_split_coverage(case, 3, whole, 0)
    check_split_coverage(case, 3, resumed, case["epoch"])
    assert res["state"]["world_size"] == 3  # the state records the data-parallel replicas

    # The state of a 3-device split is elastic too: one device with the same global batch (12)
    # continues at the same position.
    single = fl.Loader(worker.dataset(50), batch_size=12, shuffle=True, seed=3, rank=0, world_size=1,
                       with_index=True, device="cpu", num_threads=1)
    single.load_state_dict(res["state"])
    got = [b["index"].tolist() for b in single]
    single.close()
    assert got == ref_ids(50, 12, 1, 0, seed=3, epoch=1, start=res["state"]["position"])


def test_split_two_ranks(tmp_path):
    """2 ranks x split into 3 CPU iterators each: 6 disjoint slices of every global step."""
    cases = [{"name": "pad100", "N": 100, "B": 4, "devices": 3, "k": 2, "even": "pad", "seed": 9, "epoch": 1},
             {"name": "mask101", "N": 101, "B": 3, "devices": 3, "k": 3, "even": "mask", "seed": 4, "epoch": 2}]
    ranks = launch(tmp_path, "split", 2, {"cases": cases})
    for case in cases:
        whole, resumed = [], []
        for r, out in enumerate(ranks):
            w, rs = check_split(case, 2, r, out["results"][case["name"]])
            whole += w
            resumed += rs
        check_split_coverage(case, 6, whole, 0)
        check_split_coverage(case, 6, resumed, case["epoch"])
        states = [out["results"][case["name"]]["state"] for out in ranks]
        assert states[0] == states[1]


# ---------------------------------------------------------------------------- process_group
def test_process_group_subgroups(tmp_path):
    """4 ranks, data-parallel groups {0, 2} and {1, 3} passed as process_group: the loader's rank
    and world size are the group's; the two members of a group see disjoint data covering the
    epoch; ranks with the same group rank (replicas of another parallel dimension) see the same."""
    cases = [{"name": "pad30", "N": 30, "B": 4, "even": "pad", "seed": 2},
             {"name": "mask31", "N": 31, "B": 4, "even": "mask", "seed": 2}]
    ranks = launch(tmp_path, "group", 4, {"cases": cases})
    for case in cases:
        res = [out["results"][case["name"]] for out in ranks]
        for r in range(4):
            assert (res[r]["rank"], res[r]["world_size"]) == (r // 2, 2), f"rank {r}: group rank/size"
            assert res[r]["group_rank"] == r // 2
            assert res[r]["len"] == len(res[r]["epoch0"])
            check_batch_format(res[r]["epoch0"], case["even"])
            assert ids_of(res[r]["epoch0"]) == ref_ids(case["N"], 4, 2, r // 2, seed=2, even=case["even"])
        for group in ((0, 2), (1, 3)):
            first, second = (flat(res[r]["epoch0"]) for r in group)
            if case["even"] == "mask":
                valid = [i for r in group for x in res[r]["epoch0"] for i, v in zip(x["ids"], x["valid"]) if v]
                assert sorted(valid) == list(range(case["N"])), f"group {group}: valid samples != the epoch once"
            else:
                assert not set(first) & set(second), f"group {group}: members share samples"
                assert sorted(first + second) == list(range(case["N"]))
        assert res[0]["epoch0"] == res[1]["epoch0"] and res[2]["epoch0"] == res[3]["epoch0"]
    for r, out in enumerate(ranks):
        assert out["errors"]["not_member"] is not None and out["errors"]["not_member"].startswith("ValueError"), \
            f"rank {r}: a process_group this rank is not in should be a ValueError, got {out['errors']['not_member']}"


# ---------------------------------------------------------------------------- a Mix under torchrun
def test_mix_ranks_under_torchrun(tmp_path):
    """Two ranks read a 3-source Mix in steps: equal step counts (an all_reduce every step), each
    rank's batches those of the in-process loader at its rank, disjoint positions covering every
    global step, the proportions in every batch, and a state every rank agrees on."""
    lengths, weights, b, steps, world = [30, 7, 12], [5, 2, 1], 4, 9, 2
    offsets = [0, 30, 37]
    cfg = {"lengths": lengths, "offsets": offsets, "weights": weights, "B": b, "steps": steps, "seed": 3,
           "save_at": 5}
    ranks = launch(tmp_path, "mix", world, cfg)
    mix = fl.Mix({f"s{j}": fl.Dataset({"x": np.arange(o, o + n, dtype=np.int64)})
                  for j, (n, o) in enumerate(zip(lengths, offsets))}, weights)
    single = fl.Loader(mix, b * world, steps=steps, shuffle=True, seed=3).plan().reshape(steps, b * world)
    for r, out in enumerate(ranks):
        assert (out["rank"], out["world_size"], out["len"]) == (r, world, steps)
        assert len(out["batches"]) == steps
        expected = fl.Loader(mix, b, steps=steps, shuffle=True, seed=3, rank=r, world_size=world).plan()
        assert [i for bt in out["batches"] for i in bt["ids"]] == expected.tolist()
        for s, bt in enumerate(out["batches"]):
            assert bt["rows_match"] and bt["total"] == b * world
            assert bt["ids"] == single[s][r::world].tolist()
            counts = np.bincount(bt["sources"], minlength=3)
            assert all(abs(c - b * w / sum(weights)) < 1 for c, w in zip(counts, weights))
    assert ranks[0]["state"] == ranks[1]["state"] and ranks[0]["state"]["step"] == 5
