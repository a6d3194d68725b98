"""The end-to-end paths on a real Valkey Cluster (3 primaries, 3 replicas) instead of one server.

The same Spark executors, the same scripts; the client is redis-py's RedisCluster (picked by
``INFO cluster``), the source's keys live on whichever primary owns its hash tag, and every
script runs there with the keys it declares. Each test ends as its single-server twin does:
nothing lost, failures replayed or dead-lettered, nothing left under the source.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import functions as F

import ftlayer
from ftlayer.config import TEMP_STATE_DIR, FTConfig
from ftlayer.errors import FailRecord
from ftlayer.servers.cluster import EmbeddedCluster
from ftlayer.store.connection import is_cluster
from runtime.sinks import JsonLinesSink
from runtime.topology import Topology
from tests.runtime.test_dataframe import Run, _collector
from tests.runtime.test_topology_e2e import clicks, run_to_drain

pytestmark = pytest.mark.spark


@pytest.fixture(params=[1, 16], ids=["one-shard", "16-shards"])
def cluster_config(valkey_cluster: EmbeddedCluster, request: pytest.FixtureRequest) -> FTConfig:
    return FTConfig(redis_url=valkey_cluster.urls[0], namespace=f"t{uuid.uuid4().hex[:10]}", timeout_s=30.0,
                    state_dir=TEMP_STATE_DIR, num_shards=request.param)


def _primaries_used(layer: Any) -> set[int]:
    """Ports of the primaries that hold the source's shards."""
    return {int(s.store.node_client().connection_pool.connection_kwargs["port"]) for s in layer.shards}


def test_topology_with_keys_failures_and_a_poison_record(spark: Any, cluster_config: FTConfig, tmp_path: Path) -> None:
    n = 2000
    topo = Topology("cl", cluster_config.replace(max_replays=2, replay_backoff_initial_s=0.1))
    out = JsonLinesSink(tmp_path / "out")

    def flaky_once(e: dict[str, Any]) -> dict[str, Any]:
        marker = tmp_path / f"failed-{e['i']}"
        if e["i"] % 50 == 0 and not marker.exists():
            marker.write_text("x")
            raise FailRecord("first attempt")
        if e["i"] == 7:
            raise FailRecord("poison", replay=False)
        return e

    (topo.source("clicks", clicks(n)).map(flaky_once).filter(lambda e: not e["bot"])
     .key_by(lambda e: e["user"]).map(lambda e: {**e, "seen": True}).sink(out))
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    layer = query.layers[0]
    assert is_cluster(layer.store.client)
    # one shard: one primary; 16 shards: spread over all three (ftlayer.keyspace.shard_tags)
    assert len(_primaries_used(layer)) == (3 if cluster_config.num_shards == 16 else 1)
    delivered = [line["value"]["i"] for line in out.read_all()]
    assert set(delivered) == {i for i in range(n) if i % 10 != 3 and i != 7}
    stats = layer.stats()
    assert stats["persisted"] == n and stats["pending"] == 0 and stats["dead_lettered"] == 1
    assert stats["replayed"] == n // 50 and stats["failed_timeout"] == 0
    assert layer.leftovers() == []


def test_dataframe_path_with_a_poison_udf_row(spark: Any, cluster_config: FTConfig, tmp_path: Path) -> None:
    r = Run(spark, cluster_config, tmp_path, 1000, max_replays=1, replay_backoff_initial_s=0.1,
            replay_backoff_max_s=0.2)
    assert is_cluster(r.handle.layer.store.client)
    assert len(_primaries_used(r.handle.layer)) == (3 if cluster_config.num_shards == 16 else 1)

    def parse(i: int) -> str:
        if i % 100 == 7:
            msg = f"poison {i}"
            raise ValueError(msg)
        return f"ok{i}"

    rows, write = _collector()
    parsed = r.df.filter(F.col("i") % 4 != 1).withColumn("p", ftlayer.udf(parse, "string", config=r.cfg)("i"))
    r.start(parsed.select("i", "p"), write)
    stats = r.finish(dead=10)  # 7, 107, ..., 907 (none of them filtered: all are 3 mod 4)
    assert {row["i"] for row in rows if row["p"] is not None} == {
        i for i in range(1000) if i % 4 != 1 and i % 100 != 7
    }
    assert stats["acked"] == 990 and stats["failed_timeout"] == 0
