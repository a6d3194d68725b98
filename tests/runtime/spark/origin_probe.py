"""A start-up probe for the tests of runtime/spark/installed_pyspark.py, run by a ``.pth`` file of the
tests' own venv (:func:`tests.runtime.spark.layered_venv.layered_venv`) after ftlayer's hook: when
``PYSPARK_ORIGIN_PROBE_DIR`` is set and ``PYTHONPATH`` names ``pyspark.zip`` (a Python process Spark
started), it writes ``<dir>/<pid>.json``: the command line, ``sys.path`` and where ``pyspark`` and
``py4j`` would be imported from (``find_spec``, which runs neither). A daemon's forked workers share
its record.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys


def record() -> None:
    out = os.environ.get("PYSPARK_ORIGIN_PROBE_DIR")
    if not out or "pyspark.zip" not in os.environ.get("PYTHONPATH", ""):
        return
    with open("/proc/self/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    found = {name: getattr(importlib.util.find_spec(name), "origin", None) for name in ("pyspark", "py4j")}
    with open(os.path.join(out, f"{os.getpid()}.json"), "w") as f:
        json.dump({"argv": argv, "path": sys.path, **found}, f)
