"""stop_query: a streaming query stopped between micro-batches kills no task.

The unit tests drive a scripted query double through an injected clock (the function under
test only reads ``status``/``isActive`` and calls ``stop``); the Spark test stops a real query
while its micro-batch runs a job of slow tasks.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from runtime.driver.query_stop import stop_query, trigger_active


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class _Query:
    """Trigger active until ``busy_until`` on the clock; records when stop() came."""

    def __init__(self, clock: _Clock, busy_until: float, *, as_dict: bool = True) -> None:
        self.clock, self.busy_until, self.as_dict = clock, busy_until, as_dict
        self.stopped_at: float | None = None

    @property
    def isActive(self) -> bool:  # Spark's name
        return self.stopped_at is None

    @property
    def status(self) -> Any:
        active = self.clock() < self.busy_until
        if self.as_dict:
            return {"message": "", "isDataAvailable": True, "isTriggerActive": active}
        return type("Status", (), {"isTriggerActive": active})()

    def stop(self) -> None:
        if self.stopped_at is None:
            self.stopped_at = self.clock()


@pytest.mark.parametrize("as_dict", [True, False], ids=["classic", "connect"])
def test_waits_for_the_running_batch_then_stops(as_dict: bool) -> None:
    clock = _Clock()
    q = _Query(clock, busy_until=2.5, as_dict=as_dict)
    assert stop_query(q, 10.0, clock=clock, sleep=clock.sleep) is True
    assert q.stopped_at is not None and 2.5 <= q.stopped_at < 2.6  # right after the batch ended


def test_stops_anyway_when_the_grace_runs_out() -> None:
    clock = _Clock()
    q = _Query(clock, busy_until=60.0)
    assert stop_query(q, 3.0, clock=clock, sleep=clock.sleep) is False
    assert q.stopped_at is not None and 3.0 <= q.stopped_at < 3.1


def test_an_idle_query_stops_at_once_and_a_stopped_one_again() -> None:
    clock = _Clock()
    q = _Query(clock, busy_until=0.0)
    assert stop_query(q, 10.0, clock=clock, sleep=clock.sleep) is True and q.stopped_at == 0.0
    assert stop_query(q, 10.0, clock=clock, sleep=clock.sleep) is True  # idempotent
    assert not trigger_active(q)


def test_zero_grace_is_stop_and_a_negative_one_is_refused() -> None:
    clock = _Clock()
    q = _Query(clock, busy_until=5.0)
    assert stop_query(q, 0.0, clock=clock, sleep=clock.sleep) is False and q.stopped_at == 0.0
    with pytest.raises(ValueError, match="grace_s must be >= 0"):
        stop_query(_Query(clock, 0.0), -1.0)


@pytest.mark.spark
def test_a_real_query_stopped_mid_batch_finishes_that_batch(spark: Any, tmp_path: Path) -> None:
    """The batch's job (2 tasks of 1.5 s) runs when the stop is asked for: with stop_query it
    completes and the query stops after it; Spark's stop() would cancel the job (checked by
    calling query.stop() instead: the batch's job failed with a cancellation)."""
    started, outcomes = threading.Event(), []

    def slow(_rows: Any) -> None:
        time.sleep(1.5)

    def write(df: Any, batch_id: int) -> None:
        if batch_id != 1:
            return
        started.set()
        try:
            df.repartition(2).foreachPartition(slow)
            outcomes.append("done")
        except Exception as exc:  # the cancellation is what is looked for
            outcomes.append(f"failed: {type(exc).__name__}")
            raise

    src = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 10).load()
    # a trigger far longer than an empty batch takes, even on a loaded machine: the query must idle
    # between batches for stop_query to find its gap (ci89, 200 ms, a slow hour: batches ran back to
    # back for the whole 30 s grace)
    query = (src.writeStream.foreachBatch(write).trigger(processingTime="2 seconds")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    try:
        assert started.wait(60), "batch 1 never started"
        assert stop_query(query, 30.0) is True
    finally:
        query.stop()
    assert outcomes == ["done"]
    assert not query.isActive and query.exception() is None
