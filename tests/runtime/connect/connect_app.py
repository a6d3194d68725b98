"""A Spark Connect client program for the Connect tests: ``python -m tests.runtime.connect.connect_app MODE
--url sc://127.0.0.1:PORT ...``. It prints one JSON object on its last line.

It runs in a process of its own, as a user's program would: a Connect client has no JVM, and
``pyspark.sql.SparkSession.builder.remote(...)`` switches the whole process to Spark Connect
(``pyspark.sql.functions`` then build Connect columns), which the test process, with its classic
session, must not be.

Modes:

- ``tour``: the README's DataFrame tour (ingest, read_stream, ``ftlayer.udf(...).with_column``,
  a filter, a windowed count with a watermark, ``foreachBatch(ftlayer.acking(write))`` to
  Parquet) with no ``redis_url`` (the embedded server keeps its AOF in ``./.ftlayer/clicks``),
  ``spark.ftlayer.max_replays`` and ``spark.ftlayer.metrics_port`` set on the session, and
  ``update`` output so that every window is reported. Drains, then reads the Parquet back.
- ``sink``: ``ftlayer.map_in_pandas`` (poison rows) into ``ftlayer.acking_sink`` (per-task
  writer) on the server given by ``--redis-url``.
- ``replay``: a stateless ``foreachBatch`` whose write fails for good once, ``on_error="auto"``:
  the acking point finds the query's id and that it keeps no state, fails the batch's records and
  the query goes on; they are delivered by replays.
- ``listener``: everything persisted, then a ``once`` query: the commit listener in this process
  acks its batch (Spark does not call the FT source again after that commit), from the index
  the acking point wrote for the query it found.
- ``chaos``: ``run_scenario(--scenario, spark, ...)`` of the DataFrame pipeline; prints the report.
- ``topology``: ``Topology.start`` on the Connect session; prints the error it raises.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

WAIT_S = 240.0
HANG_S = 420.0  # < run_client's timeout: the stacks of every thread, then exit


def _session(url: str) -> Any:
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote(url).getOrCreate()


def _drain(handle: Any, ingest: Any, query: Any, n: int, dead: int = 0) -> dict[str, int]:
    """Until every record is acked or dead-lettered (``dead`` of them) with the query running."""
    deadline = time.monotonic() + WAIT_S
    while True:
        if query.exception() is not None:
            raise RuntimeError(f"the query died: {query.exception()}")
        st = handle.stats()
        if ingest.done and st["persisted"] == n and st["acked"] + st["dead_lettered"] == n \
                and st["pending"] == 0 and st["failed_waiting"] == 0 and st["dead_lettered"] == dead:
            return dict(st)
        if time.monotonic() > deadline:
            raise RuntimeError(f"not drained after {WAIT_S} s: {st}")
        time.sleep(0.3)


def tour(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import functions as F

    import ftlayer

    spark = _session(args.url)
    spark.conf.set("spark.ftlayer.max_replays", "1")  # spark.ftlayer.* conf, set on the Connect session
    spark.conf.set("spark.ftlayer.replay_backoff_initial_s", "0")
    spark.conf.set("spark.ftlayer.metrics_port", str(args.metrics_port))
    n = args.records
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
    dead = sum(1 for i in range(n) if i % 13 == 0)
    stats = _drain(handle, ingest, query, n, dead)
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{args.metrics_port}/metrics", timeout=10).read().decode()
    query.processAllAvailable()
    query.stop()
    latest: dict[tuple[str, str], tuple[int, int]] = {}
    for row in spark.read.parquet(out).collect():
        key = (str(row["window"]["start"]), row["section"])
        if key not in latest or row["batch"] > latest[key][0]:
            latest[key] = (row["batch"], row["count"])
    dead = handle.layer.list_dead_letters(n)
    result = {"stats": stats, "counted": sum(c for _, c in latest.values()),
              "sections": sorted({s for _, s in latest}), "max_replays": handle.config.max_replays,
              "redis_url": handle.config.redis_url, "metrics": [line for line in metrics.splitlines()
                                                                if line.startswith("ftlayer_records_acked_total")],
              "dead_replays": sorted({d.replay_count for d in dead}),
              "dead_reasons": sorted({d.reason.splitlines()[-1][:80] for d in dead})}
    ftlayer.stop_all()
    return result


def sink(args: argparse.Namespace) -> dict[str, Any]:
    import pandas as pd

    import ftlayer
    from ftlayer.config import FTConfig

    spark = _session(args.url)
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, timeout_s=60.0, max_replays=1,
                   replay_backoff_initial_s=0.0)
    n = args.records
    handle = ftlayer.source("connect", "events", config=cfg, num_channels=2)
    ingest = handle.ingest({"i": i, "user": f"u{i % 7}"} for i in range(n))
    df = ftlayer.read_stream(spark, "connect", "events", schema="i long, user string", config=cfg, num_channels=2)

    def double(pdf: pd.DataFrame) -> pd.DataFrame:
        if (pdf["i"] % 100 == 7).any():
            raise ValueError("poison")
        return pd.DataFrame({"i": pdf["i"], "twice": pdf["i"] * 2, "_ftlayer": pdf["_ftlayer"]})

    mapped = ftlayer.map_in_pandas(df, double, ftlayer.with_metadata("i long, twice long"), config=cfg)
    out = Path("rows").resolve()

    def write_rows(rows: Any) -> None:
        import uuid

        lines = [json.dumps({"i": r["i"], "twice": r["twice"]}) for r in rows]
        out.mkdir(exist_ok=True)
        if lines:
            (out / f"{uuid.uuid4().hex}.jsonl").write_text("\n".join(lines) + "\n")

    fmt = ftlayer.acking_sink(spark, write_rows, config=cfg, stateful=False)
    query = (mapped.writeStream.format(fmt).option("checkpointLocation", str(Path("ck").resolve()))
             .trigger(processingTime="500 milliseconds").start())
    stats = _drain(handle, ingest, query, n, dead=sum(1 for i in range(n) if i % 100 == 7))
    query.stop()
    written = [json.loads(line)["i"] for p in out.glob("*.jsonl") for line in p.read_text().splitlines()]
    ftlayer.stop_all()
    return {"stats": stats, "written": sorted(set(written)), "rows": len(written)}


def replay(args: argparse.Namespace) -> dict[str, Any]:
    import ftlayer
    from ftlayer.config import FTConfig

    spark = _session(args.url)
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, timeout_s=60.0, sink_retry_budget_s=0.0,
                   replay_backoff_initial_s=0.0)
    n = args.records
    handle = ftlayer.source("connect", "events", config=cfg, num_channels=2)
    ingest = handle.ingest({"i": i, "user": f"u{i % 7}"} for i in range(n))
    df = ftlayer.read_stream(spark, "connect", "events", schema="i long, user string", config=cfg, num_channels=2,
                             max_records_per_batch=max(n // 4, 1))
    marks = Path("marks").resolve()
    out = Path("out").resolve()

    def write(batch: Any, batch_id: int) -> None:
        rows = [r["i"] for r in batch.select("i").collect()]
        marks.mkdir(exist_ok=True)
        if rows and batch_id >= 1 and not (marks / "failed").exists():
            (marks / "failed").write_text(json.dumps(rows))
            raise OSError(f"the sink is down for batch {batch_id}")
        out.mkdir(exist_ok=True)
        (out / f"{batch_id}-{time.monotonic_ns()}.json").write_text(json.dumps(rows))

    query = (df.select("i", "_ftlayer").writeStream.foreachBatch(ftlayer.acking(write, config=cfg))
             .option("checkpointLocation", str(Path("ck").resolve())).trigger(processingTime="300 milliseconds")
             .start())
    stats = _drain(handle, ingest, query, n)
    query.stop()
    delivered = [i for p in out.glob("*.json") for i in json.loads(p.read_text())]
    failed = json.loads((marks / "failed").read_text()) if (marks / "failed").exists() else []
    ftlayer.stop_all()
    return {"stats": stats, "delivered": sorted(set(delivered)), "failed": failed,
            "query_id": str(query.id)}


def listener(args: argparse.Namespace) -> dict[str, Any]:
    """Everything persisted first, then a ``once`` query: one batch reads it all and the query ends,
    and Spark does not call the FT source again after that batch's commit (as it does with
    ``availableNow`` or the next trigger of ``processingTime``, whose ``latestOffset`` settles the
    committed batch), so what acks the batch is the commit listener in this process, from the
    index the acking point wrote for the query it found."""
    import ftlayer
    from ftlayer.config import FTConfig

    spark = _session(args.url)
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, timeout_s=120.0)
    n = args.records
    handle = ftlayer.source("connect", "events", config=cfg, num_channels=2)
    ingest = handle.ingest({"i": i, "user": f"u{i % 7}"} for i in range(n))
    while not ingest.done:
        time.sleep(0.1)
    df = ftlayer.read_stream(spark, "connect", "events", schema="i long, user string", config=cfg, num_channels=2)
    out = Path("out").resolve()

    def write(batch: Any, batch_id: int) -> None:
        out.mkdir(exist_ok=True)
        (out / f"{batch_id}.json").write_text(json.dumps([r["i"] for r in batch.select("i").collect()]))

    query = (df.writeStream.foreachBatch(ftlayer.acking(write, config=cfg))
             .option("checkpointLocation", str(Path("ck").resolve())).trigger(once=True).start())
    query.awaitTermination(WAIT_S)
    ended = time.monotonic()
    while handle.stats()["acked"] < n and time.monotonic() - ended < 30:
        time.sleep(0.2)
    acked_after_s = time.monotonic() - ended
    stats = handle.stats()
    delivered = [i for p in out.glob("*.json") for i in json.loads(p.read_text())]
    ftlayer.stop_all()
    return {"stats": stats, "delivered": len(set(delivered)), "batches": len(list(out.glob("*.json"))),
            "acked_after_s": acked_after_s}


def chaos(args: argparse.Namespace) -> dict[str, Any]:
    from ftlayer.config import FTConfig
    from runtime.chaos.runner import run_scenario

    spark = _session(args.url)
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, timeout_s=5.0, replay_backoff_initial_s=0.0)
    report = run_scenario(args.scenario, spark, cfg, args.records, workdir=Path(args.workdir), pipeline="dataframe")
    return {"summary": report.summary(), "ok": report.ok, "lost": len(report.lost), "leaked": report.leaked,
            "delivered": report.delivered, "expectations": [[w, bool(h)] for w, h in report.expectations],
            "notes": report.notes}


def topology(args: argparse.Namespace) -> dict[str, Any]:
    from ftlayer import FTConfig, JsonLinesSink, Topology

    spark = _session(args.url)
    topo = Topology("connect", FTConfig(redis_url=args.redis_url, namespace=args.namespace))
    topo.source("events", [1, 2, 3]).map(lambda v: v).sink(JsonLinesSink(str(Path("out").resolve())))
    try:
        topo.start(spark)
    except Exception as exc:
        return {"error": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}
    return {"error": None}


def main() -> int:
    faulthandler.dump_traceback_later(HANG_S, exit=True)  # a hang shows where, and ends the client
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["tour", "sink", "replay", "listener", "chaos", "topology"])
    p.add_argument("--url", required=True)
    p.add_argument("--redis-url", default="")
    p.add_argument("--namespace", default="ftlayer")
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--scenario", default="batch-fails")
    p.add_argument("--workdir", default="work")
    p.add_argument("--metrics-port", type=int, default=0)
    args = p.parse_args()
    modes = {"tour": tour, "sink": sink, "replay": replay, "listener": listener, "chaos": chaos,
             "topology": topology}
    try:
        result = modes[args.mode](args)
    finally:  # also on an error: the Connect listener threads would keep the process alive
        import ftlayer

        ftlayer.stop_all()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
