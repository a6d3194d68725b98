"""The pre-Spark demo end to end, and the `ftlayer redis` command, as a user runs them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis


@pytest.mark.spark
def test_demo_reports_nothing_lost_and_nothing_left(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The main job as a user runs it: its own Spark, embedded Redis, a killed worker, FailRecord."""
    env = {**os.environ, "FTLAYER_NAMESPACE": "demotest", "FTLAYER_EMBEDDED_DATA_DIR": str(tmp_path)}
    env.pop("FTLAYER_REDIS_URL", None)
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.cli.demo", "--records", "3000", "--fail-every", "25"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=env, check=False,
    )
    out = proc.stdout  # the console as a user sees it: stdout and stderr interleaved
    assert proc.returncode == 0, out[-5000:]
    assert re.search(r"^lost\s+0 ", out, re.M) and re.search(r"^acker entries left\s+0 ", out, re.M)
    assert re.search(r"^worker killed\s+yes", out, re.M)
    assert re.search(r"^dead letters\s+1 ", out, re.M)  # the poison record, with its reason
    # every 25th record fails once (unless its first failure died with the killed worker),
    # and the poison record is replayed max_replays = 3 times before it is dead-lettered
    replays = int(re.search(r"^replays\s+(\d+)", out, re.M).group(1))  # type: ignore[union-attr]
    assert 3 < replays <= 3000 // 25 + 3
    assert re.search(r"^leftover state\s+none", out, re.M)
    # clean stop: the report is the last thing on the console, nothing after it
    lines = out.rstrip("\n").splitlines()
    start = lines.index("== ftlayer demo report ==")
    assert [line.split()[0] for line in lines[start + 1:]] == [
        "records", "records", "duplicates", "replays", "dead", "worker", "lost", "acker", "leftover"]
    # no Spark ERROR line or stack trace anywhere on the console: they go to the demo's spark.log
    noisy = [line for line in lines[:start] if re.search(r"ERROR|Traceback|Exception|^\s+at ", line)]
    first = next((i for i, line in enumerate(lines[:start]) if line in noisy), 0)
    assert noisy == [], "\n".join(lines[max(0, first - 5) : first + 40])  # the first one, in its context
    # each injected fault is announced in one line of its own
    for fault in ("a Python worker was killed", "raises FailRecord once", "poison record"):
        assert sum("fault:" in line and fault in line for line in lines) == 1, fault
    spark_log = Path(re.search(r"Spark's log goes to (\S+)", out).group(1))  # type: ignore[union-attr]
    assert "ERROR" in spark_log.read_text()  # the killed worker's task failure, with its stack trace


_WITH_CTRL_C = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                "runpy.run_module('runtime.cli.main', run_name='__main__')")


def test_ftlayer_redis_runs_in_the_foreground_until_ctrl_c(tmp_path) -> None:  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(
        # as from a terminal: a pytest-xdist worker ignores SIGINT, and a child inherits that
        [sys.executable, "-c", _WITH_CTRL_C, "redis", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"(redis://\S+)", line).group(1)  # type: ignore[union-attr]
        assert redis.Redis.from_url(url).ping()
        assert (tmp_path / "valkey.log").exists()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()  # no server left behind for the rest of the suite
            raise
    assert code == 0
