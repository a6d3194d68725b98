"""An ftlayer DataFrame query whose Spark-launched Python processes report where they import pyspark
from, for ``test_installed_pyspark_spark.py``: ``python tests/runtime/spark/origin_app.py``.

A few records go through ``ftlayer.ingest`` and ``ftlayer.read_stream`` (the FT source: its planners
and its streaming runner) into a Python UDF (a ``pyspark.worker`` task) that returns
``pyspark.__file__`` and ``py4j.__file__`` as the task imported them, and ``foreachBatch(acking(...))``
collects them. The last line printed is JSON: the tasks' origins and the source's stats.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import ftlayer
from ftlayer import local_session

RECORDS = 20


def main() -> int:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    spark = local_session("pyspark-origin", log_level="ERROR")

    @F.udf(returnType=StringType())
    def origin(_: int) -> str:
        import py4j
        import pyspark

        return f"{pyspark.__file__}|{py4j.__file__}"

    seen: set[str] = set()

    def write(df: Any, batch_id: int) -> None:
        seen.update(r["origin"] for r in df.collect())

    ingest = ftlayer.ingest("origins", "events", ({"i": i} for i in range(RECORDS)))
    events = ftlayer.read_stream(spark, "origins", "events", schema="i long")
    query = (events.select(origin("i").alias("origin")).writeStream.foreachBatch(ftlayer.acking(write))
             .trigger(processingTime="200 milliseconds").start())
    handle = ftlayer.source("origins", "events")
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and query.exception() is None:
        st = handle.stats()
        if ingest.done and st["persisted"] == RECORDS and st["pending"] == 0:
            break
        time.sleep(0.2)
    query.stop()
    stats = handle.stats()
    ftlayer.stop_all()
    spark.stop()
    print(json.dumps({"tasks": sorted(seen), "stats": stats}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
