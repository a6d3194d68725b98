"""What every benchmark shares: the spread of a figure, round directories, namespace clean-up."""

from __future__ import annotations

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
