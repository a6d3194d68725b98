"""The executors' Python environment shipped as a packed venv through ``--archives`` (issue 31 item 2),
with the README's DataFrame tour run by a driver that installed ftlayer from its wheel (item 5).

``spark-submit --master 'local-cluster[2,1,1024]' --archives ftlayer-executor-env.tar.gz#environment
--conf spark.pyspark.python=./environment/bin/python ...`` as docs/operations.md gives it, from a
clean environment (no ``PYTHONPATH``, the dev venv off ``PATH``; ``tests.distribution.builds.clean_env``). The
executor JVMs unpack the archive into their own working directories. What the test shows:

- the tour delivers every record (acked, or dead-lettered by its row function's rule) with the FT
  source's reads and the row function in the executors' Python workers;
- every executor's Python worker is ``<its work dir>/environment/bin/python``, and ftlayer, hiredis,
  xxhash, msgpack, msgspec and pyarrow come from ``<its work dir>/environment/lib``; its ``sys.path`` holds
  nothing else but Spark's own Python (``pyspark.zip``, py4j) and the interpreter's standard library;
- the same job with a Python that has nothing installed as the workers' interpreter fails with
  ``No module named 'ftlayer'``: no other way onto the executors exists.

In client mode the driver runs the FT source's driver-side half (Spark plans Python data sources in a
Python process of the driver, with ``spark.pyspark.python``, from the driver's working directory), so
the archive is unpacked into ``./environment`` there too, as the docs say.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distribution.builds import ROOT, Dist, clean_env

pytestmark = [pytest.mark.spark, pytest.mark.slow]

RECORDS = 400
MASTER = "local-cluster[2,1,1024]"


def test_executors_import_ftlayer_only_from_the_shipped_archive(dist: Dist, tmp_path: Path) -> None:
    app = tmp_path / "tour_app.py"  # a copy: the driver's sys.path[0] is then a directory without ftlayer
    shutil.copy2(Path(__file__).with_name("tour_app.py"), app)
    # client mode: ./environment for the driver's planner workers, unpacked as Spark unpacks a .tar.gz
    # (with tar: file modes kept; Python's tarfile took several CPU-seconds more)
    (tmp_path / "environment").mkdir()
    subprocess.run(["tar", "-xzf", str(dist.archive), "-C", str(tmp_path / "environment")], check=True, timeout=300)
    cmd = [str(dist.bin / "spark-submit"), "--master", MASTER,
           "--archives", f"{dist.archive}#environment",
           "--conf", "spark.pyspark.python=./environment/bin/python",
           "--conf", f"spark.pyspark.driver.python={dist.python}",
           "--conf", "spark.executor.memory=768m", "--conf", "spark.ui.enabled=false",
           # the tour's windowed count shuffles: 4 state-store partitions, not Spark's 200 (200 tasks and
           # 200 state stores a batch on two 1-core executors were 28 of the job's 40 s)
           "--conf", "spark.sql.shuffle.partitions=4",
           "--conf", "spark.ftlayer.max_replays=1", "--conf", "spark.ftlayer.replay_backoff_initial_s=0",
           str(app), "--records", str(RECORDS), "--bare-python", str(dist.bare_python)]
    env = clean_env(SPARK_HOME=str(dist.spark_home), SPARK_CONF_DIR=str(ROOT / "tests" / "spark-conf"))
    try:
        proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    finally:
        shutil.rmtree(dist.spark_home / "work", ignore_errors=True)  # the executors' dirs, archive unpacked twice
    (tmp_path / "submit.log").write_text(proc.stdout + "\n--- stderr\n" + proc.stderr)
    assert proc.returncode == 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])

    # the tour: every record delivered once, /page/0 dead-lettered after one replay, /page/12 filtered
    poison = sum(1 for i in range(RECORDS) if i % 13 == 0)
    filtered = sum(1 for i in range(RECORDS) if i % 13 == 12)
    stats = result["stats"]
    assert stats["persisted"] == RECORDS and stats["pending"] == 0, stats
    assert stats["acked"] == RECORDS - poison and stats["dead_lettered"] == poison, stats
    assert result["counted"] == RECORDS - poison - filtered
    assert result["driver_ftlayer"].startswith(str(dist.bin.parent)), result["driver_ftlayer"]
    assert result["worker_python"] == "./environment/bin/python"

    # the executors: their Python and every module ftlayer needs from their own unpacked archive
    assert result["executors"] == 2
    workers = result["workers"]
    assert len({w["cwd"] for w in workers}) == 2, "both executors answer"
    spark_python = (str(dist.spark_home / "python" / "lib"), str(dist.spark_home / "jars"))
    for w in workers:
        env_dir = f"{w['cwd']}/environment"
        assert w["cwd"].startswith(str(dist.spark_home / "work")), w["cwd"]
        assert w["executable"] == f"{env_dir}/bin/python" and w["prefix"] == env_dir, w
        assert all(f.startswith(f"{env_dir}/lib/") for f in w["files"].values()), w["files"]
        foreign = [p for p in w["sys_path"] if p not in (".", w["cwd"]) and not p.startswith(env_dir)
                   and not p.startswith(spark_python) and not p.startswith(sys.base_prefix)]
        assert not foreign, f"executor sys.path entries from outside its archive: {foreign}"
        assert all(p.startswith(spark_python) for p in w["pythonpath"].split(":") if p), w["pythonpath"]

    # without the archive's Python, the same executors cannot import ftlayer at all
    assert "No module named 'ftlayer'" in result["bare"], result["bare"]
