"""The chaos harness drives a DataFrame pipeline (``pipeline="dataframe"``, ``--pipeline dataframe``).

The same checker as the Topology matrix: everything the ScriptedSource produced is delivered or
(poison) dead-lettered with its reason, nothing is left pending, and each scenario's own
expectations hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.servers.embedded import EmbeddedServer
from runtime.chaos.errors import ChaosError
from runtime.chaos.runner import run_scenario
from runtime.checker import Report

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _ok(report: Report) -> None:
    print(report.summary())
    assert report.lost == [] and report.leaked == [], report.summary()
    assert [what for what, held in report.expectations if not held] == [], report.summary()
    assert report.ok, report.summary()


def test_fail_rate_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("fail-rate", spark, ft_config, 2000, workdir=tmp_path, pipeline="dataframe")
    _ok(report)
    assert report.delivered == 2000 and report.faults["fail-rate"] > 30


def test_kill_worker_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("kill-worker", spark, ft_config, 2000, workdir=tmp_path, pipeline="dataframe")
    _ok(report)
    assert report.delivered == 2000


def test_poison_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("poison", spark, ft_config, 1500, workdir=tmp_path, pipeline="dataframe", count=2)
    _ok(report)
    assert report.delivered == 1498 and len(report.dead_letters) == 2


def test_batch_fails_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("batch-fails", spark, ft_config, 1800, workdir=tmp_path, pipeline="dataframe")
    _ok(report)
    assert report.delivered == 1800


def test_scenarios_without_a_dataframe_variant_say_so(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    with pytest.raises(ChaosError, match=r"no DataFrame variant.*fail-rate"):
        run_scenario("duplicate-flushes", spark, ft_config, 10, workdir=tmp_path, pipeline="dataframe")
    with pytest.raises(ChaosError, match=r"DataFrame pipeline only"):
        run_scenario("sink-outage", spark, ft_config, 10, workdir=tmp_path)


@pytest.mark.parametrize("durability", ["everysec", "waitaof"])
def test_kill_redis_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path, durability: str) -> None:
    fsync = "always" if durability == "waitaof" else "everysec"
    server = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync=fsync).start()
    try:
        report = run_scenario("kill-redis", spark, ft_config, 3000, workdir=tmp_path / "run", pipeline="dataframe",
                              durability=durability, server=server, down_s=3.0)
    finally:
        server.stop()
    _ok(report)
    assert not any("query died" in n for n in report.notes), report.summary()
    if durability == "waitaof":
        assert report.delivered == 3000 and report.lost_in_window == []
    else:
        assert report.delivered + len(report.lost_in_window) == 3000


@pytest.mark.waits  # tests/waiting_lane.py
def test_long_outage_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    """60 s without the server in the middle of the stream: nothing the source produced is lost and
    the DataFrame query never dies."""
    server = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync="always").start()
    try:
        report = run_scenario("long-outage", spark, ft_config, 3000, workdir=tmp_path / "run", pipeline="dataframe",
                              server=server)
    finally:
        server.stop()
    _ok(report)
    (note,) = [n for n in report.notes if "SIGKILLed" in n]
    assert float(note.split("back after ")[1].split(" s")[0]) >= 60.0, note
    assert not any("query died" in n for n in report.notes), report.summary()
    assert report.records_in == report.delivered == 3000 and report.never_persisted == 0


def test_webhook_driver_front_kill_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("webhook-driver-front-kill", spark, ft_config, 1500, workdir=tmp_path,
                          pipeline="dataframe")
    _ok(report)
    assert report.records_in == report.delivered == 1500


def test_webhook_driver_kill_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("webhook-driver-kill", spark, ft_config, 1500, workdir=tmp_path, pipeline="dataframe")
    _ok(report)
    assert report.records_in == report.delivered == 1500


@pytest.mark.waits  # tests/waiting_lane.py
def test_slow_sink_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("slow-sink", spark, ft_config, 1200, workdir=tmp_path, pipeline="dataframe")
    _ok(report)
    assert report.delivered == 1200 and report.duplicates == 0


@pytest.mark.waits  # tests/waiting_lane.py
def test_sink_outage_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("sink-outage", spark, ft_config, 1200, workdir=tmp_path, pipeline="dataframe")
    _ok(report)
    assert report.delivered == 1200 and report.dead_letters == []


def test_stateful_aggregate_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("aggregate", spark, ft_config, 2000, workdir=tmp_path, pipeline="dataframe")
    _ok(report)
    assert report.records_in == report.delivered == 2000
