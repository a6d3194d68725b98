"""``scratch_env``: a driver JVM's scratch settings added to an environment, the caller's kept."""

from __future__ import annotations

import shlex
from pathlib import Path

from runtime.spark.scratch import scratch_env


def test_the_scratch_settings_come_last_and_the_caller_s_options_stay(tmp_path: Path) -> None:
    scratch = tmp_path / "with space" / "scratch"
    environ = {"SPARK_SUBMIT_OPTS": "-Xmx1g '-Dspark.app.name=a b' -Djava.io.tmpdir=/elsewhere", "OTHER": "1"}
    env = scratch_env(scratch, environ)
    opts = shlex.split(env["SPARK_SUBMIT_OPTS"])
    assert opts == ["-Xmx1g", "-Dspark.app.name=a b", "-Djava.io.tmpdir=/elsewhere", f"-Djava.io.tmpdir={scratch}"]
    assert env["SPARK_LOCAL_DIRS"] == str(scratch)
    assert env["OTHER"] == "1"
    assert scratch.is_dir()
    assert environ == {"SPARK_SUBMIT_OPTS": "-Xmx1g '-Dspark.app.name=a b' -Djava.io.tmpdir=/elsewhere",
                       "OTHER": "1"}  # not changed


def test_without_submit_options_there_is_only_the_tmpdir(tmp_path: Path) -> None:
    env = scratch_env(tmp_path, {})
    assert shlex.split(env["SPARK_SUBMIT_OPTS"]) == [f"-Djava.io.tmpdir={tmp_path}"]
