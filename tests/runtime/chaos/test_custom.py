"""A scenario written with the testing helpers alone, as docs/fault-injection.md shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord, IngestStoppedError
from runtime.checker import check
from runtime.testing import Abort, CollectingSink, Emit, FaultLog, Pause, ScriptedSource
from runtime.topology import Topology

pytestmark = pytest.mark.spark


def test_custom_scenario_with_an_aborting_source(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    faults = FaultLog(tmp_path / "faults")
    # the source breaks after 1500 records: ingest stops, what it read is still processed, and the
    # query reports the error instead of reporting drained
    source = ScriptedSource([Emit(1000), Pause(0.3), Emit(["a", "b"] * 250), Abort(OSError("socket closed")),
                             Emit(100)])
    sink = CollectingSink(tmp_path / "out")

    def flaky(e: dict[str, Any]) -> dict[str, Any]:  # runs in Python workers
        if e["i"] % 100 == 7 and faults.once("flaky", f"i{e['i']}"):
            faults.record("flaky", [e["i"]])
            msg = "flaky"
            raise FailRecord(msg)
        return e

    topo = Topology("custom", ft_config.replace(timeout_s=60.0))  # no timeouts: strict check below
    topo.source("events", source).map(flaky).sink(sink)
    query = topo.start(spark, checkpoint_location=str(tmp_path / "ckpt"), trigger_interval_s=0.2)
    try:
        with pytest.raises(IngestStoppedError, match="socket closed"):
            query.await_drained(180)  # raised once the 1500 records read are settled
        assert query.stats()["events"]["ingest_error"] == 1
        assert query.progress.settled()
        query.query.processAllAvailable()  # the last commit trims the channel streams
    finally:
        query.stop()
    assert isinstance(query.ingestors[0].error, OSError)
    assert [type(e) for e in query.ingest_errors().values()] == [OSError]
    report = check(query, sink, source.emitted_ids, faults, strict=True)
    assert report.ok, report.summary()
    assert report.records_in == 1500 and report.delivered == 1500
    assert set(report.replayed_ids) == faults.affected()["flaky"] and len(report.replayed_ids) == 15
    assert {line["value"].get("value") for line in sink.read()} == {None, "a", "b"}
