"""kill -9 of one of two ``ftlayer ingest`` processes feeding a running DataFrame query, and its
restart: every line of the file reaches the sink, duplicates only from the victim's last batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from runtime.chaos.runner import run_scenario

pytestmark = pytest.mark.spark


def test_kill_one_of_two_ingest_processes(spark: Any, ft_config: FTConfig, tmp_path: Path) -> None:
    report = run_scenario("kill-ingest", spark, ft_config, 6000, workdir=tmp_path / "run")
    print("\n" + report.summary())
    assert report.ok, report.summary()
    assert report.lost == [] and report.delivered == 6000
    assert any("SIGKILLed mid-file" in what and held for what, held in report.expectations)
