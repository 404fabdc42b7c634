"""Keeps native threads from outliving the interpreter: every live engine is closed at exit,
and daemon threads still iterating are parked inside next() (see csrc/bindings/exit_parking.h).
(After fork(), the native layer itself refuses to run a parent's engine in the child.)"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from typing import Any

from . import _C

_live: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register(owner: Any) -> None:
    """owner must have a close() method that stops its threads and is safe to call twice."""
    _live.add(owner)


# How long exit waits for iterating daemon threads to reach next() and park.
_PARK_WAIT_S = 2.0


@atexit.register
def _close_all() -> None:
    _C._start_exit_parking()
    for owner in list(_live):
        try:
            owner.close()
        except Exception:  # noqa: BLE001 - exit must not fail on one loader
            pass
    deadline = time.monotonic() + _PARK_WAIT_S
    while time.monotonic() < deadline:
        # Daemon threads still alive that have iterated: each reaches its next next() or iter()
        # within a training step and parks there.
        live = {t.native_id for t in threading.enumerate() if t.daemon and t.native_id is not None}
        if not _C._unparked_iterators(live):
            break
        time.sleep(0.002)

