"""Polling instead of fixed sleeps: wait for a condition, fail the test naming it on a timeout."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_until(cond: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.02) -> None:
    """Return as soon as ``cond()`` is true; fail the test ("timed out waiting for <what>") after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out waiting for {what} ({timeout_s:g} s)")
        time.sleep(every_s)
