"""The chaos scenarios through the effectively-once sinks (issue 27, item 4): ``--sink postgres``,
``delta`` and ``redis`` write every row under its lineage id, and the report counts what the
target holds. Where the lines sink shows a replay twice, the target holds each record once.

- delayed-acks (Topology): a write that outlives the timeout while its records are in flight,
  so they are replayed and written again. With lines: 3 lineage ids written twice
  (``test_matrix.py::test_delayed_acks``); with Postgres, 0. Fails when replays get fresh
  lineage ids (checked).
- kill-driver (DataFrame): the driver SIGKILLed with batches in flight, restarted on the same
  checkpoint: the batches it re-runs and the records that timed out meanwhile reach a Delta table
  once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from runtime.chaos.driver_app import warm_python_workers
from runtime.chaos.errors import ChaosError
from runtime.chaos.runner import run_scenario
from runtime.checker import Report

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module", autouse=True)
def _warm_python_workers(spark: Any) -> None:
    warm_python_workers(spark)


def _once(report: Report, kind: str) -> None:
    print(report.summary())
    assert report.ok, report.summary()
    assert report.lost == [] and report.leaked == [], report.summary()
    assert [what for what, held in report.expectations if not held] == [], report.summary()
    assert report.duplicates == 0 and report.lineage_duplicates == 0, report.summary()
    assert f"sink: {kind} (effectively once, keyed by lineage id)" in report.notes


def test_delayed_acks_replay_written_records_and_postgres_holds_each_once(
    spark: Any, ft_config: FTConfig, tmp_path: Path, postgres: Any,
) -> None:
    report = run_scenario("delayed-acks", spark, ft_config, 2000, workdir=tmp_path, sink="postgres",
                          sink_url=postgres.url)
    _once(report, "postgres")
    assert report.delivered == 2000 and report.lines == 2000
    # the delayed write landed and its records were replayed and written again: dropped by the key
    assert report.stats["failed_timeout"] >= 3 and report.stats["replayed"] >= 3


def test_kill_driver_on_the_dataframe_pipeline_into_delta_holds_each_once(
    ft_config: FTConfig, tmp_path: Path,
) -> None:
    """kill -9 of a DataFrame driver (and its JVM) mid-stream; a restarted driver on the same checkpoint
    delivers everything phase 1 persisted, each record once in the Delta table.

    It is also test_dataframe_chaos.py's kill-driver (the same scenario on the same chaos DataFrame
    pipeline, into the lines sink): everything that test asserted (lost == [], leaked == [], every
    expectation held, report.ok, delivered == 1500) is asserted here, with no duplicate on top. The
    DataFrame driver kill into a plain foreachBatch file writer is
    tests/runtime/test_dataframe_driver_restart.py."""
    report = run_scenario("kill-driver", None, ft_config, 1500, workdir=tmp_path, pipeline="dataframe",
                          sink="delta")
    _once(report, "delta")
    assert report.delivered == 1500 and report.lines == 1500
    assert (tmp_path / "delta" / "_delta_log").is_dir()


def test_a_sink_for_a_scenario_that_writes_no_rows_is_refused(ft_config: FTConfig, tmp_path: Path) -> None:
    with pytest.raises(ChaosError, match="checks its own sink"):
        run_scenario("aggregate", None, ft_config, 10, workdir=tmp_path, pipeline="dataframe", sink="redis")
    with pytest.raises(ChaosError, match="expected one of lines, postgres, delta, redis"):
        run_scenario("fail-rate", None, ft_config, 10, workdir=tmp_path, sink="kafka")
