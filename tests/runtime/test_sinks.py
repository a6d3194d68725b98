"""Sinks on real Spark and Redis: each acks only after its write succeeded."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from runtime.sinks import CallableSink, ForeachBatchSink, RedisHashSink
from runtime.topology import Topology
from tests.runtime.test_topology_e2e import clicks, run_to_drain

pytestmark = pytest.mark.spark


def test_foreach_batch_sink_gets_every_value_and_acks_on_the_driver(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    got: list[Any] = []
    batches: list[int] = []

    def collect(values: list[Any], batch_id: int) -> None:
        got.extend(values)
        batches.append(batch_id)

    topo = Topology("fbs", ft_config)
    topo.source("clicks", clicks(700)).map(lambda e: e["i"]).sink(ForeachBatchSink(collect))
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    assert sorted(got) == list(range(700)) and batches
    assert query.layers[0].stats()["acked"] == 700
    assert query.layers[0].leftovers() == []


def test_redis_hash_sink_writes_then_acks(
    spark: Any, ft_config: FTConfig, tmp_path: Path, redis_client: redis.Redis
) -> None:
    key = f"{ft_config.namespace}:out:users"
    topo = Topology("rhs", ft_config)
    (
        topo.source("clicks", clicks(500), key=lambda e: e["user"])
        .map(lambda e: {"user": e["user"], "i": e["i"]})
        .sink(RedisHashSink(lambda v: key, lambda v: str(v["i"]), json.dumps))
    )
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    written = redis_client.hgetall(key)
    assert sorted(int(k) for k in written) == list(range(500))
    assert json.loads(written[b"7"])["user"] == "u7"
    assert query.layers[0].stats()["acked"] == 500


def flaky_write(marks: Path) -> Any:
    def write(values: list[Any]) -> None:
        marks.mkdir(exist_ok=True)
        try:
            os.close(os.open(marks / "failed-once", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            with (marks / "written.jsonl").open("a") as fh:
                fh.writelines(json.dumps(v) + "\n" for v in values)
            return
        msg = "sink unavailable"
        raise ConnectionError(msg)

    return write


def test_failed_write_fails_its_records_and_they_are_replayed(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    marks = tmp_path / "marks"
    topo = Topology("flakysink", ft_config.replace(max_replays=2))
    topo.source("clicks", clicks(400)).map(lambda e: e["i"]).sink(CallableSink(flaky_write(marks)))
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    written = [json.loads(line) for line in (marks / "written.jsonl").read_text().splitlines()]
    assert sorted(set(written)) == list(range(400))
    stats = query.layers[0].stats()
    assert stats["failed_explicit"] > 0 and stats["replayed"] == stats["failed_explicit"]
    assert stats["dead_lettered"] == 0 and query.layers[0].leftovers() == []
