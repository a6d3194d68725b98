"""A local SparkSession configured the way ftlayer's jobs and tests expect."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from ftlayer.errors import FTLayerError

__all__ = ["local_session", "stop_session"]

LOCAL_CLUSTER = re.compile(r"^local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*\]$")


def local_session(app_name: str, master: str = "local[2,4]", conf: Mapping[str, str] | None = None, *,
                  log_level: str | None = None) -> Any:
    """A local SparkSession (2 cores, up to 4 attempts per task), Arrow on.

    ``master`` may also be ``local-cluster[N,C,M]``: a standalone master and N workers inside
    the driver's JVM, each with C cores and M MiB, launching an executor JVM of its own (the
    executors then get 3/4 of M, leaving room for the worker's bookkeeping). ``conf`` adds
    Spark conf entries (e.g. :func:`runtime.spark.spark_logs.log_to_file`); like
    every entry here, they apply only if this call creates the session. ``log_level`` (e.g.
    ``"ERROR"``) sets Spark's log level with ``setLogLevel``; by default Spark's level is left
    as the session's log4j configuration has it (a process-wide setting ftlayer does not change
    unless asked).
    Raises FTLayerError with a clear message when ``java`` is missing.
    """
    if shutil.which("java") is None:
        msg = "java is not on PATH: Spark 4.x needs Java 17 or 21 (Debian: apt-get install openjdk-17-jre-headless)"
        raise FTLayerError(msg)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    cluster = LOCAL_CLUSTER.match(master)
    if cluster is not None:
        builder = builder.config("spark.executor.memory", f"{int(cluster.group(3)) * 3 // 4}m")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = (
        builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .getOrCreate()
    )
    if log_level is not None:
        session.sparkContext.setLogLevel(log_level)
    return session


def stop_session(session: Any) -> None:
    """Stop ``session``; for a ``local-cluster`` master, also remove the application's work
    directory that its workers create under the pyspark package (executor logs, fetched files)."""
    sc = session.sparkContext
    app_id, master = str(sc.applicationId), str(sc.master)
    session.stop()
    if LOCAL_CLUSTER.match(master) is None:
        return
    import pyspark

    shutil.rmtree(os.path.join(os.path.dirname(pyspark.__file__), "work", app_id), ignore_errors=True)
