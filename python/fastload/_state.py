"""The resume state: small, versioned, and free of per-sample data."""
from __future__ import annotations

import operator
from typing import Any

STATE_VERSION = 1
_REQUIRED = ("version", "num_samples", "seed", "shuffle", "order", "epoch", "position")


def make_state(*, num_samples: int, seed: int, shuffle: bool, order: str, even: str, drop_last: bool,
               epoch: int, position: int, batch_size: int, replicas: int,
               partition: str = "samples") -> dict[str, Any]:
    """position: the global sample position where the next global step starts."""
    return {
        "version": STATE_VERSION,
        "num_samples": num_samples,
        "seed": seed,
        "shuffle": shuffle,
        "order": order,
        "even": even,
        "drop_last": drop_last,
        "epoch": epoch,
        "position": position,
        "batch_size": batch_size,
        "world_size": replicas,
        "global_batch_size": batch_size * replicas,
        "partition": partition,
    }


def check_state(state: Any, *, num_samples: int, shuffle: bool, order: str,
                partition: str = "samples") -> dict[str, Any]:
    """Validates a state for a loader over num_samples samples; returns it."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise ValueError(f"state is missing {missing}; was it made by Loader.state_dict()?")
    if state["version"] != STATE_VERSION:
        raise ValueError(f"state version {state['version']!r} is not supported (this fastload reads version {STATE_VERSION})")
    if state["num_samples"] != num_samples:
        raise ValueError(
            f"state was saved for a dataset of {state['num_samples']} samples; this loader's dataset has "
            f"{num_samples}: refusing to resume on another dataset"
        )
    if bool(state["shuffle"]) != shuffle or (shuffle and state["order"] != order):
        raise ValueError(
            f"state was saved with shuffle={state['shuffle']}, order={state['order']!r}; this loader has "
            f"shuffle={shuffle}, order={order!r}: the sample order would differ"
        )
    if state.get("partition", "samples") != partition:  # states from before partition= are "samples"
        raise ValueError(
            f"state was saved with partition={state.get('partition')!r}; this loader has partition={partition!r}: "
            "the sample order would differ"
        )
    for key, limit in (("epoch", None), ("position", None), ("seed", 2**64)):
        value = state[key]
        try:
            ok = not isinstance(value, bool) and operator.index(value) >= 0
        except TypeError:
            ok = False
        if not ok or (limit is not None and operator.index(value) >= limit):
            raise ValueError(f"state[{key!r}] must be a non-negative integer"
                             f"{'' if limit is None else ' below 2**64'}, got {value!r}")
    return {**state, "epoch": operator.index(state["epoch"]), "position": operator.index(state["position"]),
            "seed": operator.index(state["seed"])}
