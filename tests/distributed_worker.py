"""The per-rank program that tests/test_distributed.py launches with torchrun.

    python -m torch.distributed.run --nproc_per_node W ... distributed_worker.py MODE CONFIG.json OUT_DIR

Each rank runs MODE with the JSON configuration and writes what it saw (sample ids, valid flags,
batch counts, states) to OUT_DIR/<MODE>_rank<R>.json; the test process checks the files. The
worker asserts little itself: the checks live in the test, where a failure names what differs.
The functions that need no process group (split_run) are imported by the test and also run
in-process.
"""
from __future__ import annotations

import datetime
import json
import os
import sys
import threading
from typing import Any, Callable

import numpy as np
import torch
import torch.distributed as dist

import fastload as fl

_TIMEOUT = datetime.timedelta(seconds=60)  # a collective that waits longer fails instead of hanging


# ---------------------------------------------------------------------------- helpers
def dataset(n: int) -> fl.Dataset:
    # Row i holds i, so every batch can be checked against its "index" column.
    return fl.Dataset({"x": np.arange(n, dtype=np.int64)})


def loader_for(case: dict[str, Any], **kw: Any) -> fl.Loader:
    args = dict(batch_size=case["B"], shuffle=case.get("shuffle", True), seed=case.get("seed", 0),
                even=case.get("even", "pad"), drop_last=case.get("drop_last", False), with_index=True,
                device="cpu", num_threads=1)
    args.update(kw)
    return fl.Loader(dataset(case["N"]), **args)


def record(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One batch as JSON: its ids, its valid flags (None without "valid"), its keys, and whether
    the data rows are the rows the ids name."""
    idx = batch["index"]
    return {
        "ids": idx.tolist(),
        "valid": batch["valid"].tolist() if "valid" in batch else None,
        "keys": sorted(batch),
        "index_dtype": str(idx.dtype),
        "rows_match": bool(torch.equal(batch["x"], idx)),
    }


def take(it: Any, k: int | None = None) -> list[dict[str, Any]]:
    """Records the next k batches of an iterator (all of them when k is None)."""
    out = []
    for batch in it:
        out.append(record(batch))
        if k is not None and len(out) == k:
            break
    return out


def init_dist() -> None:
    dist.init_process_group("gloo", timeout=_TIMEOUT)


def write(out_dir: str, mode: str, rank: int, payload: dict[str, Any]) -> None:
    path = os.path.join(out_dir, f"{mode}_rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)


# ---------------------------------------------------------------------------- modes
def mode_shard(cfg: dict[str, Any], out_dir: str) -> None:
    """Every configuration: len, plan(0), plan(1), and the batches of epoch 0 (plain iter())
    and epoch 1 (after set_epoch(1))."""
    env_rank, env_world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    saved_rank = os.environ["RANK"]
    if cfg["discovery"] == "dist":
        init_dist()
        # Rank discovery must take torch.distributed over the environment: make RANK lie.
        os.environ["RANK"] = str((env_rank + 1) % env_world)
    else:
        assert not dist.is_initialized()
    results = {}
    try:
        for case in cfg["cases"]:
            loader = loader_for(case)
            res: dict[str, Any] = {"rank": loader.rank, "world_size": loader.world_size, "len": len(loader),
                                   "plan": [loader.plan(0).tolist(), loader.plan(1).tolist()]}
            res["epoch0"] = take(iter(loader))
            loader.set_epoch(1)
            res["epoch1"] = take(iter(loader))
            loader.close()
            results[case["name"]] = res
    finally:
        os.environ["RANK"] = saved_rank
    write(out_dir, "shard", env_rank, {"env_rank": env_rank, "env_world": env_world,
                                       "initialized": dist.is_initialized(), "results": results})
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def mode_ddp(cfg: dict[str, Any], out_dir: str) -> None:
    """A short DistributedDataParallel training per configuration on an uneven dataset."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    init_dist()
    rank = dist.get_rank()
    n, b = cfg["N"], cfg["B"]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], dtype=np.float32)).astype(np.float32)
    results = {}
    for case in cfg["cases"]:
        torch.manual_seed(0)
        loader = fl.Loader(fl.Dataset({"x": x, "y": y}), batch_size=b, shuffle=True, seed=1, even=case["even"],
                           drop_last=case["drop_last"], with_index=True, device="cpu", num_threads=1)
        model = DDP(torch.nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        steps, samples, losses = [], [], []
        for epoch in range(cfg["epochs"]):
            loader.set_epoch(epoch)
            count = 0
            counted = torch.zeros(1, dtype=torch.int64)  # samples this rank counted this epoch
            for batch in loader:
                err = (model(batch["x"]) - batch["y"]).pow(2).sum(1)
                if "valid" in batch:
                    w = batch["valid"].to(err.dtype)
                    loss = (err * w).sum() / w.sum().clamp(min=1.0)
                    counted += int(batch["valid"].sum())
                else:
                    loss = err.mean()
                    counted += len(err)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss))
                count += 1
            dist.all_reduce(counted)
            steps.append(count)
            samples.append(int(counted))
        params = torch.cat([p.detach().flatten() for p in model.parameters()])
        results[case["name"]] = {"len": len(loader), "steps": steps, "global_samples": samples,
                                 "params": params.tolist(), "first_loss": losses[0], "last_loss": losses[-1]}
        loader.close()
    write(out_dir, "ddp", rank, {"results": results})
    dist.barrier()
    dist.destroy_process_group()


def mode_elastic_save(cfg: dict[str, Any], out_dir: str) -> None:
    """Per case: an uninterrupted epoch, then an epoch interrupted after k batches whose
    state_dict rank 0 saves (torch.save) for mode_elastic_resume."""
    init_dist()
    rank = dist.get_rank()
    results = {}
    for case in cfg["cases"]:
        full = loader_for(case)
        full.set_epoch(case["epoch"])
        full_batches = take(iter(full))
        full.close()
        loader = loader_for(case)
        loader.set_epoch(case["epoch"])
        k = len(loader) if case["k"] == "all" else case["k"]
        it = iter(loader)
        seen = take(it, k) if k else []
        state = loader.state_dict()
        if rank == 0:
            torch.save(state, os.path.join(cfg["state_dir"], f"state_{case['name']}.pt"))
        loader.close()
        results[case["name"]] = {"full": full_batches, "seen": seen, "state": state, "k": k}
    write(out_dir, "elastic_save", rank, {"results": results})
    dist.barrier()
    dist.destroy_process_group()


def mode_elastic_resume(cfg: dict[str, Any], out_dir: str) -> None:
    """Per case: an uninterrupted epoch at this world size, and the resumed rest of the saved
    epoch followed by the next epoch. Per batch-size case: interrupt at batch size B, resume at
    batch size B2 (same world size)."""
    init_dist()
    rank = dist.get_rank()
    results: dict[str, Any] = {}
    for case in cfg["cases"]:
        full = loader_for(case)
        full.set_epoch(case["epoch"])
        full_batches = take(iter(full))
        full.close()
        state = torch.load(os.path.join(cfg["state_dir"], f"state_{case['name']}.pt"), weights_only=True)
        loader = loader_for(case)
        loader.load_state_dict(state)
        it = iter(loader)
        remaining = len(it)
        resumed = take(it)
        after = loader.state_dict()
        nxt = take(iter(loader))  # the epoch after the resumed one, from its start
        results[case["name"]] = {"full": full_batches, "loaded": state, "remaining_len": remaining,
                                 "resumed": resumed, "state_after": after, "next_epoch": nxt,
                                 "next_plan": loader.plan(state["epoch"] + 1).tolist()}
        loader.close()
    for case in cfg["batch_size_cases"]:
        loader = loader_for(case)
        loader.set_epoch(case["epoch"])
        seen = take(iter(loader), case["k"])
        state = loader.state_dict()
        loader.close()
        other = loader_for(case, batch_size=case["B2"])
        other.load_state_dict(state)
        resumed = take(iter(other))
        other.close()
        results[case["name"]] = {"seen": seen, "state": state, "resumed": resumed}
    write(out_dir, "elastic_resume", rank, {"results": results})
    dist.barrier()
    dist.destroy_process_group()


def _in_threads(fns: list[Callable[[], Any]], timeout: float = 60.0) -> list[Any]:
    """Runs each function in its own thread; returns their results, re-raising the first error."""
    results: list[Any] = [None] * len(fns)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            results[i] = fns[i]()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError("a device thread did not finish within the timeout")
    if errors:
        raise errors[0]
    return results


def split_run(case: dict[str, Any], rank: int | None = None, world_size: int | None = None) -> dict[str, Any]:
    """split() into case["devices"] CPU iterators, each iterated from its own thread: a whole
    epoch; then an epoch interrupted after k batches on every device, resumed by a new loader
    (state_dict/load_state_dict) that splits again."""
    kw = {} if rank is None else {"rank": rank, "world_size": world_size}
    devices = ["cpu"] * case["devices"]
    loader = loader_for(case, **kw)
    its = loader.split(devices)
    lens = [len(it) for it in its]
    whole = _in_threads([lambda it=it: take(it) for it in its])
    len_after_split = len(loader)
    loader.close()

    loader = loader_for(case, **kw)
    loader.set_epoch(case["epoch"])
    its = loader.split(devices)
    before = _in_threads([lambda it=it: take(it, case["k"]) for it in its])
    state = loader.state_dict()
    loader.close()
    resumed_loader = loader_for(case, **kw)
    resumed_loader.load_state_dict(state)
    its = resumed_loader.split(devices)
    remaining = [len(it) for it in its]
    after = _in_threads([lambda it=it: take(it) for it in its])
    state_after = resumed_loader.state_dict()
    resumed_loader.close()
    return {"rank": loader.rank, "world_size": loader.world_size, "lens": lens, "whole": whole,
            "len_after_split": len_after_split, "before": before, "state": state, "remaining": remaining,
            "after": after, "state_after": state_after}


def mode_split(cfg: dict[str, Any], out_dir: str) -> None:
    init_dist()
    rank = dist.get_rank()
    write(out_dir, "split", rank, {"results": {c["name"]: split_run(c) for c in cfg["cases"]}})
    dist.barrier()
    dist.destroy_process_group()


def mode_group(cfg: dict[str, Any], out_dir: str) -> None:
    """Data-parallel subgroups {0, 2} and {1, 3}: the loader takes rank and size from its group."""
    init_dist()
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank creates every group
    mine, other = groups[rank % 2], groups[1 - rank % 2]
    results: dict[str, Any] = {}
    for case in cfg["cases"]:
        loader = loader_for(case, process_group=mine)
        results[case["name"]] = {"rank": loader.rank, "world_size": loader.world_size, "len": len(loader),
                                 "group_rank": dist.get_rank(mine), "epoch0": take(iter(loader))}
        loader.close()
    errors = {}
    for name, kw in (("not_member", {"process_group": other}),
                     ("rank_and_group", {"process_group": mine, "rank": 0, "world_size": 2})):
        try:
            loader_for(cfg["cases"][0], **kw).close()
            errors[name] = None
        except Exception as e:  # noqa: BLE001 - the test checks the type
            errors[name] = f"{type(e).__name__}: {e}"
    write(out_dir, "group", rank, {"results": results, "errors": errors})
    dist.barrier()
    dist.destroy_process_group()


def mode_mix(cfg: dict[str, Any], out_dir: str) -> None:
    """A Mix under torchrun: steps with an all_reduce per step (ranks must agree on the number of
    steps), the batches' ids and sources, and the state after k steps."""
    init_dist()
    rank = dist.get_rank()
    parts = {f"s{j}": fl.Dataset({"x": np.arange(off, off + n, dtype=np.int64)})
             for j, (n, off) in enumerate(zip(cfg["lengths"], cfg["offsets"]))}
    mix = fl.Mix(parts, cfg["weights"], with_source=True)
    loader = fl.Loader(mix, cfg["B"], steps=cfg["steps"], shuffle=True, seed=cfg["seed"], with_index=True,
                       device="cpu", num_threads=1)
    batches, state = [], None
    for k, batch in enumerate(loader):
        total = torch.tensor([len(batch["x"])])
        dist.all_reduce(total)  # a rank with fewer steps would leave the others waiting here
        batches.append({"ids": batch["index"].tolist(), "sources": batch["source"].tolist(),
                        "rows_match": bool(torch.equal(batch["x"], batch["index"])), "total": int(total)})
        if k + 1 == cfg["save_at"]:
            state = loader.state_dict()
    write(out_dir, "mix", rank, {"rank": loader.rank, "world_size": loader.world_size, "len": len(loader),
                                 "batches": batches, "state": state})
    dist.barrier()
    dist.destroy_process_group()


MODES = {"mix": mode_mix, "shard": mode_shard, "ddp": mode_ddp, "elastic_save": mode_elastic_save,
         "elastic_resume": mode_elastic_resume, "split": mode_split, "group": mode_group}


def main() -> None:
    mode, config_path, out_dir = sys.argv[1:4]
    # torchrun starts each rank in its own session: the test ends a hung rank by this pid.
    with open(os.path.join(out_dir, f"pid_rank{os.environ['RANK']}.txt"), "w") as f:
        f.write(str(os.getpid()))
    with open(config_path) as f:
        cfg = json.load(f)
    MODES[mode](cfg, out_dir)
    # Leave without finalising the interpreter. After destroy_process_group(), torch's gloo
    # threads may still be destroying a finished collective's work (AsyncBarrierWork), whose
    # tensors take the GIL to drop their Python objects; if the interpreter is finalising by then,
    # that thread is ended by a forced unwind through a noexcept frame and the rank aborts
    # ("terminate called without an active exception"; a core dump shows
    # ProcessGroupGloo::runLoop -> ~AsyncWork -> TensorImpl::decref_pyobject -> take_gil ->
    # pthread_exit). It is torch's race (4 of 18 runs of the 3-rank DDP test on a loaded
    # machine), not fastload's: fastload's own exit is tested in test_shutdown.py and
    # test_interrupts.py. The results are written and renamed into place before this line.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
