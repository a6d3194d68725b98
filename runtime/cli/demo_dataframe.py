"""``scripts/demo dataframe``: the demo as a DataFrame pipeline, with real faults and the same report.

Pipeline (plain Spark between an ftlayer source and an acking sink)::

    raw click lines (a generator: it cannot rewind)  --ftlayer.ingest-->  Redis
    ftlayer.read_stream(..., schema="line string")
      -> split the line with SQL functions, cast columns, parse the timestamp
      -> ftlayer.udf(check_page) (transient failures, a poison record, a killed Python worker)
      -> filter out bots and rows the UDF failed
      -> withWatermark + groupBy(window(ts, 1 hour), user).count()        (update mode)
      -> foreachBatch(ftlayer.acking(write))  : df.write.mode("append").parquet(out)

Report: records in, records counted in the windows (the Parquet output, the last count of each
window and user), bots filtered, replays, dead letters, whether the worker was killed, lost (must
be 0) and acker entries left (must be 0). Windowed counts keep no record identity, so lost is
checked twice: every record the generator produced must end acked or dead-lettered (records in -
acked - dead letters), and the counts must add up to records in - bots - dead letters (a record
never folded shows as missing there; one folded twice makes the run fail too).
Exit status 1 if lost or acker entries left is not 0, or the counts do not add up.
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

    def write(df: Any, _batch_id: int) -> None:
        df.select(F.col("window.start").alias("start"), "user", "count").write.mode("append").parquet(str(out))

    query = (counts.writeStream.outputMode("update").foreachBatch(ftlayer.acking(write, config=cfg))
             .option("checkpointLocation", str(work / "checkpoint")).trigger(processingTime="500 milliseconds")
             .start())
    bar = TaskProgress("demo dataframe", total=records)
    bar.log(f"DataFrame query started; FT on; Redis namespace '{cfg.namespace}'; output {out}")
    try:
        deadline = time.monotonic() + 120 + 10 * timeout_s
        while time.monotonic() < deadline:
            if query.exception() is not None:
                raise query.exception()
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
        return report(spark, handle, records, out, marks)
    finally:
        handle.stop()


def report(spark: Any, handle: Any, records_in: int, out: Path, marks: Path) -> int:
    from serialization.payload import unpack_payload

    layer = handle.layer
    st = layer.stats()
    final: dict[tuple[Any, str], int] = {}
    if out.exists():
        for row in spark.read.parquet(str(out)).collect():
            key = (row["start"], row["user"])
            final[key] = max(final.get(key, 0), row["count"])  # update mode: the last count is the largest
    counted = sum(final.values())
    dead = layer.list_dead_letters(10_000)
    dead_i = {int(str(unpack_payload(d.record.payload)).split("|")[0]) for d in dead if d.record}
    bots = {i for i in range(records_in) if i % 40 == 7}
    expected = records_in - len(bots) - len(dead_i)
    # every produced record must end acked (folded into a count, or filtered as a bot) or
    # dead-lettered; and the counts must add up to exactly the records that passed the filter
    lost = max(records_in - st["acked"] - st["dead_lettered"], 0) + max(expected - counted, 0)
    left = st["pending"] + st["failed_waiting"]
    print("\n== ftlayer demo report (DataFrame pipeline) ==")
    print(f"records in           {records_in}")
    print(f"records counted      {counted}  in {len(final)} (1-hour window, user) counts; "
          f"expected {expected} ({len(bots)} bot clicks filtered)")
    print(f"replays              {st['replayed']}")
    print(f"dead letters         {len(dead)}" + (f"  ({dead[0].reason.strip().splitlines()[-1]})" if dead else ""))
    print(f"worker killed        {'yes' if (marks / 'kill').exists() else 'no'}")
    print(f"lost                 {lost}   (must be 0)")
    print(f"acker entries left   {left}   (must be 0)")
    print(f"leftover state       {layer.leftovers() or 'none'}")
    return 0 if lost == 0 and left == 0 and counted == expected else 1
