"""What a Loader's `device` resolves to, with torch.cuda stubbed (no GPU needed): "cuda" gets its
index at construction without initialising CUDA (torch.cuda.current_device() is called only once
PyTorch has initialised CUDA itself), and device=None follows LOCAL_RANK."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload as fl
from fastload import _environment

DS = fl.Dataset({"x": np.arange(10)})


class FakeCuda:
    """torch.cuda as a process with `count` visible GPUs sees it; current_device() fails unless
    CUDA is initialised, because calling it would initialise CUDA."""

    def __init__(self, count: int, initialised_on: int | None = None):
        self.count, self.initialised_on = count, initialised_on

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: self.initialised_on is not None)
        monkeypatch.setattr(torch.cuda, "current_device", self.current_device)

    def current_device(self) -> int:
        if self.initialised_on is None:
            raise AssertionError("torch.cuda.current_device() called before CUDA was initialised: it "
                                 "would initialise CUDA at Loader construction")
        return self.initialised_on


@pytest.fixture
def no_launcher(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return monkeypatch


@pytest.mark.parametrize("count, initialised_on, local_rank, expected", [
    (0, None, None, 0),   # PyTorch sees no GPU (the stand-in driver's case): the first iter() checks
    (0, None, "3", 0),
    (1, None, None, 0),   # PyTorch's current device before anything selects one
    (4, None, None, 0),
    (4, None, "2", 2),    # torchrun, before torch.cuda.set_device(LOCAL_RANK): the rank's GPU
    (1, None, "3", 0),    # one GPU visible per process (CUDA_VISIBLE_DEVICES per rank): the only one
    (8, 5, "2", 5),       # CUDA initialised (set_device(5) was called): PyTorch's current device wins
    (8, 0, None, 0),
])
def test_cuda_gets_its_index_at_construction(no_launcher, count, initialised_on, local_rank, expected):
    FakeCuda(count, initialised_on).install(no_launcher)
    if local_rank is not None:
        no_launcher.setenv("LOCAL_RANK", local_rank)
    for spelling in ("cuda", torch.device("cuda")):
        loader = fl.Loader(DS, batch_size=2, device=spelling)
        assert loader.device == torch.device("cuda", expected)
        assert str(loader.device) == f"cuda:{expected}"
        loader.close()
    assert _environment.resolve_device("cuda") == torch.device("cuda", expected)


@pytest.mark.parametrize("spelling", ["cuda:3", torch.device("cuda", 3)])
def test_an_explicit_index_is_kept(no_launcher, spelling):
    FakeCuda(8, initialised_on=5).install(no_launcher)
    no_launcher.setenv("LOCAL_RANK", "2")
    assert fl.Loader(DS, batch_size=2, device=spelling).device == torch.device("cuda", 3)


def test_none_is_cuda_local_rank_and_explains_a_rank_without_a_gpu(no_launcher):
    FakeCuda(4).install(no_launcher)
    assert fl.Loader(DS, batch_size=2).device == torch.device("cuda", 0)
    no_launcher.setenv("LOCAL_RANK", "3")
    assert fl.Loader(DS, batch_size=2).device == torch.device("cuda", 3)
    FakeCuda(1).install(no_launcher)
    with pytest.raises(ValueError, match=r"LOCAL_RANK=3 and only 1 CUDA device\(s\) are visible"):
        fl.Loader(DS, batch_size=2)


def test_none_is_the_cpu_without_a_gpu(no_launcher):
    FakeCuda(0).install(no_launcher)
    no_launcher.setenv("LOCAL_RANK", "1")
    assert fl.Loader(DS, batch_size=2).device == torch.device("cpu")
    assert fl.Loader(DS, batch_size=2, device="cpu:0").device == torch.device("cpu")


def test_split_resolves_each_cuda_the_same_way(no_launcher):
    FakeCuda(4).install(no_launcher)
    no_launcher.setenv("LOCAL_RANK", "1")
    assert [_environment.resolve_device(d) for d in ("cuda", "cuda:0", "cpu")] == [
        torch.device("cuda", 1), torch.device("cuda", 0), torch.device("cpu")]
