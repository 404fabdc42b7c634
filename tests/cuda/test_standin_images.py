"""Images onto the GPU, against the stand-in driver (tests/fake_cuda): uint8 batches of decoded
images cross the transfer engine byte for byte (a quarter of float32's bytes), and the recipe
docs/images.md gives for normalising them on the device after the copy computes what
torchvision's ToDtype(float32, scale=True) + Normalize computes on the host.

The stand-in's "device" memory is host memory torch cannot compute on, so the copy runs through
the stand-in (in a child process: the driver is loaded once per process, and the other stand-in
tests configure their own) and the recipe's arithmetic runs on the bytes read back."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: fake_cuda, image_reference
from fake_cuda import build as fake_build  # noqa: E402
from image_reference import encode, photo, write  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU is present: tests/cuda covers it")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def normalize_on_device(x: torch.Tensor, mean=MEAN, std=STD) -> torch.Tensor:
    """docs/images.md's recipe: a uint8 (batch, 3, H, W) image batch, already on the GPU, cast and
    normalised there (one fused pass over the bytes the copy moved)."""
    m = torch.tensor(mean, device=x.device).mul(255).view(1, 3, 1, 1)
    inv = torch.tensor(std, device=x.device).mul(255).reciprocal().view(1, 3, 1, 1)
    return x.float().sub_(m).mul_(inv)


CHILD = """
    import ctypes, json, os, sys
    import numpy as np, fastload as fl
    root = sys.argv[1]
    spec = fl.Image(40, flip=0.5, layout="CHW")
    def loader(device):
        l = fl.Loader(fl.ImageFolder(root, image=spec), batch_size=6, shuffle=True, seed=3, device=device,
                      num_threads=2)
        l._raw_device_batches = device != "cpu"
        return l
    cpu = [b["image"].numpy() for b in loader("cpu")]
    gpu = []
    for b in loader("cuda:0"):
        part = b["image"]
        gpu.append(np.frombuffer(part.read(), dtype=np.uint8).reshape(part.shape))
    lib = ctypes.CDLL(os.environ["FASTLOAD_LIBCUDA"])
    misuses = lib.fake_cuda_misuse_count()
    print(json.dumps({"batches": len(gpu), "equal": all((a == b).all() for a, b in zip(cpu, gpu)),
                      "shape": list(gpu[0].shape), "misuses": misuses}))
    np.save(os.path.join(root, "first.npy"), gpu[0])
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu_images")
    for k in range(14):
        write(root / f"c{k % 2}" / f"{k}.jpg", encode(photo(60 + 3 * k, 80, seed=k), "JPEG", quality=90))
    return root


def test_uint8_images_cross_the_transfer_engine_and_normalise_as_torchvision(folder, tmp_path):
    lib = fake_build.build(tmp_path / "fake_cuda")
    env = {**os.environ, "FASTLOAD_LIBCUDA": str(lib)}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD), str(folder)], env=env, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"batches": 3, "equal": True, "shape": [6, 3, 40, 40], "misuses": 0}, result
    # The recipe on the bytes the copy delivered = torchvision's float pipeline on the host.
    x = torch.from_numpy(np.load(folder / "first.npy"))
    recipe = normalize_on_device(x)
    reference = (x.float() / 255 - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    assert recipe.dtype == torch.float32 and recipe.shape == (6, 3, 40, 40)
    torch.testing.assert_close(recipe, reference, rtol=1e-5, atol=1e-5)
    assert x.element_size() * 4 == recipe.element_size()  # the copy moved a quarter of the bytes
