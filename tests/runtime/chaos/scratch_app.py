"""A driver program that starts Spark, runs one job, says ``ready`` and waits to be killed
(``tests/runtime/chaos/test_scratch.py``)."""

from __future__ import annotations

import time

from runtime.spark.session import local_session

if __name__ == "__main__":
    spark = local_session("scratch-app", master="local[1]", log_level="ERROR")
    spark.range(100).selectExpr("id % 3 AS k").groupBy("k").count().collect()  # a shuffle: block manager files
    print("ready", flush=True)
    time.sleep(600)
