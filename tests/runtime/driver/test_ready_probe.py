"""ReadyProbe: a ready_check run one at a time, never waited on longer than its timeout."""

from __future__ import annotations

import threading

from runtime.driver.ready_probe import ReadyProbe
from tests.waiting import wait_until


def test_a_hanging_check_is_waited_on_once_then_reported_until_it_returns() -> None:
    release = threading.Event()
    runs: list[int] = []

    def check() -> None:
        runs.append(1)
        release.wait(30)

    probe = ReadyProbe(check, timeout_s=0.2)
    assert probe.check() == "the ready check did not answer within 0.2 s"
    again = probe.check()  # answered at once, and no second check started beside the hung one
    assert again is not None and again.startswith("the ready check has not answered for ")
    assert len(runs) == 1
    release.set()
    wait_until(lambda: probe.check() is None, 10, "the check to answer again")
    assert len(runs) >= 2


def test_a_failing_check_says_why_and_no_check_is_ready() -> None:
    def check() -> None:
        msg = "connection refused"
        raise ConnectionError(msg)

    assert ReadyProbe(check).check() == "the ready check failed: ConnectionError: connection refused"
    assert ReadyProbe(None).check() is None and not ReadyProbe(None).configured
