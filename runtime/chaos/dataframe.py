"""Chaos scenarios on a DataFrame pipeline: ``ftlayer chaos <scenario> --pipeline dataframe``.

The pipeline is the DataFrame path as a user writes it::

    ftlayer.ingest("chaos", "events", ScriptedSource(...))            # a driver thread, apart from the query
    df = ftlayer.read_stream(spark, "chaos", "events", schema="i long, user string")
    out = df.withColumn("ok", ftlayer.udf(faults, "int")("i", "user")).filter("ok IS NOT NULL")
    out.writeStream.foreachBatch(ftlayer.acking(write_lines)).start()  # CollectingSink's line format

The record faults of :mod:`runtime.chaos.faults` run inside the ``ftlayer.udf`` (a raising
row fails its own record; a killed Python worker fails the task, which Spark retries), and
the batch faults in ``write_lines``. The run loop starts the query, waits until ingest ended
and nothing is pending or waiting for replay, lets the last batch commit, and stops it; a
query that dies is restarted on its checkpoint (ingest is not restarted: it never depended
on the query). The checker is the same as for the Topology scenarios.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.chaos.base import SOURCE, TOPOLOGY, ChaosError, ScenarioContext, _first_line, finish
from runtime.chaos.faults import ChaosMap, FailAtRate, KillWorker, Poison, RecordFault
from runtime.chaos.scenarios import paced
from runtime.checker import Report
from runtime.testing import CollectingSink, FaultLog, ScriptedSource

TRIGGER = "200 milliseconds"


class _Lines:
    """``foreachBatch`` writer: the batch's rows as CollectingSink lines; optionally dies on one batch."""

    def __init__(self, out: Path, faults: FaultLog, fail_batch: int | None) -> None:
        self.out, self.faults, self.fail_batch = out, faults, fail_batch

    def __call__(self, df: Any, batch_id: int) -> None:
        if self.fail_batch is not None and batch_id == self.fail_batch and df.count() > 0:
            self.faults.once("batch-fails", f"b{batch_id}")
            msg = f"chaos batch-fails: batch {batch_id} dies"
            raise OSError(msg)
        rows = df.select("i", "user", "_ftlayer.origin", "_ftlayer.replay").collect()
        lines = [json.dumps({"origin": r["origin"], "replay": r["replay"] > 0, "partition": -1,
                             "value": {"i": r["i"], "user": r["user"]}}) for r in rows]
        if lines:
            self.out.mkdir(parents=True, exist_ok=True)
            tmp = self.out / f".part-{uuid.uuid4().hex}.tmp"
            tmp.write_text("\n".join(lines) + "\n")
            tmp.rename(self.out / f"part-{uuid.uuid4().hex}.jsonl")


def _run(ctx: ScenarioContext, source: ScriptedSource, faults: list[RecordFault], *,
         fail_batch: int | None = None, max_records_per_batch: int | None = 500,
         timeout_s: float = 300.0, max_restarts: int = 3) -> tuple[Report, int]:
    import ftlayer
    from runtime.dataframe import sources

    cfg = ctx.config
    handle = sources.source(TOPOLOGY, SOURCE, config=cfg, num_channels=cfg.num_channels)
    mapper = ChaosMap(faults)

    def apply(i: int, user: str) -> int:
        mapper({"i": i, "user": user})
        return 1

    ingestor = handle.ingest(source, key=lambda v: v["user"])
    restarts = 0
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            df = ftlayer.read_stream(ctx.spark, TOPOLOGY, SOURCE, schema="i long, user string", config=cfg,
                                     max_records_per_batch=max_records_per_batch)
            out = df.withColumn("ok", ftlayer.udf(apply, "int", config=cfg)("i", "user")).filter("ok IS NOT NULL")
            writer = _Lines(ctx.out_dir, ctx.faults, fail_batch)
            query = (out.writeStream.foreachBatch(ftlayer.acking(writer, config=cfg, on_error="raise"))
                     .option("checkpointLocation", str(ctx.checkpoint)).trigger(processingTime=TRIGGER).start())
            died = _wait(query, handle, ingestor, deadline)
            if died is None:
                break
            if restarts >= max_restarts:
                msg = f"chaos {ctx.name}: the query died {restarts + 1} times; last: {_first_line(died)}"
                raise ChaosError(msg) from died
            restarts += 1
            ctx.notes.append(f"query died ({_first_line(died)}); restarted on its checkpoint (#{restarts})")
            ctx.say(f"query died; restarting on its checkpoint (#{restarts})")
        if time.monotonic() >= deadline:
            ctx.notes.append(f"not drained within {timeout_s:.0f} s")
    finally:
        ingestor.stop()
        handle.stop()
    return finish(ctx, [ctx.layer()], CollectingSink(ctx.out_dir), source), restarts


def _wait(query: Any, handle: Any, ingestor: Any, deadline: float) -> BaseException | None:
    """Until drained (then let the last batch commit) or dead; the query is stopped either way."""
    died: BaseException | None = None
    try:
        while time.monotonic() < deadline and died is None:
            died = query.exception()
            st = handle.stats()
            if died is None and ingestor.done and st["pending"] == 0 and st["failed_waiting"] == 0:
                query.processAllAvailable()
                break
            time.sleep(0.25)
    except Exception as exc:  # the query died while finishing
        died = exc
    finally:
        query.stop()
    return died


# --- the scenarios ------------------------------------------------------------------------------

def fail_rate(ctx: ScenarioContext, records: int, rate: float = 0.05) -> Report:
    """``FailRecord`` in the UDF for ``rate`` of the ids (each once): replayed and delivered."""
    ctx.config = ctx.config.replace(timeout_s=30.0, max_replays=3)
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = _run(ctx, source, [FailAtRate(ctx.faults, rate)])
    hit = ctx.faults.affected().get("fail-rate", set())
    report.expect(f"some ids failed ({len(hit)})", len(hit) > 0)
    report.expect("every failed id was replayed and delivered", hit <= set(report.replayed_ids))
    return report


def kill_worker(ctx: ScenarioContext, records: int, how: str = "sigkill") -> Report:
    """The UDF's Python worker is killed mid-partition once; Spark retries the task."""
    ctx.config = ctx.config.replace(timeout_s=30.0)
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = _run(ctx, source, [KillWorker(ctx.faults, [records // 2], how=how)])
    report.expect("a worker was killed", ctx.faults.marks("kill-worker") == 1)
    return report


def poison(ctx: ScenarioContext, records: int, count: int = 1) -> Report:
    """Records whose UDF always raises are dead-lettered with their reason after max_replays."""
    ctx.config = ctx.config.replace(timeout_s=30.0, max_replays=2)
    bad = {records // 3 + k for k in range(count)}
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = _run(ctx, source, [Poison(ctx.faults, bad)])
    dead = {i for i, _ in report.dead_letters}
    report.expect(f"exactly the poison ids were dead-lettered ({sorted(bad)})", dead == bad)
    report.expect("each dead letter says why", all("always fails" in r for _, r in report.dead_letters))
    return report


def batch_fails(ctx: ScenarioContext, records: int, batch: int = 2) -> Report:
    """The ``foreachBatch`` write of batch ``batch`` dies (``on_error="raise"``): its records are
    failed and replayed, the query dies and is restarted on its checkpoint."""
    ctx.config = ctx.config.replace(timeout_s=30.0)
    source = ScriptedSource(paced(records, max(records // 12, 1), 0.05, warm=ctx.layer()))
    report, restarts = _run(ctx, source, [], fail_batch=batch, max_records_per_batch=max(records // 6, 1))
    report.expect(f"batch {batch} failed", ctx.faults.marks("batch-fails") >= 1)
    report.expect(f"the query died and was restarted ({restarts})", restarts >= 1)
    return report


SCENARIOS: dict[str, Callable[..., Report]] = {
    "fail-rate": fail_rate,
    "kill-worker": kill_worker,
    "poison": poison,
    "batch-fails": batch_fails,
}
