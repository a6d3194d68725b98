"""Server outages on the DataFrame path: a failed row is never acked, a driver started during an
outage waits for the server (real Spark; a real server SIGKILLed and restarted from its AOF)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from pyspark.sql import DataFrame

import ftlayer
from ftlayer.config import FTConfig
from ftlayer.errors import RedisUnavailableError
from ftlayer.servers.embedded import EmbeddedServer
from runtime.dataframe import sources
from tests.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync="always").start()
    yield srv
    srv.stop()


def test_a_row_that_fails_while_the_server_restarts_is_dead_lettered_not_acked(
    spark: Any, server: EmbeddedServer, tmp_path: Path,
) -> None:
    """The row function raises while the server is down for ~1.5 s: the call that fails its
    record waits for the server, so the batch's ack at commit skips it. Before, the fail was
    logged and dropped, the batch acked the record, and it was neither written nor replayed."""
    marks = tmp_path / "marks"
    marks.mkdir()
    cfg = FTConfig(redis_url=server.url, namespace="rowout", timeout_s=60.0, max_replays=0, outage_budget_s=60.0)
    name = "rowout" + uuid.uuid4().hex[:6]

    def parse(i: int) -> str:
        if i == 7:
            (marks / "poison-start").touch()
            deadline = time.monotonic() + 60
            while not (marks / "killed").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            msg = "poison row"
            raise ValueError(msg)
        return f"ok{i}"

    def kill_and_restart() -> None:
        wait_until((marks / "poison-start").exists, 120, "the poison row")
        server.kill()
        (marks / "killed").touch()
        time.sleep(1.5)  # longer than redis-py's own quick retries
        server.start()

    chaos = threading.Thread(target=kill_and_restart, daemon=True)
    chaos.start()
    handle = sources.source(name, "events", config=cfg, num_channels=2)
    handle.ingest({"i": i} for i in range(100))
    wait_until(lambda: handle.stats()["persisted"] == 100, 60, "100 persisted")
    rows: list[Any] = []

    def write(df: DataFrame, _batch_id: int) -> None:
        rows.extend(r.asDict() for r in df.collect())

    df = ftlayer.read_stream(spark, name, "events", schema="i long", config=cfg, num_channels=2)
    query = (df.withColumn("p", ftlayer.udf(parse, "string")("i")).select("i", "p").writeStream
             .foreachBatch(ftlayer.acking(write, config=cfg)).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="500 milliseconds").start())
    def settled() -> bool:
        try:
            st = handle.stats()
            return st["acked"] + st["dead_lettered"] == 100 and handle.layer.pending_count() == 0
        except (redis.RedisError, RedisUnavailableError):  # the outage: ask again
            return False

    try:
        wait_until(settled, 240, "every record settled")
    finally:
        query.stop()
        handle.stop()
        chaos.join(10)
    stats = handle.stats()
    assert (marks / "killed").exists()
    assert stats["dead_lettered"] == 1 and stats["acked"] == 99, stats  # the poison row was not acked
    (dead,) = handle.layer.list_dead_letters()
    assert "poison row" in dead.reason
    assert {r["i"] for r in rows if r["p"] is not None} == set(range(100)) - {7}


def test_a_driver_started_during_an_outage_waits_for_the_server(server: EmbeddedServer) -> None:
    cfg = FTConfig(redis_url=server.url, namespace="startout", outage_budget_s=60.0)
    server.kill()
    restarter = threading.Timer(2.0, server.start)
    restarter.start()
    started = time.monotonic()
    try:
        handle = sources.source("startout", "events", config=cfg, num_channels=2)
    finally:
        restarter.join()
    assert time.monotonic() - started >= 1.5  # it waited, then opened the source
    assert handle.layer.recorded_channels() == 2
    handle.stop()


def test_a_driver_gives_up_on_a_server_away_longer_than_the_outage_budget(server: EmbeddedServer) -> None:
    cfg = FTConfig(redis_url=server.url, namespace="startgone", outage_budget_s=1.0, connect_timeout_s=0.5)
    server.kill()
    with pytest.raises(RedisUnavailableError, match="outage_budget_s=1"):
        sources.source("startgone", "events", config=cfg, num_channels=2)
