"""key_by(...).map_with_state(fn): per-key state in the owning partition, saved before the ack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import TopologyError
from runtime.sinks import JsonLinesSink
from runtime.spark.keyed_state import KeyedStateStore
from runtime.topology import Topology
from tests.runtime.test_topology_e2e import clicks, run_to_drain

pytestmark = pytest.mark.spark


def count_per_user(state: dict[str, Any], e: dict[str, Any]) -> list[dict[str, Any]]:
    state["n"] = state.get("n", 0) + 1
    return [{"user": e["user"], "i": e["i"], "n": state["n"]}]


def test_per_user_counts_are_exact_without_failures(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    n = 1200
    topo = Topology("state", ft_config.replace(timeout_s=60.0))  # no timeouts: exact counts
    out = JsonLinesSink(tmp_path / "out")
    topo.source("clicks", clicks(n)).key_by(lambda e: e["user"]).map_with_state(count_per_user, name="counts").sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    run_to_drain(query)
    lines = out.read_all()
    assert sorted(line["value"]["i"] for line in lines) == list(range(n))
    states = KeyedStateStore(query.layers[0].config, "state", "counts").read_all()
    assert {u: s["n"] for u, s in states.items()} == {f"u{k}": len(range(k, n, 37)) for k in range(37)}
    # per user, the running counts seen by the sink are 1..count: every record of a user was
    # processed in one partition, in order within it
    per_user: dict[str, list[int]] = {}
    for line in lines:
        per_user.setdefault(line["value"]["user"], []).append(line["value"]["n"])
    assert all(sorted(v) == list(range(1, len(v) + 1)) for v in per_user.values())


def test_map_with_state_must_follow_key_by(ft_config: FTConfig) -> None:
    topo = Topology("state2", ft_config)
    with pytest.raises(TopologyError, match="directly follow key_by"):
        topo.source("clicks", clicks(1)).map_with_state(count_per_user)
