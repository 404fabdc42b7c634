"""Keeps native threads from outliving the interpreter: every live engine is closed at exit.
(After fork(), the native layer itself refuses to run a parent's engine in the child.)"""
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

