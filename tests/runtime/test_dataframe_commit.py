"""Acked means committed, on the DataFrame path: a stateful query loses nothing when a batch fails
after its write and before Spark's commit log entry, or when its write keeps failing.

The fault is real: a directory stands where Spark must write the batch's commit log file, so
``commitLog.add`` fails after the sink (``foreachBatch`` function or the acking writer's
commit) returned and the query stops with CONCURRENT_STREAM_LOG_UPDATE. The directory is then
removed and the query restarted on the same checkpoint: Spark re-runs the batch from its offset
log, which must read the same still-pending records. Every final count must be whole (50 per
user); when batches were acked at the sink's return, half of them were missing.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import TaskContext
from pyspark.sql import DataFrame

import ftlayer
from ftlayer.config import FTConfig
from runtime.dataframe import sources

pytestmark = [pytest.mark.spark, pytest.mark.slow]

USERS = 4
PER_USER = 50
WAIT_S = 180.0


def _records(lo: int, hi: int) -> list[dict[str, Any]]:
    return [{"i": i, "user": f"u{i % USERS}"} for i in range(lo, hi)]


def _wait(what: str, cond: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.2)


class Aggregate:
    """A ``groupBy(user).count()`` in complete mode over a fresh source, with a checkpoint."""

    def __init__(self, spark: Any, cfg: FTConfig, tmp: Path) -> None:
        self.spark = spark
        self.cfg = cfg.replace(timeout_s=60.0)
        self.tmp = tmp
        self.ck = tmp / "ck"
        self.name = "agg" + uuid.uuid4().hex[:8]
        self.handle = sources.source(self.name, "events", config=self.cfg, num_channels=2)

    def counts(self) -> DataFrame:
        df = ftlayer.read_stream(self.spark, self.name, "events", schema="i long, user string", config=self.cfg,
                                 num_channels=2)
        return df.groupBy("user").count()

    def ingest(self, lo: int, hi: int) -> None:
        self.handle.ingest(_records(lo, hi))
        _wait(f"{hi} persisted", lambda: self.handle.stats()["persisted"] >= hi)

    def committed(self, batch: int) -> bool:
        return (self.ck / "commits" / str(batch)).is_file()

    def block_commit(self, batch: int) -> None:
        """A directory where Spark must write the commit log file of ``batch``: that write fails."""
        (self.ck / "commits" / str(batch)).mkdir(parents=True)

    def unblock_commit(self, batch: int) -> None:
        (self.ck / "commits" / str(batch)).rmdir()

    def drained(self) -> bool:
        st = self.handle.stats()
        return st["acked"] == 2 * USERS * PER_USER and self.handle.layer.pending_count() == 0

    def run_through_a_failed_commit(self, start: Callable[[], Any]) -> dict[str, int]:
        """Batch 0 commits; batch 1 fails at its commit log entry; a restart completes it."""
        self.ingest(0, USERS * PER_USER)
        query = start()
        try:
            _wait("batch 0 committed and acked", lambda: self.committed(0) and self.drained_upto(USERS * PER_USER))
            self.block_commit(1)
            self.ingest(USERS * PER_USER, 2 * USERS * PER_USER)
            _wait("batch 1 to fail at its commit log entry", lambda: query.exception() is not None)
            assert "CONCURRENT_STREAM_LOG_UPDATE" in str(query.exception()) or "commit" in str(query.exception())
        finally:
            query.stop()
        pending = self.handle.layer.pending_count()
        assert pending > 0, "the failed batch acked its records before Spark committed it"
        self.unblock_commit(1)
        query = start()  # same checkpoint: Spark re-runs batch 1 from its offset log
        try:
            _wait("every record acked", self.drained)
            assert query.exception() is None
        finally:
            query.stop()
        return self.handle.stats()

    def drained_upto(self, n: int) -> bool:
        return self.handle.stats()["acked"] >= n and self.handle.layer.pending_count() == 0


@pytest.fixture
def agg(spark: Any, ft_config: FTConfig, tmp_path: Path) -> Iterator[Aggregate]:
    a = Aggregate(spark, ft_config, tmp_path)
    yield a
    a.handle.stop()


def test_foreach_batch_aggregate_keeps_every_count_when_a_batch_fails_before_its_commit(agg: Aggregate) -> None:
    latest: dict[str, int] = {}

    def write(df: DataFrame, _batch_id: int) -> None:
        rows = {r["user"]: r["count"] for r in df.collect()}
        latest.clear()
        latest.update(rows)

    def start() -> Any:
        return (agg.counts().writeStream.outputMode("complete")
                .foreachBatch(ftlayer.acking(write, config=agg.cfg))
                .option("checkpointLocation", str(agg.ck)).trigger(processingTime="300 milliseconds").start())

    stats = agg.run_through_a_failed_commit(start)
    assert latest == {f"u{k}": 2 * PER_USER for k in range(USERS)}, latest
    assert stats["failed_timeout"] == stats["replayed"] == 0, stats


def test_acking_writer_aggregate_keeps_every_count_when_a_batch_fails_before_its_commit(
    agg: Aggregate, tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    out.mkdir()

    def write_rows(rows: Iterator[Any]) -> None:
        ctx = TaskContext.get()
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else "x"
        lines = [json.dumps({"user": r["user"], "count": r["count"]}) for r in rows]
        (out / f"{batch}-{uuid.uuid4().hex}.jsonl").write_text("\n".join(lines))

    fmt = ftlayer.acking_sink(agg.spark, write_rows, name=f"ftlayer-sink-{agg.name}", config=agg.cfg)

    def start() -> Any:
        return (agg.counts().writeStream.outputMode("complete").format(fmt)
                .option("checkpointLocation", str(agg.ck)).trigger(processingTime="300 milliseconds").start())

    stats = agg.run_through_a_failed_commit(start)
    last = max(int(p.name.split("-")[0]) for p in out.iterdir())
    final = {}
    for p in out.glob(f"{last}-*.jsonl"):
        for line in p.read_text().splitlines():
            if line:
                row = json.loads(line)
                final[row["user"]] = row["count"]
    assert final == {f"u{k}": 2 * PER_USER for k in range(USERS)}, final
    assert stats["failed_timeout"] == stats["replayed"] == 0, stats


def test_a_stateful_write_that_keeps_failing_stops_the_query_and_a_restart_counts_each_record_once(
    agg: Aggregate, tmp_path: Path,
) -> None:
    """``on_error="auto"``: the plan keeps state, so when the retries are spent the batch must not
    commit (replaying its records would count them twice): the query stops, and the restart
    re-runs the batch."""
    agg.cfg = agg.cfg.replace(sink_retry_budget_s=1.0)
    latest: dict[str, int] = {}
    sink_up = {"up": True}

    def write(df: DataFrame, _batch_id: int) -> None:
        rows = {r["user"]: r["count"] for r in df.collect()}
        if not sink_up["up"]:
            msg = "sink down"
            raise OSError(msg)
        latest.clear()
        latest.update(rows)

    def start() -> Any:
        return (agg.counts().writeStream.outputMode("complete")
                .foreachBatch(ftlayer.acking(write, config=agg.cfg))
                .option("checkpointLocation", str(agg.ck)).trigger(processingTime="300 milliseconds").start())

    agg.ingest(0, USERS * PER_USER)
    query = start()
    try:
        _wait("batch 0 acked", lambda: agg.drained_upto(USERS * PER_USER))
        sink_up["up"] = False
        agg.ingest(USERS * PER_USER, 2 * USERS * PER_USER)
        _wait("the query to stop on the sink's error", lambda: query.exception() is not None)
    finally:
        query.stop()
    st = agg.handle.stats()
    assert st["failed_explicit"] == 0 and agg.handle.layer.pending_count() > 0, st  # nothing failed or acked
    sink_up["up"] = True
    query = start()
    try:
        _wait("every record acked", agg.drained)
    finally:
        query.stop()
    assert latest == {f"u{k}": 2 * PER_USER for k in range(USERS)}, latest
