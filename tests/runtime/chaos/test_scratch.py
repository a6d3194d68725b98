"""A chaos scenario's SIGKILLed driver leaves its Spark scratch files in the scenario's workdir, which
the scenario removes: not in /tmp, where a killed JVM's own clean-up never runs."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from runtime.chaos.base import SPARK_SCRATCH, ScenarioContext, remove_scratch, spawn_driver

pytestmark = pytest.mark.spark


def test_a_killed_driver_s_spark_scratch_is_in_the_workdir_and_removed_with_the_scenario(tmp_path: Path) -> None:
    ctx = ScenarioContext("scratch", None, FTConfig(), tmp_path)
    proc = spawn_driver(ctx, "tests.runtime.chaos.scratch_app", [], "driver.log")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        assert line == "ready", (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and its JVM: no shutdown hook runs
        proc.wait(30)
    left = sorted(p.name.split("-")[0] for p in ctx.spark_scratch.iterdir())
    # the JVM's temporary directories (java.io.tmpdir) and its block manager's (SPARK_LOCAL_DIRS)
    assert {"spark", "blockmgr", "artifacts"} <= set(left), left
    remove_scratch(tmp_path)
    assert not (tmp_path / SPARK_SCRATCH).exists()
    assert (tmp_path / "driver.log").exists()  # the rest of the workdir is kept
