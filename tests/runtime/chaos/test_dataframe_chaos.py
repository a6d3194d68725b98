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
from runtime.chaos.base import ChaosError
from runtime.chaos.runner import run_scenario
from runtime.checker import Report

pytestmark = pytest.mark.spark


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
