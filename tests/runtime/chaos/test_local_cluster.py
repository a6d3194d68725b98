"""Chaos beyond local[N]: scenarios on ``local-cluster[2,1,1024]``, two executor JVMs (issue 18).

The test session's SparkSession is ``local[2,4]`` and a process has one SparkContext, so each
run is the ``ftlayer chaos`` CLI in a subprocess with ``--master local-cluster[2,1,1024]``,
against this session's Redis server and a namespace the test names. The test then checks the
FT state itself (not only the CLI's report): every record persisted, nothing pending or
waiting, no keys left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.chaos.base import SOURCE, TOPOLOGY, ScenarioContext
from runtime.chaos.errors import ChaosError
from runtime.chaos.executors import executor_pids, has_executor_jvms, kill_executor

pytestmark = pytest.mark.spark

MASTER = "local-cluster[2,1,1024]"


def _chaos(scenario: str, url: str, ns: str, records: int,
           pipeline: str = "topology") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli.main", "chaos", scenario, "--master", MASTER,
         "--redis-url", url, "--namespace", ns, "--records", str(records), "--pipeline", pipeline],
        capture_output=True, text=True, timeout=900, env=env, check=False,
    )


def _assert_settled(url: str, ns: str, records: int) -> None:
    layer = FTLayer(FTConfig(redis_url=url, namespace=ns), TOPOLOGY, SOURCE)
    st = layer.stats()
    assert st["persisted"] == records, st
    assert st["pending"] == 0 and st["failed_waiting"] == 0, st
    assert st["dead_lettered"] == 0, st
    assert layer.leftovers() == []


@pytest.mark.parametrize(("scenario", "pipeline", "records"), [
    ("kill-executor", "topology", 2000), ("fail-rate", "topology", 2000),
    # the JVM running a batch's task is killed while the task runs (df_matrix.kill_executor)
    ("kill-executor", "dataframe", 600),
])
def test_scenario_on_two_executor_jvms(scenario: str, pipeline: str, records: int, redis_server_url: str,
                                       namespace: str) -> None:
    done = _chaos(scenario, redis_server_url, namespace, records, pipeline)
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "lost               0" in done.stdout
    _assert_settled(redis_server_url, namespace, records)


def test_kill_executor_refuses_a_master_without_executor_jvms(spark: Any, tmp_path: Any) -> None:
    assert not has_executor_jvms(spark)
    assert executor_pids(str(spark.sparkContext.applicationId)) == []
    ctx = ScenarioContext("kill-executor", spark, FTConfig(redis_url="redis://127.0.0.1:1/0"), tmp_path)
    with pytest.raises(ChaosError, match=r"local-cluster\[2,1,1024\]"):
        kill_executor(ctx, 10)
