"""The Spark Connect server of the Connect tests: one per test session (per pytest-xdist worker),
a process of its own started on first use (:class:`runtime.spark.connect_server.LocalConnectServer`).

Its Python workers import this checkout (``PYTHONPATH``), as the client programs do
(``connect_app``); it gets the tests' Spark conf (``SPARK_SUBMIT_OPTS``, tests/spark_jvm.py) and logs
to ``server.log`` in its own temporary directory. A test that uses it must be marked ``spark``
(tests/conftest.py refuses it otherwise).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import ENV_PREFIX
from ftlayer.errors import FTLayerError
from runtime.spark.connect_server import LocalConnectServer

ROOT = Path(__file__).resolve().parents[3]

SERVER_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.driver.memory": "2g",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
    "spark.task.maxFailures": "4",
}


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConnectServer]:
    work = tmp_path_factory.mktemp("connect-server")
    server = LocalConnectServer(master="local[2,4]", conf=SERVER_CONF, python_path=[ROOT], log_path=work / "server.log",
                                cwd=work)
    try:
        server.start()
    except FTLayerError as exc:  # java missing, a broken install: say so, do not skip
        pytest.fail(str(exc))
    yield server
    server.stop()


def run_client(server: LocalConnectServer, mode: str, cwd: Path, *args: str,
               timeout_s: float = 480.0) -> dict[str, Any]:
    """Run ``tests.runtime.connect.connect_app MODE`` against ``server`` in ``cwd``; its JSON result.

    The client gets no FTLAYER_* settings from the test's environment (its defaults, or what the
    mode sets), and fails the test with its output if it exits non-zero.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    env["PYTHONPATH"] = str(ROOT)
    for key in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
        env.pop(key, None)
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "tests.runtime.connect.connect_app", mode, "--url", server.url,
                           *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
    (cwd / f"{mode}.log").write_text(proc.stdout + "\n--- stderr\n" + proc.stderr)
    if proc.returncode != 0:
        pytest.fail(f"connect_app {mode} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}\n"
                    f"--- server log\n{server.log_tail(30)}", pytrace=False)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
