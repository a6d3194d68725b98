"""The Redis effectively-once sink on a real server, on both paths: a replay of a written record
changes nothing a reader sees (issue 27, item 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError
from runtime.idempotent.redis_hash import RedisOnceSink, redis_sink, write_once
from runtime.sinks import SinkContext
from runtime.testing import once
from runtime.topology import Topology
from tests.runtime.test_topology_e2e import clicks, run_to_drain


def test_write_once_creates_each_field_once(redis_server_url: str, namespace: str,
                                            redis_client: redis.Redis) -> None:
    key = f"{namespace}:out"
    items = [(key, f"lid{i}", json.dumps({"i": i})) for i in range(2500)]
    assert write_once(redis_server_url, items) == 2500
    assert write_once(redis_server_url, [(k, f, '{"i": -1}') for k, f, _ in items]) == 0  # a replay
    assert redis_client.hlen(key) == 2500
    assert json.loads(redis_client.hget(key, "lid7")) == {"i": 7}  # type: ignore[arg-type]  # the first write stays


def test_the_topology_sink_keys_by_the_contexts_lineage_ids(redis_server_url: str, namespace: str,
                                                             redis_client: redis.Redis) -> None:
    sink = RedisOnceSink(f"{namespace}:t", url=redis_server_url)
    ctx = SinkContext("0", 0, 0, [1, 2], [1, 2], ["a" * 32, "b" * 32])
    sink.write([{"x": 1}, {"x": 2}], ctx)
    sink.write([{"x": 1}, {"x": 2}], ctx)
    assert sink.created == 2 and redis_client.hgetall(f"{namespace}:t") == {
        b"a" * 32: b'{"x": 1}', b"b" * 32: b'{"x": 2}'}
    with pytest.raises(ValueError, match="2 values but 0 lineage ids"):
        sink.write([{"x": 1}, {"x": 2}], SinkContext("0", 0, 0))


class LandsThenFails(RedisOnceSink):
    """Writes, then reports its first non-empty write as failed: the records are replayed."""

    def __init__(self, key: str, url: str, marks: Path) -> None:
        super().__init__(key, url=url)
        self.marks = marks

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        super().write(values, ctx)
        if values and once(self.marks, "landed-then-failed"):
            msg = "the write landed, the reply was lost"
            raise OSError(msg)


@pytest.mark.spark
def test_topology_replays_of_landed_writes_leave_each_output_once(
    spark: Any, ft_config: FTConfig, tmp_path: Path, redis_client: redis.Redis, namespace: str,
) -> None:
    n = 300
    key = f"{namespace}:topo-out"
    topo = Topology("redisonce", ft_config.replace(timeout_s=30.0))
    sink = LandsThenFails(key, ft_config.redis_url or "", tmp_path / "marks")
    src = topo.source("clicks", clicks(n), key=lambda e: e["user"])
    src.flat_map(lambda e: [{"i": e["i"], "part": p} for p in range(2)]).sink(sink)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    assert query.layers[0].stats()["replayed"] > 0
    values = [json.loads(v) for v in redis_client.hvals(key)]  # type: ignore[union-attr]
    assert sorted((v["i"], v["part"]) for v in values) == [(i, p) for i in range(n) for p in range(2)]


@pytest.mark.spark
def test_a_dataframe_without_lineage_ids_is_refused_naming_the_column(spark: Any) -> None:
    write = redis_sink("redis://unused", "k")
    with pytest.raises(ConfigError, match="no '_ftlayer' column"):
        write(spark.range(3), 0)
