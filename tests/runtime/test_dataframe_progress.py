"""Timeouts follow progress and sink outages pause, on the DataFrame path (real Spark, real server).

- A batch that runs six times ``timeout_s`` replays nothing: its hold keeps its records from
  timing out while it runs (``ftlayer.acker.holds``).
- A batch that hangs past ``max_batch_s`` has its records time out and replay as usual.
- A sink that fails every write for five times ``timeout_s`` costs nothing: the batch is retried
  in place and no record is failed, replayed or dead-lettered.
- A sink outage longer than the retry budget costs each record at most one replay: the breaker
  keeps replays paused, so even ``max_replays = 1`` dead-letters nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame

from ftlayer.acker.breaker import SinkBreaker
from ftlayer.config import FTConfig
from tests.runtime.test_dataframe import Run

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def run(spark: Any, ft_config: FTConfig, tmp_path: Path) -> Callable[..., Run]:
    return lambda n, **kw: Run(spark, ft_config, tmp_path, n, **kw)


@pytest.mark.waits  # tests/waiting_lane.py
def test_a_60_s_batch_with_timeout_10_s_replays_nothing(run: Callable[..., Run]) -> None:
    r = run(300, timeout_s=10.0, num_buckets=3)
    rows: list[int] = []
    slow = {"first": True}

    def write(df: DataFrame, _batch_id: int) -> None:
        got = [row["i"] for row in df.collect()]  # read: the batch holds these records now
        if got and slow["first"]:
            slow["first"] = False
            time.sleep(60.0)  # a slow sink: a Delta MERGE, a JDBC write, a backlog
        rows.extend(got)

    r.start(r.df.select("i"), write)
    stats = r.finish()
    assert sorted(rows) == list(range(300)), "a record was lost or written twice"
    assert stats["failed_timeout"] == 0 and stats["replayed"] == 0, stats
    assert stats["refiled_held"] > 0, stats  # their timeouts fell due and were postponed


@pytest.mark.waits  # tests/waiting_lane.py
def test_a_batch_that_hangs_past_max_batch_s_times_out_and_completes_late(run: Callable[..., Run]) -> None:
    """Past max_batch_s the hung batch holds nothing: its records time out and are replayed. It
    commits all the same, and its settle completes them late (issue 27 item 3): the copies are
    settled before a later batch reads them, so each record is written once. (Before late
    completions this test expected every timed-out record written twice.)"""
    r = run(200, timeout_s=2.0, num_buckets=3, max_batch_s=5.0)
    rows: list[int] = []
    hang = {"first": True}

    def write(df: DataFrame, _batch_id: int) -> None:
        got = [row["i"] for row in df.collect()]
        if got and hang["first"]:
            hang["first"] = False
            time.sleep(20.0)  # hung well past max_batch_s
        rows.extend(got)

    r.start(r.df.select("i", "_ftlayer.replay"), write)
    r.drained()
    stats = r.handle.stats()
    r.query.stop()
    r.handle.stop()
    assert stats["failed_timeout"] > 0 and stats["replayed"] > 0, stats  # no longer held: they timed out
    assert stats["late_completions"] == stats["failed_timeout"], stats  # every one was in the committed batch
    assert sorted(rows) == list(range(200))  # written once, by the hung batch


def test_a_record_that_times_out_between_two_reads_of_its_batch_is_not_completed_late(
        run: Callable[..., Run]) -> None:
    """A ``foreachBatch`` function that runs two actions (a count, then the write) reads the source
    twice. A record that timed out between the two reads (the batch hung past max_batch_s) is no
    longer pending, so the write does not see it: the batch must not complete it late, its replay
    is what writes it. (Found by chaos delayed-acks --pipeline dataframe --sink delta: the late
    completion settled the copies and the 3 delayed records were lost.)"""
    r = run(20, timeout_s=2.0, num_buckets=3, max_batch_s=1.0)
    rows: list[int] = []
    hang = {"first": True}

    def write(df: DataFrame, _batch_id: int) -> None:
        if df.count() and hang["first"]:  # the first read of the batch
            hang["first"] = False
            deadline = time.monotonic() + 30.0
            while r.handle.stats()["replayed"] < 20 and time.monotonic() < deadline:
                time.sleep(0.1)  # until every record of the batch timed out and was replayed
        rows.extend(row["i"] for row in df.collect())  # the write: a second read

    r.start(r.df.select("i"), write)
    stats = r.drained()
    r.query.stop()
    r.handle.stop()
    assert stats["failed_timeout"] >= 20 and stats["replayed"] >= 20, stats
    assert sorted(rows) == list(range(20)), stats  # written once each, by their replays


@pytest.mark.waits  # tests/waiting_lane.py
def test_a_sink_down_for_five_timeouts_costs_no_replay(run: Callable[..., Run]) -> None:
    r = run(400, timeout_s=4.0, num_buckets=3)  # defaults otherwise: in-place retries, breaker
    rows: list[int] = []
    down_until: list[float] = []
    seen_open: list[bool] = []

    def write(df: DataFrame, _batch_id: int) -> None:
        got = [row["i"] for row in df.collect()]
        if got and not down_until:
            down_until.append(time.monotonic() + 5 * 4.0)
        if down_until and time.monotonic() < down_until[0]:
            store = r.handle.layer.store
            seen_open.append(SinkBreaker(store.client, store.keys).is_open(store.now_ms()))
            msg = "sink unreachable"
            raise ConnectionError(msg)
        rows.extend(got)

    r.start(r.df.select("i"), write)
    stats = r.finish()
    assert sorted(rows) == list(range(400))
    assert stats["dead_lettered"] == 0 and stats["failed_explicit"] == 0 and stats["replayed"] == 0, stats
    assert stats["failed_timeout"] == 0, stats
    assert len(seen_open) >= 4 and any(seen_open), seen_open  # retried with the breaker open
    store = r.handle.layer.store
    assert SinkBreaker(store.client, store.keys).state() is None  # closed by the write that succeeded


@pytest.mark.waits  # tests/waiting_lane.py
def test_an_outage_past_the_retry_budget_spends_at_most_one_replay_per_record(run: Callable[..., Run]) -> None:
    r = run(300, timeout_s=4.0, num_buckets=3, sink_retry_budget_s=2.0, max_replays=1)
    rows: list[int] = []
    down_until: list[float] = []

    def write(df: DataFrame, _batch_id: int) -> None:
        got = [row["i"] for row in df.collect()]
        if got and not down_until:
            down_until.append(time.monotonic() + 8.0)
        if down_until and time.monotonic() < down_until[0]:
            msg = "sink unreachable"
            raise ConnectionError(msg)
        rows.extend(got)

    r.start(r.df.select("i"), write)  # stateless: a batch that gives up fails its records
    stats = r.finish()
    assert set(rows) == set(range(300))
    assert stats["dead_lettered"] == 0, stats  # replays waited for the sink instead of failing again
    assert stats["failed_explicit"] == stats["replayed"] > 0, stats
    assert r.handle.service is not None and r.handle.service.paused_ticks > 0
