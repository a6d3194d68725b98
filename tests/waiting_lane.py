"""Under pytest-xdist, the tests marked ``waits`` run one after another on one worker.

A test marked ``waits`` spends most of its time waiting on purpose (a 60 s outage, a 60 s batch,
a stall, a sink down for five timeouts) and little CPU. On 2 cores the suite waits for CPU, so
a waiting test costs nothing while other workers have work; but when two or three of them ran at
once on different workers (worksteal hands each worker a contiguous part of the order, and they
sit near each other there), the CPUs idled: 480-530 s and 570-610 s of a fresh-clone run of
2026-11-27 were 40-80 % busy, with the 60 s batch, the long outage and a stall on three of the
four workers.

So, after ``-m``/``-k`` have deselected (the positions are then the scheduler's), the ``waits``
tests move to the front of the *last* worker's part of the order (worksteal gives the first
``n // w`` to one worker, then a ``1 / (w - 1)`` of the rest to the next, and so on). That worker
runs them first, one at a time, while the others run everything else; steals take from the end
of a queue, so they stay there. Stable and the same in every worker (xdist requires one order).
Without xdist, or with one worker, the order is left alone.
"""

from __future__ import annotations

import os

import pytest

__all__ = ["last_part_start"]


def last_part_start(n: int, workers: int) -> int:
    """Where the last worker's part of ``n`` items starts under worksteal's first distribution."""
    start, remaining = 0, n
    for left in range(workers, 1, -1):
        take = remaining // left
        start += take
        remaining -= take
    return start


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers < 2:
        return
    waiting = [item for item in items if item.get_closest_marker("waits") is not None]
    if not waiting:
        return
    rest = [item for item in items if item.get_closest_marker("waits") is None]
    at = last_part_start(len(items), workers)
    items[:] = rest[:at] + waiting + rest[at:]
