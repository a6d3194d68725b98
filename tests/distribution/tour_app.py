"""The README's DataFrame tour as a ``spark-submit`` application, for the shipped-environment test
(``tests/distribution/test_shipped_env.py``); it is run by the Python of a venv that installed ftlayer from its
wheel, never from the repository (so it imports nothing from ``tests``).

``spark-submit --archives executor-env.tar.gz#environment --conf spark.pyspark.python=./environment/bin/python
... tour_app.py --records N --bare-python PATH``, from a scratch directory (the embedded server's AOF goes to
``./.ftlayer/clicks``, the counts to ``./counts``, the checkpoint to ``./ck``). It

1. runs the tour (ingest, ``read_stream``, ``ftlayer.udf(...).with_column``, a filter, a windowed count
   with a watermark, ``foreachBatch(ftlayer.acking(write))`` to Parquet) until every record is acked or
   dead-lettered; the FT source's reads and the row function run in the executors' Python workers;
2. asks every executor, in a job of 2 tasks per executor, where its Python worker runs from: the
   interpreter, the files of ftlayer and of the C extensions it needs, ``sys.path`` and ``PYTHONPATH``;
3. runs the same import on the executors with ``--bare-python`` (a venv with nothing installed) as the
   workers' interpreter, and reports the error: what an executor without the archive can import.

It prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

WAIT_S = 240.0
EXTENSIONS = ("ftlayer", "hiredis", "xxhash", "msgpack", "msgspec", "pyarrow")


def where_am_i(_: Iterator[int]) -> Iterator[dict[str, Any]]:
    """Runs in an executor's Python worker: where its interpreter and modules come from."""
    import importlib
    import os

    time.sleep(0.5)  # the other executor gets tasks too
    files = {name: importlib.import_module(name).__file__ for name in EXTENSIONS}
    yield {"executable": sys.executable, "prefix": sys.prefix, "cwd": os.getcwd(), "files": files,
           "sys_path": sys.path, "pythonpath": os.environ.get("PYTHONPATH", "")}


def tour(spark: Any, n: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    import ftlayer

    ingest = ftlayer.ingest("clicks", "events", ({"i": i, "user": f"user-{i % 97}", "page": f"/page/{i % 13}",
                                                 "ts": i // 100} for i in range(n)))
    events = ftlayer.read_stream(spark, "clicks", "events", schema="i long, user string, page string, ts timestamp")

    def parse(page: str) -> str:
        if page == "/page/0":
            raise ValueError("upstream said no")
        return page.upper()

    section = ftlayer.udf(parse, "string")
    counts = (section.with_column(events.filter(F.col("page") != "/page/12"), "section", "page")
              .withWatermark("ts", "10 seconds")
              .groupBy(F.window("ts", "5 seconds"), "section").count())
    out = str(Path("counts").resolve())

    def write(df: Any, batch_id: int) -> None:
        df.withColumn("batch", F.lit(batch_id)).write.mode("append").parquet(out)

    query = (counts.writeStream.outputMode("update").foreachBatch(ftlayer.acking(write))
             .option("checkpointLocation", str(Path("ck").resolve())).trigger(processingTime="500 milliseconds")
             .start())
    handle = ftlayer.source("clicks", "events")
    deadline = time.monotonic() + WAIT_S
    while True:
        if query.exception() is not None:
            msg = f"the query died: {query.exception()}"
            raise RuntimeError(msg)
        stats = handle.stats()
        if ingest.done and stats["persisted"] == n and stats["acked"] + stats["dead_lettered"] == n \
                and stats["pending"] == 0 and stats["failed_waiting"] == 0:
            break
        if time.monotonic() > deadline:
            msg = f"not drained after {WAIT_S} s: {stats}"
            raise RuntimeError(msg)
        time.sleep(0.3)
    ftlayer.stop_query(query)  # between micro-batches: no write aborted, no stack trace logged
    latest: dict[tuple[str, str], tuple[int, int]] = {}
    for row in spark.read.parquet(out).collect():
        key = (str(row["window"]["start"]), row["section"])
        if key not in latest or row["batch"] > latest[key][0]:
            latest[key] = (row["batch"], row["count"])
    ftlayer.stop_all()
    return {"stats": dict(stats), "counted": sum(c for _, c in latest.values()),
            "driver_ftlayer": ftlayer.__file__}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--bare-python", required=True, help="a Python with nothing installed, for the negative check")
    args = p.parse_args()
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.getOrCreate()
    sc = spark.sparkContext
    result: dict[str, Any] = {"worker_python": sc.pythonExec}
    result.update(tour(spark, args.records))
    executors = sc._jsc.sc().getExecutorMemoryStatus().size() - 1  # the driver's block manager is listed too
    result["executors"] = executors
    result["workers"] = sc.parallelize(range(2 * executors), 2 * executors).mapPartitions(where_am_i).collect()
    sc.pythonExec = args.bare_python  # the functions shipped from now on name this interpreter
    try:
        sc.parallelize(range(2), 2).mapPartitions(where_am_i).collect()
        result["bare"] = "imported"
    except Exception as exc:  # a Py4JJavaError wrapping the worker's traceback
        result["bare"] = str(exc).splitlines()[0][:200] + " ... " + \
            next((line for line in str(exc).splitlines() if "Error:" in line and "No module" in line), "")
    spark.stop()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
