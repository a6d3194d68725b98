"""``tests/waiting_lane.py``: the ``waits`` tests land at the front of one worker's part, by xdist's own
work-stealing scheduler (its first distribution run on fake workers), not by a copy of its rule."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from xdist.scheduler.worksteal import WorkStealingScheduling

from tests.waiting_lane import last_part_start, pytest_collection_modifyitems


class _Worker:
    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[int] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.sent.extend(indices)

    def shutdown(self) -> None:  # xdist's answer to a worker with too little to steal from
        self.shutting_down = True


def _first_parts(n: int, workers: int) -> list[list[int]]:
    """Each worker's first share of ``n`` items, as xdist's worksteal scheduler hands them out."""
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"] if name == "tx" else None)
    sched = WorkStealingScheduling(config)  # type: ignore[arg-type]
    nodes = [_Worker(f"gw{i}") for i in range(workers)]
    names = [f"t{i}" for i in range(n)]
    for node in nodes:
        sched.add_node(node)  # type: ignore[arg-type]
        sched.add_node_collection(node, names)  # type: ignore[arg-type]
    sched.schedule()
    return [node.sent for node in nodes]


@pytest.mark.parametrize(("n", "workers"), [(1354, 4), (1000, 3), (7, 4), (2, 2), (1358, 5)])
def test_last_part_start_is_where_worksteal_starts_its_last_worker(n: int, workers: int) -> None:
    parts = _first_parts(n, workers)
    assert [i for part in parts for i in part] == list(range(n))
    assert parts[-1][:1] == ([last_part_start(n, workers)] if parts[-1] else [])


class _Item:
    def __init__(self, name: str, waits: bool) -> None:
        self.name = name
        self.waits = waits

    def get_closest_marker(self, name: str) -> Any:
        return object() if name == "waits" and self.waits else None


def test_waiting_tests_open_the_last_workers_part_in_their_order(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "4")
    items: list[Any] = [_Item(f"t{i}", waits=i in (3, 50, 51, 99)) for i in range(100)]
    pytest_collection_modifyitems(items)
    names = [item.name for item in items]
    at = last_part_start(100, 4)
    assert names[at : at + 4] == ["t3", "t50", "t51", "t99"]
    assert [n for n in names if n not in ("t3", "t50", "t51", "t99")] == \
        [f"t{i}" for i in range(100) if i not in (3, 50, 51, 99)]
    # the last worker's first tests are the waiting ones, one after another
    assert _first_parts(100, 4)[-1][:4] == list(range(at, at + 4))


def test_without_xdist_the_order_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    items: list[Any] = [_Item(f"t{i}", waits=i % 3 == 0) for i in range(10)]
    before = list(items)
    pytest_collection_modifyitems(items)
    assert items == before
