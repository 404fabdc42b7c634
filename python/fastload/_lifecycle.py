"""Keeps native threads from outliving the interpreter: every live engine is closed at exit."""
from __future__ import annotations

import atexit
import weakref
from typing import Any

_live: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register(owner: Any) -> None:
    """owner must have a close() method that stops its threads and is safe to call twice."""
    _live.add(owner)


@atexit.register
def _close_all() -> None:
    for owner in list(_live):
        try:
            owner.close()
        except Exception:  # noqa: BLE001 - exit must not fail on one loader
            pass


# Native threads do not survive fork(): objects made before a fork compare this counter and
# refuse to run (and never touch their native locks) in the child.
fork_generation = 0


def _after_fork_in_child() -> None:
    global fork_generation
    fork_generation += 1


import os as _os  # noqa: E402

if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_after_fork_in_child)
