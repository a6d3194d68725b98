"""``tests/machine_lock.py``: a timed section has the machine to itself, and only the section does.

Workers are real processes (fork) sharing one run id, as xdist's are; each "test" is
``held_shared()`` around some work, a section ``machine_to_myself()`` inside one. Events are
stamped with a shared counter, so the order is exact, not timed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.machine_lock import held_shared, machine_to_myself

CTX = mp.get_context("fork")


def _stamp(log: Any, counter: Any, event: str) -> None:
    with counter.get_lock():
        counter.value += 1
        log.put((counter.value, event))


def _long_test(run: str, log: Any, counter: Any, started: Any, release: Any) -> None:
    os.environ["PYTEST_XDIST_TESTRUNUID"] = run
    with held_shared():
        _stamp(log, counter, "long:start")
        started.set()
        release.wait(30)
        _stamp(log, counter, "long:end")
    with held_shared():  # the worker's next test
        _stamp(log, counter, "next:start")


def _timed_test(run: str, log: Any, counter: Any, name: str, together: Any) -> None:
    os.environ["PYTEST_XDIST_TESTRUNUID"] = run
    with held_shared():
        _stamp(log, counter, f"{name}:setup")  # untimed part: beside the others
        together.wait(30)  # every timed test of the case holds the lock shared now
        with machine_to_myself():
            _stamp(log, counter, f"{name}:section-start")
            time.sleep(0.2)
            _stamp(log, counter, f"{name}:section-end")
        _stamp(log, counter, f"{name}:rest")


def _join(procs: list[Any], what: str) -> None:
    try:
        for p in procs:
            p.join(30)
            assert p.exitcode == 0, f"{what}: exit code {p.exitcode}"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def _events(log: Any, n: int) -> list[str]:
    return [e for _, e in sorted(log.get(timeout=30) for _ in range(n))]


@pytest.fixture
def run_id() -> Iterator[str]:
    run = f"lock-test-{uuid.uuid4().hex[:8]}"
    yield run
    for suffix in (".gate", ".lock"):  # the run's lock files: every process using them has ended
        (Path(tempfile.gettempdir()) / f"ftlayer-tests-{run}{suffix}").unlink(missing_ok=True)


def test_a_section_waits_for_running_tests_and_no_test_starts_during_it(run_id: str) -> None:
    log, counter = CTX.Queue(), CTX.Value("i", 0)
    started, release = CTX.Event(), CTX.Event()
    long = CTX.Process(target=_long_test, args=(run_id, log, counter, started, release))
    long.start()
    assert started.wait(30)
    timed = CTX.Process(target=_timed_test, args=(run_id, log, counter, "t", CTX.Barrier(1)))
    timed.start()
    time.sleep(0.5)  # the section is waiting now (a wrong lock lets it start: the order below shows it)
    release.set()
    _join([long, timed], "a worker")
    events = _events(log, 7)
    assert events.index("t:setup") < events.index("long:end"), events  # the untimed part ran beside it
    assert events.index("long:end") < events.index("t:section-start"), events
    assert events.index("t:section-end") < events.index("next:start"), events


def test_two_sections_of_two_tests_take_turns_without_deadlock(run_id: str) -> None:
    log, counter, together = CTX.Queue(), CTX.Value("i", 0), CTX.Barrier(2)
    procs = [CTX.Process(target=_timed_test, args=(run_id, log, counter, name, together)) for name in ("a", "b")]
    for p in procs:
        p.start()
    _join(procs, "a section deadlocked")
    events = _events(log, 8)
    for first, second in (("a", "b"), ("b", "a")):
        if events.index(f"{first}:section-start") < events.index(f"{second}:section-start"):
            assert events.index(f"{first}:section-end") < events.index(f"{second}:section-start"), events


def test_without_xdist_both_are_no_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_TESTRUNUID", raising=False)
    with held_shared(), machine_to_myself():
        pass


def test_the_controller_removes_the_run_s_lock_files_and_a_worker_does_not(run_id: str) -> None:
    from types import SimpleNamespace

    from tests.machine_lock import name_the_run, remove_run_files

    files = [Path(tempfile.gettempdir()) / f"ftlayer-tests-{run_id}{suffix}" for suffix in (".gate", ".lock")]
    for f in files:
        f.touch()
    worker = SimpleNamespace(option=SimpleNamespace(testrunuid=run_id, numprocesses=2), workerinput={})
    remove_run_files(worker)  # type: ignore[arg-type]
    assert all(f.exists() for f in files)  # other workers may still be using them
    controller = SimpleNamespace(option=SimpleNamespace(testrunuid=run_id, numprocesses=2))
    remove_run_files(controller)  # type: ignore[arg-type]
    assert not any(f.exists() for f in files)
    unnamed = SimpleNamespace(option=SimpleNamespace(testrunuid=None, numprocesses=2))
    name_the_run(unnamed)  # type: ignore[arg-type]
    assert unnamed.option.testrunuid  # xdist's workers get this id, and the controller knows it
