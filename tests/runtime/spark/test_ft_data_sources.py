"""What Spark's planner process for a ``load()`` imports: the DataSource class, its options and
``schema()``, not the readers (runtime/spark/ft_data_sources.py's module notes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pyspark import cloudpickle

from runtime.spark.ft_data_sources import FTDataSource, FTSource
from runtime.spark.fused_read import FusedSource

# as pyspark/sql/worker/create_data_source.py does: unpickle the class, instantiate it, ask its schema
_PLANNER = """
import pickle, sys, json
import pyspark.sql.worker.create_data_source
before = set(sys.modules)
cls = pickle.loads(sys.stdin.buffer.read())
schema = cls({"topology": "t", "source": "s"}).schema()
print(json.dumps({"schema": schema.simpleString(), "imported": sorted(set(sys.modules) - before)}))
"""

READER_STACK = ("redis", "runtime.spark.ft_source", "runtime.spark.typed_source",
                "runtime.spark.stages", "runtime.spark.payload_columns", "ftlayer.acker")


@pytest.mark.parametrize("cls", [FTSource, FTDataSource, FusedSource], ids=lambda c: c.__name__)
def test_a_planner_process_unpickles_the_source_without_the_reader_stack(cls: type) -> None:
    done = subprocess.run([sys.executable, "-c", _PLANNER], input=cloudpickle.dumps(cls),  # type: ignore[no-untyped-call]
                          capture_output=True, check=True, timeout=60)
    out = json.loads(done.stdout)
    assert out["schema"].startswith("struct<")
    heavy = [m for m in out["imported"] if m.split(".")[0] in READER_STACK or m in READER_STACK
             or any(m.startswith(f"{r}.") for r in READER_STACK)]
    assert not heavy, f"{cls.__name__}'s planner imported the reader stack: {heavy}"
