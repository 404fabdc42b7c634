"""The resume state: small, versioned, and free of per-sample data."""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import _C

STATE_VERSION = 1
_REQUIRED = ("version", "num_samples", "seed", "shuffle", "order", "epoch", "position")
_ORDER: tuple[str, ...] = tuple(_C.ORDERS)  # the spellings the native sampler parses
_EVEN: tuple[str, ...] = tuple(_C.EVEN_POLICIES)
MAX_EPOCH = 2**62  # epochs are int64 in the core; this leaves room to count on


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


def _state_int(state: dict[str, Any], key: str, low: int, high: int, high_text: str) -> int:
    value = state[key]
    try:
        ok = not isinstance(value, bool) and low <= operator.index(value) <= high
    except TypeError:
        ok = False
    if not ok:
        what = "a non-negative integer" if low == 0 else f"an integer of at least {low}"
        raise ValueError(f"state[{key!r}] must be {what} at most {high_text}, got {value!r}")
    return operator.index(value)


def _state_bool(state: dict[str, Any], key: str) -> bool:
    value = state[key]
    if not isinstance(value, (bool, np.bool_)):  # bool("False") is True: never coerce
        raise ValueError(f"state[{key!r}] must be a bool, got {value!r}")
    return bool(value)


def check_state(state: Any, *, num_samples: int, shuffle: bool, order: str,
                partition: str = "samples") -> dict[str, Any]:
    """Validates a state for a loader over num_samples samples; returns it."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise ValueError(f"state is missing {missing}; was it made by Loader.state_dict()?")
    if state["version"] != STATE_VERSION or isinstance(state["version"], bool):
        raise ValueError(f"state version {state['version']!r} is not supported (this fastload reads version {STATE_VERSION})")
    if isinstance(state["num_samples"], bool) or state["num_samples"] != num_samples:
        raise ValueError(
            f"state was saved for a dataset of {state['num_samples']!r} samples; this loader's dataset has "
            f"{num_samples}: refusing to resume on another dataset"
        )
    saved_shuffle = _state_bool(state, "shuffle")
    if state["order"] not in _ORDER:
        raise ValueError(f"state['order'] must be one of {_ORDER}, got {state['order']!r}")
    if saved_shuffle != shuffle or (shuffle and state["order"] != order):
        raise ValueError(
            f"state was saved with shuffle={state['shuffle']}, order={state['order']!r}; this loader has "
            f"shuffle={shuffle}, order={order!r}: the sample order would differ"
        )
    if state.get("partition", "samples") != partition:  # states from before partition= are "samples"
        raise ValueError(
            f"state was saved with partition={state.get('partition')!r}; this loader has partition={partition!r}: "
            "the sample order would differ"
        )
    # Keys the loader only reports must still be what state_dict() writes, if present.
    if "drop_last" in state:
        _state_bool(state, "drop_last")
    if "even" in state and state["even"] not in _EVEN:
        raise ValueError(f"state['even'] must be one of {_EVEN}, got {state['even']!r}")
    for key in ("batch_size", "world_size", "global_batch_size"):
        if key in state:
            _state_int(state, key, 1, 2**40, "2**40")
    # A mid-epoch position is where a global step starts, inside the dataset (an epoch that has
    # ended is saved as the next epoch at position 0).
    return {**state,
            "epoch": _state_int(state, "epoch", 0, MAX_EPOCH, "2**62"),
            # Whole shards per rank pad every rank to the largest share: positions may pass N.
            "position": (_state_int(state, "position", 0, num_samples, f"the dataset length {num_samples}")
                         if partition == "samples" else _state_int(state, "position", 0, 2**62, "2**62")),
            "seed": _state_int(state, "seed", 0, 2**64 - 1, "2**64 - 1")}
