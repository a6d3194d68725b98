"""The fault-injection matrix on real local Spark and a real Redis server (issue 6).

Each scenario of ``runtime.chaos.runner`` except the soak, at a CI size (thousands of records),
asserting 0 lost and 0 leaked plus what the scenario itself promises. The Redis kill runs
once per durability mode against a dedicated server (``appendfsync always`` for waitaof,
``everysec`` otherwise, as ftlayer configures its embedded server).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.servers.embedded import EmbeddedServer
from runtime.chaos.driver_app import warm_python_workers
from runtime.chaos.runner import run_scenario
from runtime.checker import Report

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module", autouse=True)
def _warm_python_workers(spark: Any) -> None:
    """Start Python workers once, so the first scenario's first batch is not minutes late."""
    warm_python_workers(spark)


def _no_loss_no_leak(report: Report) -> None:
    print(report.summary())  # shown with -rP / -s, and in the CI log of a failure
    assert report.lost == [], report.summary()
    assert report.leaked == [], report.summary()
    assert report.records_in > 0
    failed = [what for what, held in report.expectations if not held]
    assert failed == [], report.summary()
    assert report.ok, report.summary()


def test_fail_rate(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("fail-rate", spark, ft_config, 3000, workdir=tmp_path, rate=0.05)
    _no_loss_no_leak(report)
    assert report.delivered == 3000
    assert report.faults["fail-rate"] > 50  # about 5 % of 3000
    assert report.stats["failed_explicit"] >= report.faults["fail-rate"]


def test_kill_worker(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("kill-worker", spark, ft_config, 2000, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert report.delivered == 2000
    assert report.faults["kill-worker"] >= 1  # the ids the killed attempt had seen


def test_batch_fails_and_query_restarts(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("batch-fails", spark, ft_config, 3000, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert report.delivered == 3000
    assert any("restarted on its checkpoint" in n for n in report.notes), report.notes


def test_kill_driver(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    """The driver (a Topology: a keyed source, a slow map, a sink) and its Spark JVM are SIGKILLed once
    every record is persisted and some are acked; a new driver on the same namespace and checkpoint,
    with a source that has nothing new, delivers every persisted record and leaves nothing behind.
    (It was also tests/runtime/test_driver_restart.py, the same edge on the same path: every
    assertion of that test is here or in the scenario's expectations.)"""
    report = run_scenario("kill-driver", spark, ft_config, 1500, workdir=tmp_path)
    _no_loss_no_leak(report)  # leaked == []: no leftovers(), pending == failed_waiting == 0
    assert report.delivered == report.stats["persisted"] == 1500
    assert report.stats["pending"] == 0 and report.stats["failed_waiting"] == 0
    assert report.stats["dead_lettered"] == 0
    # the scenario's expectations (held, _no_loss_no_leak): killed with records pending, once all
    # 1500 were persisted and some (more than a tenth, fewer than all) acked; the new driver exited 0
    held = {what.split(" (")[0] for what, ok in report.expectations if ok}
    assert {"killed while records were pending", "the restarted driver drained and exited 0"} <= held, held
    # records pending at the kill were settled by the new driver: either Spark's re-run of the
    # interrupted batch acked them, or they timed out and were replayed. Which one depends on
    # timing (it flipped between runs on the unchanged code), so the test asserts what is
    # promised (every record delivered, nothing leaked, the kill landed mid-flight: the
    # scenario's own expectations), not the mechanism.
    assert report.ok, report.summary()


def _lived_through_the_outage(report: Report, down_s: float) -> None:
    """The server was down for at least ``down_s`` (beyond redis-py's own ~0.7 s of retries), and the
    query never died: tasks, the FT source and the FT service waited for the server."""
    (note,) = [n for n in report.notes if "SIGKILLed" in n]
    back_after = float(note.split("back after ")[1].split(" s")[0])
    assert back_after >= down_s, note
    assert not any("query died" in n for n in report.notes), report.summary()
    assert any(what.startswith("the query lived through the outage") and held for what, held in report.expectations)


@pytest.mark.parametrize("durability", ["none", "everysec", "waitaof"])
def test_kill_redis(spark: Any, ft_config: FTConfig, tmp_path: Path, durability: str) -> None:
    fsync = "always" if durability == "waitaof" else "everysec"
    server = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync=fsync).start()
    try:
        report = run_scenario("kill-redis", spark, ft_config, 3000, workdir=tmp_path / "run",
                              durability=durability, server=server, down_s=3.0)
    finally:
        server.stop()
    _lived_through_the_outage(report, 3.0)
    if durability == "waitaof":
        _no_loss_no_leak(report)
        assert report.lost_in_window == []
        assert report.delivered == 3000
    else:
        # everysec (and none, on a server with appendfsync everysec): a SIGKILL of the server
        # process loses at most the persists of the last ~2 s (acknowledged, not yet in the AOF);
        # lost_in_window holds them, report.lost those outside the window (must be none)
        _no_loss_no_leak(report)
        assert report.delivered + len(report.lost_in_window) == 3000


@pytest.mark.waits  # tests/waiting_lane.py
def test_long_outage(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    """The server is down for 60 s in the middle of the stream (SIGKILL, restart from its AOF):
    every record the source produced is delivered and the query never dies."""
    server = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync="always").start()
    try:
        report = run_scenario("long-outage", spark, ft_config, 3000, workdir=tmp_path / "run", server=server)
    finally:
        server.stop()
    _no_loss_no_leak(report)
    _lived_through_the_outage(report, 60.0)
    assert report.records_in == report.delivered == 3000
    assert report.never_persisted == 0


def test_webhook_driver_front_kill(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    """kill -9 of the HTTP front process of a driver's WebhookSource under load: the driver lives on, starts a new
    front on the same port, and every record a client got a 2xx for reaches the sink."""
    report = run_scenario("webhook-driver-front-kill", spark, ft_config, 1500, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert report.records_in == report.delivered == 1500


def test_webhook_driver_kill(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    """kill -9 of a driver fed by HTTP clients that retry every non-2xx answer: every record a client
    got a 2xx for reaches the sink, after a restart on the same namespace, checkpoint and port."""
    report = run_scenario("webhook-driver-kill", spark, ft_config, 1500, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert report.records_in == report.delivered == 1500


def test_drop_connections(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("drop-connections", spark, ft_config, 3000, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert report.delivered == 3000


def test_duplicate_flushes(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("duplicate-flushes", spark, ft_config, 2000, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert report.strict and report.unexplained_replays == []
    assert report.stats["duplicate_flushes"] > 0
    assert report.stats["replayed"] == 0 and report.duplicates == 0
    assert report.stats["acked"] == 2000


def test_delayed_acks(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("delayed-acks", spark, ft_config, 2000, workdir=tmp_path, delayed=3)
    _no_loss_no_leak(report)
    delayed = {1997, 1998, 1999}
    assert delayed <= set(report.expected_replays)
    assert report.stats["late_deltas"] > 0
    assert report.duplicates >= 3  # the late write and the replay both reached the sink
    # each under the same lineage id: what an effectively-once sink drops (test_effectively_once.py)
    assert report.lineage_duplicates == report.duplicates and report.resent == 0


def test_poison(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("poison", spark, ft_config, 2000, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert [i for i, _ in report.dead_letters] == [2000 // 3]
    assert "always fails" in report.dead_letters[0][1]
    assert report.delivered == 1999  # all but the poison record


def test_mixed(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("mixed", spark, ft_config, 3000, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert report.delivered == 2999  # all but the poison record
    assert report.stats["duplicate_flushes"] > 0
    assert {"fail-rate", "kill-worker", "poison"} <= set(report.faults)
