"""What every benchmark shares: the spread of a figure, a run's wall time and machine CPU, round
directories, namespace clean-up."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis


def summary(values: list[float]) -> dict[str, float]:
    """A figure over its rounds: median, min and max."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC_STAT = Path("/proc/stat")


def machine_busy_cpu_s() -> float | None:
    """CPU seconds every core of this machine has spent busy since boot: user, nice, system, irq,
    softirq and steal time, not idle or I/O wait (the first line of ``/proc/stat``). None where
    there is no ``/proc/stat`` (not Linux).

    Every process counts, whoever started it: the Spark JVM, its Python workers, a source's runner,
    the Redis server, this driver, and anything else running. A benchmark run's difference is its
    cost only on a machine with nothing else running (the benchmarks' rule anyway)."""
    try:
        fields = _PROC_STAT.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(f) for f in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _CLOCK_TICKS_PER_S


class Stopwatch:
    """A run's wall time and the machine's busy CPU, from creation to each :meth:`read`.

    On a machine whose cores a run keeps busy, the run's rate follows its CPU per record: two
    variants of the same job compare by the CPU each spends, and a ratio of rates can be read
    against the ratio of their CPU (the e2e benchmarks report both)."""

    __slots__ = ("_cpu0", "_t0")

    def __init__(self) -> None:
        self._t0 = time.perf_counter()
        self._cpu0 = machine_busy_cpu_s()

    def read(self) -> tuple[float, float | None]:
        """``(seconds, busy CPU seconds)`` since creation; the CPU is None without ``/proc/stat``."""
        seconds = time.perf_counter() - self._t0
        cpu = machine_busy_cpu_s()
        return seconds, (None if cpu is None or self._cpu0 is None else cpu - self._cpu0)


def run_until(query: Any, done: Callable[[], object], poll_s: float = 0.01) -> None:
    """Poll ``done`` until it holds while ``query`` runs; the query's failure, if it fails first, is raised."""
    while True:
        failure = query.exception()
        if failure is not None:
            raise failure
        if done():
            return
        time.sleep(poll_s)


def as_shipped() -> None:
    """In a plain-Spark baseline's task: undo ftlayer's frozen worker heap (``runtime.spark.worker_heap``).

    The variants of a benchmark share one SparkSession, so a plain task may run in a Python
    worker an ftlayer task froze; unfreezing makes PySpark's per-task ``gc.collect()`` cost what
    it costs without ftlayer, so the baseline is PySpark as shipped.
    """
    from runtime.spark.worker_heap import thaw_worker_heap

    thaw_worker_heap()


def delete_namespace(url: str, namespace: str) -> None:
    """Delete every key of a benchmark's throw-away namespace."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
    finally:
        client.close()


@contextmanager
def round_dirs(workdir: Path | None, prefix: str, repeats: int) -> Iterator[list[Path]]:
    """``repeats`` fresh directories ``round1 ...`` under ``workdir``, or under a temporary
    directory (``prefix``) that is removed afterwards if ``workdir`` is None."""
    own = workdir is None
    root = Path(tempfile.mkdtemp(prefix=prefix)) if workdir is None else workdir
    try:
        dirs = [root / f"round{r + 1}" for r in range(repeats)]
        for d in dirs:
            d.mkdir(parents=True, exist_ok=False)
        yield dirs
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)

# a bench stops its Spark query between micro-batches (runtime.driver.query_stop), so the stop kills
# no task and logs no stack trace; a source that never pauses (rate) is stopped after this anyway
BENCH_STOP_GRACE_S = 3.0
