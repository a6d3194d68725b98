"""The benchmarks' shared measures: the machine's busy CPU from /proc/stat, and the run stopwatch."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from runtime.bench import common
from runtime.bench.common import Stopwatch, machine_busy_cpu_s


def test_busy_cpu_is_every_state_but_idle_and_io_wait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice, then a line per core
    stat.write_text("cpu  1000 50 300 9000 400 20 10 5 0 0\ncpu0 500 25 150 4500 200 10 5 2 0 0\n")
    monkeypatch.setattr(common, "_PROC_STAT", stat)
    assert machine_busy_cpu_s() == pytest.approx((1000 + 50 + 300 + 20 + 10 + 5) / common._CLOCK_TICKS_PER_S)


@pytest.mark.parametrize("text", ["", "intr 1 2 3\n", "cpu0 1 2 3 4 5 6 7 8\n"])
def test_no_aggregate_cpu_line_is_no_figure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    stat = tmp_path / "stat"
    stat.write_text(text)
    monkeypatch.setattr(common, "_PROC_STAT", stat)
    assert machine_busy_cpu_s() is None


def test_without_proc_stat_a_stopwatch_times_and_gives_no_cpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "_PROC_STAT", tmp_path / "missing")
    watch = Stopwatch()
    seconds, cpu = watch.read()
    assert seconds >= 0 and cpu is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/stat is Linux's")
def test_a_stopwatch_counts_at_least_the_cpu_this_process_spent() -> None:
    watch = Stopwatch()
    own0 = time.process_time()
    while time.process_time() - own0 < 0.3:  # 0.3 s of this process's CPU
        sum(range(1000))
    own = time.process_time() - own0
    seconds, cpu = watch.read()
    assert cpu is not None
    # the machine's busy time holds this process's (to /proc/stat's tick of 10 ms per core)
    assert cpu >= own - 0.05
    assert seconds >= own * 0.5  # two cores at most could have run it in half the wall time
