"""Where a driver JVM keeps its scratch files, for driver programs that may be SIGKILLed.

A Spark driver JVM makes its temporary directories (``spark-*``, ``blockmgr-*``, ``artifacts-*``)
under ``java.io.tmpdir`` and ``SPARK_LOCAL_DIRS`` (both /tmp unless set) and deletes them in a JVM
shutdown hook, which a SIGKILL never runs: every killed driver leaves them behind. The chaos
scenarios kill drivers on purpose (``ftlayer chaos kill-driver`` and the receivers' driver kills),
and so does the test suite; they start those drivers with :func:`scratch_env`, so the files land in
a directory the caller owns and removes.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from pathlib import Path

__all__ = ["scratch_env"]


def scratch_env(scratch: Path, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A copy of ``environ`` under which a driver JVM (and a local-cluster's executors) keeps its
    scratch files in ``scratch`` (made if missing).

    Both settings are needed: ``SPARK_LOCAL_DIRS`` (block manager and shuffle files, which executors
    inherit too) and ``java.io.tmpdir`` (the driver's other temporary directories), the latter added
    last to ``SPARK_SUBMIT_OPTS``: every ``spark-submit`` (PySpark's own launch included) passes it to
    the driver JVM, and of two ``-D`` settings of one property the last wins, so a caller's other
    options are kept.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    opts = environ.get("SPARK_SUBMIT_OPTS", "")
    tmpdir = shlex.quote(f"-Djava.io.tmpdir={scratch}")
    return {**environ, "SPARK_LOCAL_DIRS": str(scratch), "SPARK_SUBMIT_OPTS": f"{opts} {tmpdir}".strip()}
