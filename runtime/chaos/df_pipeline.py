"""The DataFrame pipeline the chaos scenarios run, and its run loop (:mod:`runtime.chaos.dataframe`
holds the scenarios on it; :mod:`runtime.chaos.df_sinks`, :mod:`runtime.chaos.df_matrix`, the process
kills and the receivers' driver programs use the same pipeline).

:func:`start_pipeline` builds it as a user writes the DataFrame path::

    ftlayer.ingest("chaos", "events", ScriptedSource(...))            # a driver thread, apart from the query
    df = ftlayer.read_stream(spark, "chaos", "events", schema="i long, user string")
    out = df.withColumn("ok", ftlayer.udf(faults, "int")("i", "user")).filter("ok IS NOT NULL")
    out.writeStream.foreachBatch(ftlayer.acking(write_lines)).start()  # CollectingSink's line format

:func:`run_pipeline` starts the query, waits until ingest ended and nothing is pending or waiting
for replay, lets the last batch commit, and stops it; a query that dies is restarted on its
checkpoint (ingest is not restarted: it never depended on the query). A Redis outage is ridden
out, not taken for a dead query. :func:`serve` is the same loop for a driver program that a
scenario kills (``--pipeline dataframe``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError
from runtime.chaos.base import SOURCE, TOPOLOGY, ScenarioContext, count_restart, finish
from runtime.chaos.faults import ChaosMap, ConnectionDropper, RecordFault
from runtime.checker import Report
from runtime.testing import CollectingSink, FaultLog

if TYPE_CHECKING:
    from runtime.chaos.targets import Target

TRIGGER = "200 milliseconds"


class Lines:
    """``foreachBatch`` writer: the batch's rows as CollectingSink lines. Batch faults: ``fail_batch``
    dies once on that batch; ``slow_s`` sleeps that long on the first batch with rows (a slow sink);
    ``outage_s``: raises for that long from the first batch with rows on (a sink outage, see
    :mod:`runtime.chaos.df_sinks`); ``before_write(ids)`` is called with the batch's ids after it
    read them and before it writes (a write that stalls, see :mod:`runtime.chaos.df_matrix`)."""

    def __init__(self, out: Path, faults: FaultLog, fail_batch: int | None = None, *, slow_s: float = 0.0,
                 outage_s: float = 0.0, target: Target | None = None,
                 before_write: Callable[[list[int]], None] | None = None) -> None:
        self.out, self.faults, self.fail_batch = out, faults, fail_batch
        self.slow_s, self.outage_s, self.before_write = slow_s, outage_s, before_write
        self._outage_ends: float | None = None
        # an effectively-once target (--sink): its foreachBatch sink writes instead of the lines
        self._sink = target.df_writer() if target is not None and target.effectively_once else None
        # the sink reads the batch again after the collect below (two actions on one batch)
        self.reads_twice = self._sink is not None

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.fail_batch is not None and batch_id == self.fail_batch and df.count() > 0 \
                and self.faults.once("batch-fails", f"b{batch_id}"):
            msg = f"chaos batch-fails: batch {batch_id} dies"
            raise OSError(msg)
        rows = df.select("i", "user", "_ftlayer.origin", "_ftlayer.replay", "_ftlayer.lineage").collect()
        if rows and self.outage_s:
            if self._outage_ends is None:
                self._outage_ends = time.monotonic() + self.outage_s
            if time.monotonic() < self._outage_ends:
                self.faults.record("sink-outage", [r["i"] for r in rows])
                msg = f"chaos sink-outage: the sink is down for {self.outage_s:g} s"
                raise ConnectionError(msg)
        if rows and self.slow_s and self.faults.once("slow-sink", "first"):
            time.sleep(self.slow_s)
        if rows and self.before_write is not None:
            self.before_write([int(r["i"]) for r in rows])
        if self._sink is not None:
            from pyspark.sql import functions as F

            meta = [F.col("_ftlayer.origin").alias("origin"), (F.col("_ftlayer.replay") > 0).alias("replay")]
            self._sink(df.select("i", "user", *meta, "_ftlayer"), batch_id)
            return
        write_lines(self.out, [{"origin": r["origin"], "replay": r["replay"] > 0, "lineage": r["lineage"],
                                "partition": -1, "value": {"i": r["i"], "user": r["user"]}} for r in rows])


def write_lines(out: Path, lines: list[dict[str, Any]]) -> None:
    """Append ``lines`` to ``out`` as one CollectingSink part file (atomically)."""
    if not lines:
        return
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".part-{uuid.uuid4().hex}.tmp"
    tmp.write_text("".join(json.dumps(line) + "\n" for line in lines))
    tmp.rename(out / f"part-{uuid.uuid4().hex}.jsonl")


def start_pipeline(spark: Any, cfg: FTConfig, checkpoint: Path, write: Callable[[Any, int], None],
                   mapper: Callable[[Any], Any], *, max_records_per_batch: int | None = 500,
                   on_error: str = "auto", keyed: bool = False) -> Any:
    """Start the chaos DataFrame query (module notes) on ``checkpoint``; returns the StreamingQuery.
    ``keyed``: repartition by ``user`` before the row function (a shuffle, so the function runs in a
    second stage, as after the Topology pipeline's ``key_by``)."""
    import ftlayer

    def apply(i: int, user: str) -> int:
        mapper({"i": i, "user": user})
        return 1

    df = ftlayer.read_stream(spark, TOPOLOGY, SOURCE, schema="i long, user string", config=cfg,
                             num_channels=cfg.num_channels, max_records_per_batch=max_records_per_batch)
    if keyed:
        df = df.repartition(2, "user")
    out = df.withColumn("ok", ftlayer.udf(apply, "int", config=cfg)("i", "user")).filter("ok IS NOT NULL")
    return (out.writeStream.foreachBatch(ftlayer.acking(write, config=cfg, on_error=on_error))
            .option("checkpointLocation", str(checkpoint)).trigger(processingTime=TRIGGER).start())


def serve(spark: Any, cfg: FTConfig, source: Any, workdir: Path, *, sleep_s: float = 0.0,
          drain_s: float = 300.0, before_drain: Callable[[], None] | None = None,
          target: Target | None = None) -> tuple[bool, dict[str, int]]:
    """The chaos DataFrame pipeline as a driver program runs it (``python -m runtime.chaos.driver_app
    --pipeline dataframe``, the webhook driver): ingest ``source``, run the query on
    ``<workdir>/checkpoint``; ``before_drain`` blocks until the source should end (the webhook);
    then wait up to ``drain_s`` until ingest ended and nothing is pending. Returns (drained, stats)."""
    from runtime.dataframe import sources

    handle = sources.source(TOPOLOGY, SOURCE, config=cfg, num_channels=cfg.num_channels)
    ingestor = handle.ingest(source, key=lambda v: v["user"])
    query = start_pipeline(spark, cfg, workdir / "checkpoint",
                           Lines(workdir / "out", FaultLog(workdir / "faults"), target=target),
                           ChaosMap([], sleep_s=sleep_s), max_records_per_batch=400)
    print("started", flush=True)
    if before_drain is not None:
        before_drain()
    deadline = time.monotonic() + drain_s
    ok = False
    while time.monotonic() < deadline and query.exception() is None:
        st = handle.stats()
        if ingestor.done and st["pending"] == 0 and st["failed_waiting"] == 0:
            query.processAllAvailable()
            ok = True
            break
        time.sleep(0.2)
    query.stop()
    stats = handle.stats()
    ingestor.stop()
    handle.stop()
    return ok, stats


def run_pipeline(ctx: ScenarioContext, source: Any, faults: list[RecordFault], *,
         fail_batch: int | None = None, max_records_per_batch: int | None = 500,
         timeout_s: float = 300.0, max_restarts: int = 3, write: Callable[[Any, int], None] | None = None,
         on_tick: Callable[[Any], None] | None = None, check: bool = True, keyed: bool = False,
         dropper: ConnectionDropper | None = None) -> tuple[Report, int]:
    """Run the pipeline over ``source`` until drained (restarting a dead query on its checkpoint).
    ``dropper`` (started here) kills connections until the pipeline drained, and is stopped before the
    checker reads Redis: its CLIENT KILLs would kill the checker's connections too."""
    from runtime.dataframe import sources

    cfg = ctx.config
    handle = sources.source(TOPOLOGY, SOURCE, config=cfg, num_channels=cfg.num_channels)
    mapper = ChaosMap(faults)
    ingestor = handle.ingest(source, key=lambda v: v["user"])
    restarts = 0
    deadline = time.monotonic() + timeout_s
    if dropper is not None:
        dropper.start()
    try:
        while True:
            writer = write or Lines(ctx.out_dir, ctx.faults, fail_batch, target=ctx.target)
            query = start_pipeline(ctx.spark, cfg, ctx.checkpoint, writer, mapper,
                                   max_records_per_batch=max_records_per_batch,
                                   on_error="raise" if fail_batch is not None else "auto", keyed=keyed)
            died = _wait(query, handle, ingestor, deadline, on_tick)
            if died is None:
                break
            restarts = count_restart(ctx, died, restarts, max_restarts)
        if time.monotonic() >= deadline:
            ctx.notes.append(f"not drained within {timeout_s:.0f} s")
    finally:
        if dropper is not None:
            dropper.stop()
        ingestor.stop()
        handle.stop()
    emitted = source if check else []
    return finish(ctx, [ctx.layer()], CollectingSink(ctx.out_dir), emitted), restarts


def _wait(query: Any, handle: Any, ingestor: Any, deadline: float,
          on_tick: Callable[[Any], None] | None = None) -> BaseException | None:
    """Until drained (then let the last batch commit) or dead; the query is stopped either way.
    ``on_tick(ingestor)`` runs on every poll (a fault that kills the server, say)."""
    died: BaseException | None = None
    try:
        while time.monotonic() < deadline and died is None:
            died = query.exception()
            if on_tick is not None:
                on_tick(ingestor)
            try:
                st = handle.stats()
            except (FTLayerError, redis.RedisError):  # a Redis outage: the query waits it out too
                time.sleep(0.25)
                continue
            if died is None and ingestor.done and st["pending"] == 0 and st["failed_waiting"] == 0:
                query.processAllAvailable()
                break
            time.sleep(0.25)
    except Exception as exc:  # the query died while finishing
        died = exc
    finally:
        query.stop()
    return died
