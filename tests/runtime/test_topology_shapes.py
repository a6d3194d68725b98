"""Every shape the topology API accepts completes on real Spark, or start() refuses it naming the stream.

Completes means: every source record is acked (no acker entry left), nothing timed out, was
replayed or dead-lettered, and nothing is left under the source. The topologies run with
``max_replays = 0``, so a record that never completes shows up as a dead letter, not a wait.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import TopologyError
from runtime.sinks import ForeachBatchSink, JsonLinesSink
from runtime.spark.row_contract import STAGE_INPUT
from runtime.topology import FTQuery, Topology
from tests.runtime.test_topology_e2e import clicks, run_to_drain

N = 300


def complete_config(ft_config: FTConfig) -> FTConfig:
    return ft_config.replace(timeout_s=30.0, max_replays=0)


def assert_all_completed(query: FTQuery, what: str) -> None:
    stats = query.layers[0].stats()
    print(f"{what}:", {k: stats[k] for k in ("persisted", "acked", "pending", "failed_timeout", "dead_lettered")})
    assert stats["persisted"] == N and stats["acked"] == N, stats
    assert stats["pending"] == 0 and stats["failed_waiting"] == 0, stats
    assert stats["failed_timeout"] == 0 and stats["replayed"] == 0 and stats["dead_lettered"] == 0, stats
    assert query.layers[0].leftovers() == []


def shuffled_columns(query: FTQuery) -> list[str]:
    """The columns of the rows the last micro-batch's (one) keyed exchange shuffled."""
    nodes = [query.query._jsq.streamingQuery().lastExecution().optimizedPlan()]
    while nodes:
        node = nodes.pop()
        if node.nodeName() == "RepartitionByExpression":
            output = node.child().output()
            return [output.apply(i).name() for i in range(output.size())]
        children = node.children()
        nodes.extend(children.apply(i) for i in range(children.size()))
    raise AssertionError("no keyed exchange in the plan")


def start(topo: Topology, spark: Any, tmp_path: Path) -> FTQuery:
    return topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)


@pytest.mark.spark
def test_self_union_delivers_each_record_twice_and_completes(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    topo = Topology("selfunion", complete_config(ft_config))
    out = JsonLinesSink(tmp_path / "out")
    s = topo.source("clicks", clicks(N)).map(lambda e: {"i": e["i"]})
    s.union(s).sink(out)
    query = start(topo, spark, tmp_path)
    run_to_drain(query)
    assert Counter(line["value"]["i"] for line in out.read_all()) == dict.fromkeys(range(N), 2)
    assert_all_completed(query, "self-union")


@pytest.mark.spark
def test_diamond_with_a_keyed_branch_and_a_filter_completes(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    topo = Topology("diamond2", complete_config(ft_config))
    out = JsonLinesSink(tmp_path / "out")
    a = topo.source("clicks", clicks(N))
    b = a.map(lambda e: {**e, "b": 1}).key_by(lambda e: e["user"]).map(lambda e: {"i": e["i"], "via": "b"})
    c = a.filter(lambda e: e["i"] % 2 == 0).map(lambda e: {"i": e["i"], "via": "c"})
    b.union(c).sink(out)
    query = start(topo, spark, tmp_path)
    run_to_drain(query)
    seen = Counter((line["value"]["via"], line["value"]["i"]) for line in out.read_all())
    assert set(seen) == {("b", i) for i in range(N)} | {("c", i) for i in range(0, N, 2)}
    assert set(seen.values()) == {1}
    assert_all_completed(query, "diamond")
    # the keyed exchange carries what the next stage reads (STAGE_INPUT), not key_hash and channel
    assert shuffled_columns(query) == [*STAGE_INPUT.names, "__ftlayer_landing"]


@pytest.mark.spark
def test_a_stream_used_twice_with_two_sinks_completes(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    """One stream feeds a sink directly and a map into a second sink; a record completes when both wrote it."""
    topo = Topology("twosinks", complete_config(ft_config))
    first, second = JsonLinesSink(tmp_path / "first"), JsonLinesSink(tmp_path / "second")
    x = topo.source("clicks", clicks(N)).map(lambda e: {"i": e["i"]})
    x.sink(first)
    x.map(lambda e: {**e, "twice": e["i"] * 2}).sink(second)
    query = start(topo, spark, tmp_path)
    run_to_drain(query)
    assert sorted(line["value"]["i"] for line in first.read_all()) == list(range(N))
    assert sorted(line["value"]["twice"] for line in second.read_all()) == [2 * i for i in range(N)]
    assert_all_completed(query, "two sinks")


def test_a_dangling_branch_is_refused_at_start_naming_the_stream(ft_config: FTConfig) -> None:
    topo = Topology("dangling", ft_config)
    s = topo.source("clicks", clicks(1))

    def enrich(e: Any) -> Any:
        return e

    s.map(enrich).filter(bool)  # never sunk
    s.map(lambda e: e).sink(lambda values: None)
    with pytest.raises(TopologyError, match=r"clicks\.map\(enrich\)\.filter\(bool\).* is never sunk"):
        topo.start(None)


def test_a_source_with_no_consumer_is_refused_naming_it(ft_config: FTConfig) -> None:
    topo = Topology("idle", ft_config)
    topo.source("clicks", clicks(1)).sink(lambda values: None)
    topo.source("idle", clicks(1))
    with pytest.raises(TopologyError, match=r"stream idle \(source\) is never sunk"):
        topo.start(None)


def test_a_driver_sink_next_to_another_sink_is_refused_naming_the_stream(ft_config: FTConfig) -> None:
    topo = Topology("drv", ft_config)
    s = topo.source("clicks", clicks(1))
    s.sink(lambda values: None)
    s.map(str).sink(ForeachBatchSink(lambda values, batch_id: None))
    with pytest.raises(TopologyError, match=r"clicks\.map\(str\).*ForeachBatchSink.*only sink"):
        topo.start(None)
