"""The matrix's delayed-acks and mixed faults on the DataFrame pipeline (``runtime.chaos.df_matrix``).

- delayed-acks: the write of the last 3 records stalls until they timed out and their copies were
  filed (the test polls the counters, no fixed sleep); Spark commits the batch afterwards and the
  settle completes them late, so each record is written once, even into plain JSON lines. With the
  late completion turned off in BATCH_SETTLE, the copies are read by the next batch and written
  again: 3 ids twice (checked).
- mixed: fail-rate, a worker exit, a poison record and dropped connections on a keyed pipeline.

kill-executor needs two executor JVMs: ``test_local_cluster.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from runtime.chaos.driver_app import warm_python_workers
from runtime.chaos.runner import run_scenario
from runtime.checker import Report

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module", autouse=True)
def _warm_python_workers(spark: Any) -> None:
    warm_python_workers(spark)  # a cold first batch outlives max_batch_s = 2 s and replays its records


def _ok(report: Report) -> None:
    print(report.summary())
    assert [what for what, held in report.expectations if not held] == [], report.summary()
    assert report.ok and report.lost == [] and report.leaked == [], report.summary()


def test_delayed_acks_dataframe_a_timeout_in_flight_still_writes_each_record_once(
    spark: Any, ft_config: FTConfig, tmp_path: Path,
) -> None:
    report = run_scenario("delayed-acks", spark, ft_config, 60, workdir=tmp_path, pipeline="dataframe")
    _ok(report)
    assert report.stats["failed_timeout"] >= 3 and report.stats["replayed"] >= 3, report.summary()
    assert report.delivered == report.lines == 60 and report.duplicates == 0, report.summary()


def test_mixed_dataframe(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("mixed", spark, ft_config, 1000, workdir=tmp_path, pipeline="dataframe")
    _ok(report)
    assert report.delivered == 999 and len(report.dead_letters) == 1  # all but the poison record
    assert {"fail-rate", "kill-worker", "poison"} <= set(report.faults)
