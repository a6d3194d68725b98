"""The receiver chaos scenarios (issue 28 item 5): ``ftlayer ingest --mqtt`` SIGKILLed, the Mosquitto broker
SIGKILLed, ``ftlayer ingest --webhook`` (or its HTTP front process) SIGKILLed under keep-alive batched
clients. Each runs real child processes, a real Redis of its own and a DataFrame query in this process's
SparkSession; each must report lost 0 (runtime.chaos.receivers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from runtime.chaos.runner import run_scenario

pytestmark = pytest.mark.spark


def _assert_ok(report: Any, records: int) -> None:
    print(report.summary())  # shown with -rP / -s, and in the CI log of a failure
    assert report.lost == [], report.summary()
    assert report.leaked == [], report.summary()
    failed = [what for what, held in report.expectations if not held]
    assert failed == [], report.summary()
    assert report.ok, report.summary()
    assert report.records_in == report.delivered == records


@pytest.mark.parametrize(("scenario", "records"), [("mqtt-ingest-kill", 2000), ("mqtt-broker-kill", 1500),
                                                   ("mqtt-ingest-kill", 300)])  # --records 300: still mid-stream
def test_mqtt_receiver_chaos(scenario: str, records: int, mosquitto_binary: Path, spark: Any, ft_config: FTConfig,
                             tmp_path: Path) -> None:
    _assert_ok(run_scenario(scenario, spark, ft_config, records, workdir=tmp_path), records)


@pytest.mark.parametrize("records", [3000, 300])  # --records 300: still requests in flight at the kill
def test_webhook_keepalive_chaos(records: int, spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    _assert_ok(run_scenario("webhook-keepalive", spark, ft_config, records, workdir=tmp_path), records)


def test_webhook_front_kill_chaos(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("webhook-front-kill", spark, ft_config, 3000, workdir=tmp_path)
    _assert_ok(report, 3000)
    assert any("the ingest process lived on with a new front" in what for what, _held in report.expectations)
