"""What a GPU loader's next() calls when its transfer thread cannot allocate device memory while
the loop waits for a batch: PyTorch's caching allocator may hold the free memory, so it is asked
to give back what it caches, as torch does itself before it raises an out-of-memory error."""
from __future__ import annotations

import torch

from ._machine import torch_sees_gpu


def release_cached(device: int) -> None:
    """Empties PyTorch's CUDA cache (a no-op where torch has no CUDA). `device`: the GPU index."""
    if torch_sees_gpu() and torch.cuda.is_initialized():
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
