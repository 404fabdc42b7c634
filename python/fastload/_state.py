"""The resume state: small, versioned, and free of per-sample data."""
from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import _C
from ._arguments import MAX_GLOBAL_BATCH

STATE_VERSION = 1
_REQUIRED = ("version", "num_samples", "seed", "shuffle", "order", "epoch", "position")
_ORDER: tuple[str, ...] = tuple(_C.ORDERS)  # the spellings the native sampler parses
_EVEN: tuple[str, ...] = tuple(_C.EVEN_POLICIES)
MAX_EPOCH = 2**62  # epochs are int64 in the core; this leaves room to count on


def make_state(*, num_samples: int, seed: int, shuffle: bool, order: str, even: str, drop_last: bool,
               epoch: int, position: int, batch_size: int, replicas: int, global_batch: int,
               partition: str = "samples") -> dict[str, Any]:
    """position: the global sample position where the next global step starts; global_batch:
    the LoaderConfig's (batch_size x replicas)."""
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
        "global_batch_size": global_batch,
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
    if "packing" in state:
        raise ValueError("state was saved by a loader over fl.Pack's packed rows; this loader reads unpacked "
                         "samples: the order would differ")
    if state.get("mode") == "stream":
        raise ValueError("state was saved by a step-based loader (steps= or a Mix); this loader runs epochs of one "
                         "source without steps=: the sample order would differ")
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
            _state_int(state, key, 1, MAX_GLOBAL_BATCH, "2**40")
    # A mid-epoch position is where a global step starts, inside the dataset (an epoch that has
    # ended is saved as the next epoch at position 0).
    return {**state,
            "epoch": _state_int(state, "epoch", 0, MAX_EPOCH, "2**62"),
            # Whole shards per rank pad every rank to the largest share: positions may pass N.
            "position": (_state_int(state, "position", 0, num_samples, f"the dataset length {num_samples}")
                         if partition == "samples" else _state_int(state, "position", 0, 2**62, "2**62")),
            "seed": _state_int(state, "seed", 0, 2**64 - 1, "2**64 - 1")}


# ---------------------------------------------------------------------------- step-based streams
STREAM_STATE_VERSION = 2
_STREAM_REQUIRED = ("version", "mode", "num_samples", "names", "seed", "shuffle", "order", "epoch", "step",
                    "global_batch_size", "schedule", "positions")


def make_stream_state(*, names: list[str], num_samples: list[int], seed: int, shuffle: bool, order: str,
                      steps: int | None, epoch: int, step: int, batch_size: int, replicas: int, global_batch: int,
                      steps_per_epoch: int | None, schedule: dict[str, Any], positions: list[int],
                      weights_given: Any = None) -> dict[str, Any]:
    """step: the global step of the next batch; positions: every source's stream position there;
    schedule: the anchor (global batch, exact weights, origin, base positions) and its integer
    quotas (base, shares, phase), which a resume with the same configuration continues."""
    return {
        "version": STREAM_STATE_VERSION,
        "mode": "stream",
        "names": list(names),
        "num_samples": list(num_samples),
        "seed": seed,
        "shuffle": shuffle,
        "order": order,
        "steps": steps,
        "epoch": epoch,
        "step": step,
        "steps_per_epoch": steps_per_epoch,
        "batch_size": batch_size,
        "world_size": replicas,
        "global_batch_size": global_batch,
        "weights": weights_given,
        "schedule": dict(schedule),
        "positions": list(positions),
    }


def _int_list(state: dict[str, Any], where: str, value: Any, count: int, high: int) -> list[int]:
    if not isinstance(value, (list, tuple)) or len(value) != count:
        raise ValueError(f"state{where} must be a list of {count} integers, got {value!r}")
    return [_state_int({"v": v}, "v", 0, high, str(high)) for v in value]


def check_stream_state(state: Any, *, names: list[str], num_samples: list[int], shuffle: bool, order: str,
                       stream: bool = True) -> dict[str, Any]:
    """Validates a state for a step-based loader over these sources; returns the parsed fields
    (epoch, step, seed, global_batch, origin, base_positions, weights, positions)."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from Loader.state_dict(), got {type(state).__name__}")
    if state.get("mode") != "stream":
        raise ValueError("state was saved by a loader without steps= or a Mix (epoch by epoch over one source); this "
                         "loader runs a step-based stream (steps= or a Mix): the sample order would differ")
    missing = [k for k in _STREAM_REQUIRED if k not in state]
    if missing:
        raise ValueError(f"state is missing {missing}; was it made by Loader.state_dict()?")
    if state["version"] != STREAM_STATE_VERSION or isinstance(state["version"], bool):
        raise ValueError(f"stream state version {state['version']!r} is not supported (this fastload reads version "
                         f"{STREAM_STATE_VERSION})")
    saved_names = state["names"]
    if not isinstance(saved_names, list) or len(saved_names) != len(names):
        raise ValueError(f"state was saved for {len(saved_names) if isinstance(saved_names, list) else saved_names!r} "
                         f"sources {saved_names!r}; this loader has {len(names)}: {names}")
    if list(saved_names) != list(names):
        raise ValueError(f"state was saved for the sources {saved_names}; this loader's are {names}: refusing to "
                         "resume on other sources")
    if list(state["num_samples"]) != list(num_samples) or any(isinstance(n, bool) for n in state["num_samples"]):
        raise ValueError(f"state was saved for sources of {state['num_samples']!r} samples; this loader's have "
                         f"{num_samples}: refusing to resume on other data")
    if _state_bool(state, "shuffle") != shuffle or (shuffle and state["order"] != order):
        raise ValueError(f"state was saved with shuffle={state['shuffle']}, order={state['order']!r}; this loader has "
                         f"shuffle={shuffle}, order={order!r}: the sample order would differ")
    schedule = state["schedule"]
    if not isinstance(schedule, dict):
        raise ValueError(f"state['schedule'] must be a dict, got {schedule!r}")
    for key in ("global_batch_size", "weights", "origin", "base_positions"):
        if key not in schedule:
            raise ValueError(f"state['schedule'] is missing {key!r}; was it made by Loader.state_dict()?")
    from ._stream_plan import parse_weights  # noqa: PLC0415 - _stream_plan imports nothing from here

    n = len(names)
    return {
        "epoch": _state_int(state, "epoch", 0, MAX_EPOCH, "2**62"),
        "step": _state_int(state, "step", 0, 2**62, "2**62"),
        "seed": _state_int(state, "seed", 0, 2**64 - 1, "2**64 - 1"),
        "global_batch": _state_int(state, "global_batch_size", 1, MAX_GLOBAL_BATCH, "2**40"),
        "anchor_batch": _state_int(schedule, "global_batch_size", 1, MAX_GLOBAL_BATCH, "2**40"),
        "origin": _state_int(schedule, "origin", 0, 2**62, "2**62"),
        "base_positions": _int_list(state, "['schedule']['base_positions']", schedule["base_positions"], n, 2**62),
        "weights": parse_weights(schedule["weights"], n),
        "positions": _int_list(state, "['positions']", state["positions"], n, 2**62),
    }


# The readers of a saved state's fields, for the other schedules' states (_pack_schedule.py).
state_bool, state_int = _state_bool, _state_int
