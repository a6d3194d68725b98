"""``pytest --cpu-log FILE``: each test's wall time, the CPU its process tree spent, its start and its worker, as TSV.

On a 2-core machine the suite waits for CPU more than for anything else, and ``--durations``
shows wall time only: a test that sleeps 60 s costs little, a driver restart that starts two JVMs
costs a lot. The CPU of a test is read from /proc: the pytest process (an xdist worker under
``-n``) and every process below it, live or already reaped (a reaped child's time is in its
parent's cutime/cstime). Processes that left the tree are not counted: a daemon, or the JVM of
a driver a test killed with -9 (it is re-parented), so driver-kill tests read low. Linux only.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


def tree_cpu_s(root: int) -> float:
    """CPU seconds of ``root`` and its descendants (user + system, reaped children included)."""
    kids, total, todo = _children(), 0, [root]
    while todo:
        pid = todo.pop()
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])
        todo += kids.get(pid, [])
    return total / _TICK


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-log", default=None, metavar="FILE",
                     help="append each test's wall seconds, its process tree's CPU seconds, its start (Unix "
                          "seconds) and its xdist worker to FILE (TSV)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    path = item.config.getoption("--cpu-log")
    if not path:
        return (yield)
    cpu0, t0, started = tree_cpu_s(os.getpid()), time.monotonic(), time.time()
    try:
        return (yield)
    finally:
        cpu, wall = tree_cpu_s(os.getpid()) - cpu0, time.monotonic() - t0
        with open(path, "a") as out:
            worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
            out.write(f"{item.nodeid}\t{wall:.1f}\t{cpu:.1f}\t{started:.1f}\t{worker}\n")
