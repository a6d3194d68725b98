"""``scripts/demo dataframe``: the demo as a DataFrame pipeline, with real faults and the same report.

Pipeline (plain Spark between an ftlayer source and an acking sink)::

    raw click lines (a generator: it cannot rewind)  --ftlayer.ingest-->  Redis
    ftlayer.read_stream(..., schema="line string")
      -> split the line with SQL functions, cast columns, parse the timestamp
      -> ftlayer.udf(check_page) (transient failures, a poison record, a killed Python worker)
      -> filter out bots and rows the UDF failed
      -> withWatermark + groupBy(window(ts, 1 hour), user).count()        (stateful, update mode)
      -> foreachBatch(ftlayer.acking(write))  : df.write.mode("append").parquet(out)

Faults besides the row function's: one batch's write takes 1.6 times ``timeout_s`` (its records
are held, not replayed), and batch 2 fails after its write and before Spark's commit log entry (a
directory stands where the entry must go): the query stops, the directory goes and the query is
restarted on its checkpoint, so Spark re-runs the batch, which reads its records again (they were
not acked: acks come at Spark's commit).

Report: records in, every (window, user) count checked against what the generator produced (minus
bots and dead letters), bots filtered, replays, timeouts postponed by a running batch, the re-run
batch, dead letters, whether the worker was killed, lost (must be 0) and acker entries left (must
be 0). Exit status 1 if lost or acker entries left is not 0, or any count is wrong.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from runtime.cli.demo_events import click_events
from runtime.driver.progress import TaskProgress
from runtime.testing import once

TOPOLOGY, SOURCE = "clicks_df", "events"


class CheckPage:
    """The row function: raises once on every ``fail_every``-th record, always on the poison one,
    and kills its Python worker once at ``kill_at``."""

    def __init__(self, marks: Path, fail_every: int, poison: int, kill_at: int) -> None:
        self.marks, self.fail_every, self.poison, self.kill_at = marks, fail_every, poison, kill_at

    def __call__(self, i: int, page: str) -> str:
        if i == self.poison:
            msg = f"poison record {i}: page {page!r} cannot be classified"
            raise ValueError(msg)
        if i == self.kill_at and once(self.marks, "kill"):
            os._exit(9)  # a Python worker dies mid-partition; Spark retries its task
        if self.fail_every and i % self.fail_every == 0 and once(self.marks, f"f{i}"):
            msg = f"transient failure on record {i}"
            raise RuntimeError(msg)
        return "home" if page == "/page/0" else "content"


def run(records: int, fail_every: int, timeout_s: float, spark: Any = None) -> int:
    from pyspark.sql import functions as F

    import ftlayer
    from runtime.dataframe import sources

    work = Path(tempfile.mkdtemp(prefix="ftlayer-demo-df-"))
    marks, out = work / "marks", work / "out"
    marks.mkdir()
    cfg = FTConfig.load(env=os.environ).replace(timeout_s=timeout_s, max_replays=3, state_dir=str(work / "state"),
                                               replay_backoff_initial_s=0.2, replay_backoff_max_s=1.0)
    if spark is None:
        from runtime.spark.session import local_session
        from runtime.spark.spark_logs import log_to_file

        spark = local_session("ftlayer-demo-dataframe", conf=log_to_file(work / "spark.log"))
    check = CheckPage(marks, fail_every, poison=records // 2 + 1, kill_at=records // 3)
    handle = sources.source(TOPOLOGY, SOURCE, config=cfg)
    ingestor = handle.ingest(click_events(records))  # 1. persist before visible
    lines = ftlayer.read_stream(spark, TOPOLOGY, SOURCE, schema="line string", config=cfg,
                                max_records_per_batch=5000)
    parts = F.split("line", r"\|")
    events = (lines.select(parts.getItem(0).cast("long").alias("i"), parts.getItem(1).alias("user"),
                           parts.getItem(2).alias("page"), parts.getItem(3).alias("agent"),
                           F.to_timestamp(parts.getItem(4)).alias("ts"), "_ftlayer")
              .withColumn("section", ftlayer.udf(check, "string", config=cfg)("i", "page")))
    counts = (events.filter(~F.col("agent").startswith("bot") & F.col("section").isNotNull())
              # a replayed record arrives later than its neighbours: with a watermark tighter than
              # how far a replay can lag behind in event time, Spark drops it as late data. The
              # demo's 20,000 clicks span 5.5 hours of event time, so its watermark is a day.
              .withWatermark("ts", "1 day")
              .groupBy(F.window("ts", "1 hour"), "user").count())

    slow = {"done": False}

    def write(df: Any, _batch_id: int) -> None:
        rows = df.select(F.col("window.start").alias("start"), "user", "count")
        rows.write.mode("append").parquet(str(out))
        if not slow["done"] and (marks / "kill").exists():  # once, a little into the run: a slow sink
            slow["done"] = True
            # past its records' timeout (T .. 1.5 T after their persist; one T more for a record read
            # only after its first timeout, as on a loaded machine), and on until the hold has
            # postponed at least one of them, at most 4 T in all
            held, deadline = handle.stats()["refiled_held"], time.monotonic() + 4 * timeout_s
            time.sleep(1.6 * timeout_s)
            while handle.stats()["refiled_held"] == held and time.monotonic() < deadline:
                time.sleep(0.2)

    def start() -> Any:
        return (counts.writeStream.outputMode("update").foreachBatch(ftlayer.acking(write, config=cfg))
                .option("checkpointLocation", str(work / "checkpoint")).trigger(processingTime="500 milliseconds")
                .start())

    query = start()
    blocked = work / "checkpoint" / "commits" / "2"
    bar = TaskProgress("demo dataframe", total=records)
    bar.log(f"DataFrame query started; FT on; Redis namespace '{cfg.namespace}'; output {out}")
    restarted = False
    try:
        deadline = time.monotonic() + 180 + 10 * timeout_s
        while time.monotonic() < deadline:
            if not blocked.exists() and not restarted and (work / "checkpoint" / "commits" / "1").is_file():
                blocked.mkdir()  # batch 2's commit log entry cannot be written
                bar.log("fault: batch 2 will fail after its write, before Spark's commit log entry")
            if query.exception() is not None:
                if restarted or not blocked.is_dir():
                    raise query.exception()
                query.stop()
                blocked.rmdir()
                restarted = True
                bar.log("batch 2 failed before its commit; restarting the query on its checkpoint "
                        "(Spark re-runs the batch: its records were not acked)")
                query = start()
                continue
            st = handle.stats()
            bar.update(st["acked"] + st["dead_lettered"], figures={
                "persisted": st["persisted"], "acked": st["acked"], "pending": st["pending"],
                "replayed": st["replayed"], "dead": st["dead_lettered"]})
            if ingestor.done and st["pending"] == 0 and st["failed_waiting"] == 0:
                query.processAllAvailable()
                break
            time.sleep(0.5)
    finally:
        bar.close()
        query.stop()
    try:
        return report(spark, handle, records, out, marks, restarted=restarted)
    finally:
        handle.stop()


def expected_counts(records_in: int, dead: set[int]) -> dict[tuple[Any, str], int]:
    """(window start, user) -> clicks the generator produced there, minus bots and dead letters."""
    from datetime import datetime

    out: dict[tuple[Any, str], int] = {}
    for line in click_events(records_in):
        i, user, _page, agent, ts = line.split("|")
        if agent.startswith("bot") or int(i) in dead:
            continue
        start = datetime.fromisoformat(ts).replace(minute=0, second=0, microsecond=0)
        key = (start, user)
        out[key] = out.get(key, 0) + 1
    return out


def report(spark: Any, handle: Any, records_in: int, out: Path, marks: Path, *, restarted: bool = False) -> int:
    from datetime import timezone

    from serialization.payload import unpack_payload

    layer = handle.layer
    st = layer.stats()
    final: dict[tuple[Any, str], int] = {}
    if out.exists():
        for row in spark.read.parquet(str(out)).collect():
            start = row["start"]
            start = start.replace(tzinfo=timezone.utc) if start.tzinfo is None else start.astimezone(timezone.utc)
            key = (start, row["user"])
            final[key] = max(final.get(key, 0), row["count"])  # update mode: the last count is the largest
    counted = sum(final.values())
    dead = layer.list_dead_letters(10_000)
    dead_i = {int(str(unpack_payload(d.record.payload)).split("|")[0]) for d in dead if d.record}
    expected = expected_counts(records_in, dead_i)
    wrong = sorted((k for k in set(expected) | set(final) if final.get(k, 0) != expected.get(k, 0)), key=str)
    bots = sum(1 for i in range(records_in) if i % 40 == 7)
    # every produced record must end acked (folded into a count, or filtered as a bot) or
    # dead-lettered; and every count must be exactly what passed the filter in its window
    lost = max(records_in - st["acked"] - st["dead_lettered"], 0) + max(sum(expected.values()) - counted, 0)
    left = st["pending"] + st["failed_waiting"]
    print("\n== ftlayer demo report (DataFrame pipeline) ==")
    print(f"records in           {records_in}")
    print(f"records counted      {counted}  in {len(final)} (1-hour window, user) counts; "
          f"expected {sum(expected.values())} ({bots} bot clicks filtered)")
    print(f"counts checked       {len(expected) - len(wrong)} of {len(expected)} right"
          + (f"; wrong: {wrong[:3]}" if wrong else "   (every count equals what the generator produced)"))
    print(f"replays              {st['replayed']}")
    print(f"held by a slow batch {st['refiled_held']} timeouts postponed (none replayed for it)")
    print(f"failed before commit {'batch 2, re-run by Spark after a restart' if restarted else 'no'}")
    print(f"dead letters         {len(dead)}" + (f"  ({dead[0].reason.strip().splitlines()[-1]})" if dead else ""))
    print(f"worker killed        {'yes' if (marks / 'kill').exists() else 'no'}")
    print(f"lost                 {lost}   (must be 0)")
    print(f"acker entries left   {left}   (must be 0)")
    print(f"leftover state       {layer.leftovers() or 'none'}")
    return 0 if lost == 0 and left == 0 and not wrong else 1
