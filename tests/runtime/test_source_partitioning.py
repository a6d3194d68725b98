"""A source's partitioning strategy: live routing and replay routing follow it, on real Spark."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord, TopologyError
from runtime.sinks import JsonLinesSink
from runtime.testing import once
from runtime.topology import Topology


def test_unknown_strategy_is_refused_naming_the_source(ft_config: FTConfig) -> None:
    topo = Topology("parts", ft_config)
    with pytest.raises(TopologyError, match=r"source 'events'.*unknown partitioning 'broadcast'.*'global'"):
        topo.source("events", range(3), partitioning="broadcast")


def test_fields_needs_a_key_and_a_key_needs_fields(ft_config: FTConfig) -> None:
    topo = Topology("parts", ft_config)
    with pytest.raises(TopologyError, match="'fields' needs key"):
        topo.source("a", range(3), partitioning="fields")
    with pytest.raises(TopologyError, match="only used by partitioning='fields', not 'shuffle'"):
        topo.source("b", range(3), key=lambda v: v, partitioning="shuffle")


@pytest.mark.spark
def test_global_source_and_its_replays_stay_in_channel_0(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    marks = tmp_path / "marks"

    def fail_once(v: int) -> int:
        if v % 10 == 0 and once(marks, str(v)):
            raise FailRecord("replay me")
        return v

    cfg = ft_config.replace(num_channels=3)
    topo = Topology("parts", cfg)
    out = JsonLinesSink(tmp_path / "out", with_meta=True)
    topo.source("events", range(200), partitioning="global").map(fail_once).sink(out)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    try:
        assert query.await_drained(180), query.stats()
    finally:
        query.stop()
    lines = out.read_all()
    assert {line["value"] for line in lines} == set(range(200))
    replays = [line for line in lines if line["replay"]]
    assert len(replays) == 20
    assert {line["partition"] for line in lines} == {0}
