"""Driver program of the task-retry benchmark: ``python -m runtime.bench.retry_app``.

One SparkSession on ``local[2,4]`` (up to 4 attempts per task), so a killed Python worker
costs one task retry, not the batch. Each ``--variant`` run handles ``--records`` records in
one micro-batch: keyed by user over 2 partitions, then a sink. The first attempt of the sink
task of partition 0 dies (``os._exit``) once it has written half of its records; Spark
retries that task. Every sink write appends one line per record to
``<workdir>/<variant>/p<partition>-a<attempt>-<pid>.txt`` (unbuffered, so a dying worker
loses none), which is how the harness counts what each attempt wrote.

- ``ftlayer``: the records are persisted (by the harness) before the query starts; the
  topology is ``source -> map -> key_by(user) -> sink`` with default settings
  (``sink_ack_every_records`` 1000) on Arrow batches of ``--batch-rows`` rows.
- ``spark``: hand-written Structured Streaming with no ftlayer: ``rate-micro-batch``
  (``--records`` rows in its first batch), ``repartition(2, user)``, a ``foreach`` writer
  (per row, in the Python worker) that skips every later epoch.

Prints one JSON line per run: ``{"variant", "outcome", "killed", "seconds"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from runtime.bench.common import BENCH_STOP_GRACE_S
from runtime.driver.query_stop import stop_query
from runtime.sinks import ExecutorSink, SinkContext
from runtime.spark.session import local_session
from runtime.testing import once
from runtime.topology import Topology

TOPOLOGY = "retrybench"
SOURCE = "events"
USERS = 37
PARTITIONS = 2
KILL_PARTITION = 0
_FDS: dict[str, int] = {}


def user_of(i: int) -> str:
    return f"u{i % USERS}"


def _append(directory: str, partition: int, attempt: int, lines: str) -> None:
    path = os.path.join(directory, f"p{partition}-a{attempt}-{os.getpid()}.txt")
    fd = _FDS.get(path)
    if fd is None:
        os.makedirs(directory, exist_ok=True)
        fd = _FDS[path] = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
    os.write(fd, lines.encode())


class LineSink(ExecutorSink):
    """ftlayer variant: one line per record; the first attempt of partition 0 dies at ``kill_after``."""

    def __init__(self, directory: str, marks: str, kill_after: int) -> None:
        self.directory, self.marks, self.kill_after = directory, marks, kill_after
        self._written: dict[tuple[str, int, int], int] = {}

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        _append(self.directory, ctx.partition, ctx.attempt, "".join(f"{v['i']}\n" for v in values))
        task = (ctx.batch_id, ctx.partition, ctx.attempt)
        self._written[task] = done = self._written.get(task, 0) + len(values)
        if (ctx.partition == KILL_PARTITION and ctx.attempt == 0 and done >= self.kill_after
                and once(self.marks, "kill")):
            os._exit(3)


class ForeachLines:
    """spark variant: Spark's ``foreach`` writer, one line per row, same kill rule; epoch 0 only."""

    def __init__(self, directory: str, marks: str, kill_after: int) -> None:
        self.directory, self.marks, self.kill_after = directory, marks, kill_after

    def open(self, partition_id: int, epoch_id: int) -> bool:
        from pyspark import TaskContext

        tc = TaskContext.get()
        self.partition, self.attempt = partition_id, tc.attemptNumber() if tc else 0
        self.done = 0
        return epoch_id == 0  # rate-micro-batch keeps producing: only the first batch counts

    def process(self, row: Any) -> None:
        _append(self.directory, self.partition, self.attempt, f"{row['value']}\n")
        self.done += 1
        if (self.partition == KILL_PARTITION and self.attempt == 0 and self.done >= self.kill_after
                and once(self.marks, "kill")):
            os._exit(3)

    def close(self, error: Any) -> None:
        return None


def run_ftlayer(spark: Any, args: argparse.Namespace, out: Path, marks: Path) -> dict[str, Any]:
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, timeout_s=120.0, num_channels=PARTITIONS)
    topo = Topology(TOPOLOGY, cfg)
    (topo.source(SOURCE, [], key=lambda e: e["user"]).map(lambda e: e).key_by(lambda e: e["user"])
     .sink(LineSink(str(out), str(marks), args.kill_after)))
    started = time.monotonic()
    query = topo.start(spark, checkpoint_location=str(out.parent / "ckpt-ftlayer"), trigger_interval_s=0.2)
    try:
        ok = query.await_drained(args.deadline_s)
        failure = query.query.exception()
    finally:
        query.stop()
    return {"outcome": "drained" if ok and failure is None else f"not drained ({failure})",
            "seconds": time.monotonic() - started, "stats": query.stats()}


def run_spark(spark: Any, args: argparse.Namespace, out: Path, marks: Path) -> dict[str, Any]:
    from pyspark.sql import functions as F

    df = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", args.records)
          .option("numPartitions", PARTITIONS).load()
          .withColumn("user", F.concat(F.lit("u"), (F.col("value") % USERS).cast("string")))
          .repartition(PARTITIONS, "user"))
    started = time.monotonic()
    query = (df.writeStream.foreach(ForeachLines(str(out), str(marks), args.kill_after))
             .option("checkpointLocation", str(out.parent / "ckpt-spark")).trigger(processingTime="200 milliseconds")
             .start())
    outcome = "timeout"
    try:
        deadline = time.monotonic() + args.deadline_s
        while time.monotonic() < deadline:
            if query.exception() is not None:
                outcome = f"failed ({str(query.exception()).splitlines()[0][:200]})"
                break
            if any(int(p["batchId"]) == 0 for p in query.recentProgress):  # batch 0 committed
                outcome = "drained"
                break
            time.sleep(0.05)
    finally:
        stop_query(query, BENCH_STOP_GRACE_S)
    return {"outcome": outcome, "seconds": time.monotonic() - started}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m runtime.bench.retry_app")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--variant", choices=("ftlayer", "spark"), action="append", required=True)
    p.add_argument("--records", type=int, required=True)
    p.add_argument("--kill-after", type=int, required=True)
    p.add_argument("--batch-rows", type=int, default=250)
    p.add_argument("--deadline-s", type=float, default=300.0)
    args = p.parse_args(argv)
    spark = local_session("ftlayer-bench-retry", master="local[2,4]")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.batch_rows))
    code = 0
    for variant in args.variant:
        root = Path(args.workdir) / variant
        out, marks = root / "lines", root / "marks"
        marks.mkdir(parents=True, exist_ok=True)
        run = run_ftlayer if variant == "ftlayer" else run_spark
        got = run(spark, args, out, marks)
        got.update(variant=variant, killed=(marks / "kill").exists())
        print(json.dumps(got), flush=True)
        code = code or (0 if got["outcome"] == "drained" else 1)
    return code


if __name__ == "__main__":
    sys.exit(main())
