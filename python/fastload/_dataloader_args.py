"""torch.utils.data.DataLoader's arguments that fastload does not take, each refused with what to
use instead (a migrating user gets a pointer, not a bare TypeError)."""
from __future__ import annotations

from typing import Any

# DataLoader argument -> what to do in fastload.
REPLACEMENTS = {
    "sampler": "fastload samples natively: use shuffle=, seed=, order= (and rank=/world_size= for DDP); "
               "for a weighted or custom order build the dataset in that order",
    "batch_sampler": "fastload builds batches natively: use batch_size=, drop_last=, shuffle=",
    "generator": "use seed= (the order is a pure function of seed and epoch)",
    "prefetch_factor": "use prefetch= (batches in flight per device, all workers together)",
    "multiprocessing_context": "worker processes are always started with 'spawn'; use workers='processes'",
    "in_order": "batches always arrive in order; the order never depends on the workers",
    "pin_memory_device": "batches are copied to device= by the loader itself",
    "snapshot_every_n_steps": "use loader.state_dict() (exact at any batch)",
}


def refuse_dataloader_args(kwargs: dict[str, Any]) -> None:
    for name in kwargs:
        if name in REPLACEMENTS:
            raise TypeError(f"fastload.Loader does not take DataLoader's {name}=: {REPLACEMENTS[name]}")
    if kwargs:
        name = next(iter(kwargs))
        raise TypeError(f"fastload.Loader got an unexpected keyword argument {name!r}")


def describe(indent: str = "    ") -> str:
    """The refused arguments and their replacements, one per line (the Loader's help text)."""
    import textwrap  # noqa: PLC0415 - once, at import, for a docstring

    lines = []
    for name, replacement in REPLACEMENTS.items():
        lines += textwrap.wrap(f"{name}=: {replacement}", width=100 - len(indent) * 2,
                               initial_indent=indent, subsequent_indent=indent * 2)
    return "\n".join(lines).lstrip()
