"""A DistributedDataParallel training loop fed by fastload; runs on CPU (gloo) or GPUs (nccl).

    torchrun --nproc_per_node 2 examples/train_ddp.py

Each rank gets its own disjoint part of every global step; all ranks get the same number of
steps (even="pad"), so the gradient all-reduce never waits on a rank that ran out of data.
"""
import os

import numpy as np
import torch
import torch.distributed as dist

import fastload as fl


def main() -> None:
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rng = np.random.default_rng(0)  # same data on every rank; the loader splits it
    x = rng.standard_normal((10_001, 32)).astype(np.float32)
    y = (x @ rng.standard_normal(32) > 0).astype(np.int64)

    # rank and world_size come from torch.distributed; device from LOCAL_RANK when a GPU is usable
    loader = fl.Loader(fl.Dataset({"x": x, "y": y}), batch_size=64, shuffle=True, seed=0)
    device = loader.device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(32, 2).to(device), device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            loss = torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
            opt.zero_grad()
            loss.backward()
            opt.step()
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: {len(loader)} steps per rank, loss {loss.item():.3f}")
    state = loader.state_dict()  # save with your checkpoint; load_state_dict() resumes mid-epoch
    dist.destroy_process_group()
    if int(os.environ.get("RANK", 0)) == 0:
        print("done; resume state:", state)


if __name__ == "__main__":
    main()
