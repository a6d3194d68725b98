"""The fault-injection matrix against a Valkey Cluster (3 primaries, 3 replicas) instead of one
server: the same scenarios, the same checker, ``redis_url`` naming a cluster node. The Redis
kill has its cluster form in ``test_cluster_chaos.py`` (kill -9 of the source's primary)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import TEMP_STATE_DIR, FTConfig
from ftlayer.servers.cluster import EmbeddedCluster
from runtime.chaos.runner import run_scenario
from tests.runtime.chaos.test_matrix import _no_loss_no_leak

pytestmark = pytest.mark.spark


@pytest.fixture
def cluster_config(valkey_cluster: EmbeddedCluster) -> FTConfig:
    return FTConfig(redis_url=valkey_cluster.urls[0], namespace=f"t{uuid.uuid4().hex[:10]}", timeout_s=5.0,
                    state_dir=TEMP_STATE_DIR)


@pytest.mark.parametrize(("scenario", "records"), [
    ("fail-rate", 3000), ("kill-worker", 2000), ("duplicate-flushes", 2000), ("poison", 2000),
    ("drop-connections", 3000),
])
def test_scenario_on_the_cluster(spark: Any, cluster_config: FTConfig, tmp_path: Path, scenario: str,
                                 records: int) -> None:
    report = run_scenario(scenario, spark, cluster_config, records, workdir=tmp_path)
    _no_loss_no_leak(report)
    expected = records - (1 if scenario == "poison" else 0)
    assert report.delivered == expected


def test_delayed_acks_on_the_cluster(spark: Any, cluster_config: FTConfig, tmp_path: Path) -> None:
    """Acks held past the timeout: the records time out and replay on the cluster's buckets, and
    the late acks are ignored (each key of the source lives on one primary, EXPIRE included)."""
    report = run_scenario("delayed-acks", spark, cluster_config, 2000, workdir=tmp_path, delayed=3)
    _no_loss_no_leak(report)
    assert {1997, 1998, 1999} <= set(report.expected_replays)
    assert report.stats["late_deltas"] > 0


def test_mixed_on_the_cluster(spark: Any, cluster_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("mixed", spark, cluster_config, 3000, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert report.delivered == 2999  # all but the poison record
    assert {"fail-rate", "kill-worker", "poison"} <= set(report.faults)


def test_kill_driver_on_the_cluster(spark: Any, cluster_config: FTConfig, tmp_path: Path) -> None:
    """The driver SIGKILLed mid-run and restarted on its checkpoint, its state on the cluster."""
    report = run_scenario("kill-driver", spark, cluster_config, 1500, workdir=tmp_path)
    _no_loss_no_leak(report)
    assert report.delivered == 1500
    assert report.ok, report.summary()
