"""BackgroundSettler: FIFO, bounded, survives a failing job, flush waits for what was submitted."""

from __future__ import annotations

import threading
import time

from runtime.dataframe.settler import BackgroundSettler


def test_jobs_run_in_order_and_flush_waits_for_them() -> None:
    s = BackgroundSettler(max_waiting=2)
    done: list[int] = []
    for i in range(6):
        s.submit(lambda i=i: (time.sleep(0.01), done.append(i)))  # type: ignore[misc]
    assert s.flush(10)
    assert done == list(range(6))


def test_a_failing_job_does_not_stop_the_thread() -> None:
    s = BackgroundSettler()
    done: list[str] = []

    def boom() -> None:
        raise RuntimeError("redis down")

    s.submit(boom)
    s.submit(lambda: done.append("after"))
    assert s.flush(10) and done == ["after"]


def test_submit_blocks_while_max_waiting_jobs_wait() -> None:
    s = BackgroundSettler(max_waiting=1)
    gate = threading.Event()
    s.submit(gate.wait)  # running
    s.submit(lambda: None)  # waiting: the queue is full now
    blocked = threading.Thread(target=s.submit, args=(lambda: None,), daemon=True)
    blocked.start()
    blocked.join(0.3)
    assert blocked.is_alive()  # backpressure: the third submit waits
    gate.set()
    blocked.join(5)
    assert not blocked.is_alive() and s.flush(10)
