"""Keyed state on a real Valkey Cluster: a kill -9 of the primary that owns the state's slot, then
loads and saves right away; they wait for the replica to take over instead of failing."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
import redis

from ftlayer.config import FTConfig
from ftlayer.servers.cluster import EmbeddedCluster
from runtime.spark.keyed_state import KeyedStateStore


def _count(state: dict[str, Any]) -> int:
    state["n"] = state.get("n", 0) + 1
    return int(state["n"])


@pytest.mark.slow
def test_state_loads_and_saves_ride_out_a_failover(tmp_path: Path) -> None:
    with EmbeddedCluster(primaries=3, replicas=1, data_dir=tmp_path / "cl") as cluster:
        cfg = FTConfig(redis_url=cluster.urls[0], namespace="ks", outage_budget_s=5.0)
        store = KeyedStateStore(cfg, "topo", "counts")
        store.load(["a"])
        assert store.apply("a", _count) == 1
        store.save()
        client = cast(redis.RedisCluster, store._client())
        owner = int(client.get_node_from_key(store.key).port)  # type: ignore[no-untyped-call]
        cluster.kill_primary(owner)
        # straight after the kill: a load of a new key (HMGET) and a save (HSET) meet a dead
        # primary, then CLUSTERDOWN, then the promoted replica
        after = KeyedStateStore(cfg, "topo", "counts")
        after.load(["a", "b"])
        assert after.apply("a", _count) == 2 and after.apply("b", _count) == 1
        after.save()
        assert KeyedStateStore(cfg, "topo", "counts").read_all() == {"a": {"n": 2}, "b": {"n": 1}}
