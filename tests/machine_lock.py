"""The machine to one test for a timed section, under pytest-xdist.

Some tests time a server (a bounded script must not hold it for 100 ms). Other workers' JVMs on
2 cores would time the machine instead: the 200k-timeouts PING bound read 103.6 ms beside two of
them. So a timed section runs while no other worker runs a test.

Only the *section* is exclusive, not the whole test: a test that fills the server with 200k
records first does that beside the others and asks for the machine only around what it times
(the ``alone`` fixture, ``with alone(): ...``). While it waits, no new test starts (so it is not
starved), and the tests already running finish; then it runs by itself, and the suite goes on.

How: a readers-writer lock over all workers of the run (``flock`` on a file named after xdist's
run id). Every test holds it shared from start to end (:func:`held_shared`); a
section converts its own shared hold into an exclusive one. A *gate* file, held exclusively by a
section while it waits and runs, is taken by every test before its shared hold, so no test starts
meanwhile. A section first gives up its shared hold and only then waits at the gate: two sections
of two tests never wait on each other's shared holds (no deadlock). Without xdist both are
no-ops.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

__all__ = ["Alone", "held_shared", "machine_to_myself", "name_the_run", "remove_run_files"]

# what the ``alone`` fixture gives a test: ``with alone(): <the timed section>``
Alone = Callable[[], contextlib.AbstractContextManager[None]]


def _base(run: str | None = None) -> Path | None:
    run = run or os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return None if run is None else Path(tempfile.gettempdir()) / f"ftlayer-tests-{run}"


def name_the_run(config: pytest.Config) -> None:
    """On xdist's controller: choose the run id (``--testrunuid``) unless given, so that the
    controller knows the name of the lock files its workers use (xdist draws one it keeps to itself)."""
    if not hasattr(config, "workerinput") and getattr(config.option, "testrunuid", "unset") is None:
        config.option.testrunuid = uuid.uuid4().hex


def remove_run_files(config: pytest.Config) -> None:
    """On xdist's controller, once every worker has ended: delete the run's gate and lock files (a
    worker must not: another one still running would open a new file of that name, a lock apart)."""
    if hasattr(config, "workerinput"):
        return
    base = _base(getattr(config.option, "testrunuid", None) or "")
    if base is not None and getattr(config.option, "numprocesses", None):
        for suffix in (".gate", ".lock"):
            Path(f"{base}{suffix}").unlink(missing_ok=True)


_held: dict[str, IO[str]] = {}  # this worker's open lock file while a test runs


@contextlib.contextmanager
def held_shared() -> Iterator[None]:
    """Around each test: the lock shared, taken through the gate (waits while a section runs)."""
    base = _base()
    if base is None:
        yield
        return
    with open(f"{base}.gate", "a") as gate, open(f"{base}.lock", "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        _held["lock"] = lock
        try:
            yield
        finally:
            _held.pop("lock", None)
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextlib.contextmanager
def machine_to_myself() -> Iterator[None]:
    """The calling test's section runs while no other worker runs a test (see the module docstring)."""
    base, lock = _base(), _held.get("lock")
    if base is None or lock is None:
        yield
        return
    fcntl.flock(lock, fcntl.LOCK_UN)  # first: a section waiting at the gate holds nothing shared
    with open(f"{base}.gate", "a") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # every running test finished; none starts meanwhile
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_SH)  # the rest of the test holds it shared again
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
