"""FTQuery behaves like a StreamingQuery: triggers, name, progress, awaitTermination, with-block (real Spark)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import TopologyError
from runtime.sinks import JsonLinesSink
from runtime.topology import Topology
from runtime.trigger import trigger_from

pytestmark = pytest.mark.spark


def test_available_now_processes_a_finite_source_and_terminates(
    spark: Any, ft_config: FTConfig, tmp_path: Path
) -> None:
    n = 500

    def slow_finite() -> Any:  # the second half comes 3 s later: start() must wait for the end of the source
        yield from range(n // 2)
        time.sleep(3)
        yield from range(n // 2, n)

    topo = Topology("availnow", ft_config.replace(timeout_s=60.0))
    out = JsonLinesSink(tmp_path / "out")
    topo.source("nums", slow_finite()).map(lambda x: {"x": x}).sink(out)
    with topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), availableNow=True,
                    query_name="ft_avail_now") as query:
        assert query.awaitTermination(300) is True  # ended by itself
        assert not query.isActive and query.exception() is None
        assert query.name == "ft_avail_now"
        assert query.lastProgress is not None and query.lastProgress["name"] == "ft_avail_now"
        assert query.recentProgress and all(p["name"] == "ft_avail_now" for p in query.recentProgress)
        assert query.id == query.lastProgress["id"] and query.runId == query.lastProgress["runId"]
        assert {line["value"]["x"] for line in out.read_all()} == set(range(n))
        stats = query.stats()["nums"]
        assert (stats["persisted"], stats["acked"], stats["pending"]) == (n, n, 0)


def test_with_block_stops_the_query_ingest_and_service(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    def endless() -> Any:
        i = 0
        while True:
            yield i
            i += 1

    topo = Topology("withblock", ft_config.replace(max_pending=200))
    topo.source("nums", endless()).sink(lambda values: None)
    with topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), processingTime="0.2 seconds",
                    query_name="ft_with_block") as query:
        assert query.isActive and query.name == "ft_with_block"
        assert query.status["message"]  # Spark's status dict
        assert query.awaitTermination(0.5) is False  # still running
    assert not query.isActive
    assert all(ing.done for ing in query.ingestors)
    assert query.service is not None and not query.service.alive
    query.stop()  # idempotent


def test_trigger_keywords_are_validated() -> None:
    assert trigger_from().writer_kwargs() == {"processingTime": "500 milliseconds"}
    assert trigger_from(processing_time="0.5 seconds").writer_kwargs() == {"processingTime": "0.5 seconds"}
    assert trigger_from(once=True).writer_kwargs() == {"once": True}
    assert trigger_from(trigger_interval_s=0.2).writer_kwargs() == {"processingTime": "200 milliseconds"}
    with pytest.raises(TopologyError, match="at most one trigger, got processingTime, availableNow"):
        trigger_from(processing_time="1 second", available_now=True)
    with pytest.raises(TopologyError, match="processingTime='soon'"):
        trigger_from(processing_time="soon")
    with pytest.raises(TopologyError, match="continuous"):
        trigger_from(continuous="1 second")
