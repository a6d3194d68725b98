"""mqtt-driver-kill (issue 28 item 2): a real Spark driver fed by an MQTT subscription on a real Mosquitto is
SIGKILLed under load and restarted with the same client id; every record the broker acknowledged to the
publisher reaches the sink, on both pipelines. The drivers are child processes (runtime.chaos.mqtt), so
this process starts no JVM of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from runtime.chaos.runner import run_scenario

pytestmark = pytest.mark.spark


@pytest.mark.parametrize("pipeline", ["topology", "dataframe"])
def test_mqtt_driver_kill(mosquitto_binary: Path, ft_config: FTConfig, tmp_path: Path, pipeline: str) -> None:
    report = run_scenario("mqtt-driver-kill", None, ft_config, 1500, workdir=tmp_path, pipeline=pipeline)
    print(report.summary())  # shown with -rP / -s, and in the CI log of a failure
    assert report.lost == [], report.summary()
    assert report.leaked == [], report.summary()
    failed = [what for what, held in report.expectations if not held]
    assert failed == [], report.summary()
    assert report.ok, report.summary()
    assert report.records_in == report.delivered == 1500
