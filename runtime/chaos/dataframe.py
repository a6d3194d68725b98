"""Chaos scenarios on a DataFrame pipeline: ``ftlayer chaos <scenario> --pipeline dataframe``.

The pipeline is the DataFrame path as a user writes it (:mod:`runtime.chaos.df_pipeline`, with its run
loop)::

    ftlayer.ingest("chaos", "events", ScriptedSource(...))            # a driver thread, apart from the query
    df = ftlayer.read_stream(spark, "chaos", "events", schema="i long, user string")
    out = df.withColumn("ok", ftlayer.udf(faults, "int")("i", "user")).filter("ok IS NOT NULL")
    out.writeStream.foreachBatch(ftlayer.acking(write_lines)).start()  # CollectingSink's line format

The record faults of :mod:`runtime.chaos.faults` run inside the ``ftlayer.udf`` (a raising
row fails its own record; a killed Python worker fails the task, which Spark retries), and
the batch faults in ``write_lines`` (a batch that dies, a slow sink, a sink outage). The run
loop starts the query, waits until ingest ended and nothing is pending or waiting for replay,
lets the last batch commit, and stops it; a query that dies is restarted on its checkpoint
(ingest is not restarted: it never depended on the query). A Redis outage is ridden out, not
taken for a dead query. The checker is the same as for the Topology scenarios. The sink and
stateful scenarios are in :mod:`runtime.chaos.df_sinks`, the executor kill, the stalled write
(delayed-acks) and the mixed faults in :mod:`runtime.chaos.df_matrix`; the process kills (driver, Redis,
webhook driver) share :mod:`runtime.chaos.procs` and :mod:`runtime.chaos.webhook` with the
Topology path, whose driver programs take ``--pipeline dataframe``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from runtime.chaos.base import ScenarioContext
from runtime.chaos.df_pipeline import run_pipeline
from runtime.chaos.faults import FailAtRate, KillWorker, Poison
from runtime.chaos.scenarios import paced
from runtime.checker import Report
from runtime.testing import ScriptedSource

if TYPE_CHECKING:
    pass

# --- the scenarios ------------------------------------------------------------------------------

def fail_rate(ctx: ScenarioContext, records: int, rate: float = 0.05) -> Report:
    """``FailRecord`` in the UDF for ``rate`` of the ids (each once): replayed and delivered."""
    ctx.config = ctx.config.replace(timeout_s=30.0, max_replays=3)
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = run_pipeline(ctx, source, [FailAtRate(ctx.faults, rate)])
    hit = ctx.faults.affected().get("fail-rate", set())
    report.expect(f"some ids failed ({len(hit)})", len(hit) > 0)
    report.expect("every failed id was replayed and delivered", hit <= set(report.replayed_ids))
    return report


def kill_worker(ctx: ScenarioContext, records: int, how: str = "sigkill") -> Report:
    """The UDF's Python worker is killed mid-partition once; Spark retries the task."""
    ctx.config = ctx.config.replace(timeout_s=30.0)
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = run_pipeline(ctx, source, [KillWorker(ctx.faults, [records // 2], how=how)])
    report.expect("a worker was killed", ctx.faults.marks("kill-worker") == 1)
    return report


def poison(ctx: ScenarioContext, records: int, count: int = 1) -> Report:
    """Records whose UDF always raises are dead-lettered with their reason after max_replays."""
    ctx.config = ctx.config.replace(timeout_s=30.0, max_replays=2)
    bad = {records // 3 + k for k in range(count)}
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = run_pipeline(ctx, source, [Poison(ctx.faults, bad)])
    dead = {i for i, _ in report.dead_letters}
    report.expect(f"exactly the poison ids were dead-lettered ({sorted(bad)})", dead == bad)
    report.expect("each dead letter says why", all("always fails" in r for _, r in report.dead_letters))
    return report


def batch_fails(ctx: ScenarioContext, records: int, batch: int = 2) -> Report:
    """The ``foreachBatch`` write of batch ``batch`` dies once, with no retry (``sink_retry_budget_s = 0``,
    ``on_error="raise"``): the batch does not commit, the query dies and is restarted on its
    checkpoint, and Spark re-runs the batch on its still-pending records."""
    ctx.config = ctx.config.replace(timeout_s=30.0, sink_retry_budget_s=0.0)
    source = ScriptedSource(paced(records, max(records // 12, 1), 0.05, warm=ctx.layer()))
    report, restarts = run_pipeline(ctx, source, [], fail_batch=batch, max_records_per_batch=max(records // 6, 1))
    report.expect(f"batch {batch} failed", ctx.faults.marks("batch-fails") >= 1)
    report.expect(f"the query died and was restarted ({restarts})", restarts >= 1)
    return report


def _variants() -> dict[str, Callable[..., Report]]:
    from runtime.chaos import df_matrix, df_sinks, mqtt, procs, webhook

    return {
        "kill-executor": df_matrix.kill_executor,
        "delayed-acks": df_matrix.delayed_acks,
        "mixed": df_matrix.mixed,
        "kill-driver": functools.partial(procs.kill_driver, pipeline="dataframe"),
        "kill-redis": functools.partial(procs.kill_redis, pipeline="dataframe"),
        "long-outage": functools.partial(procs.long_outage, pipeline="dataframe"),
        # acks come at Spark's commit: a slower client, so the kill lands while records are in flight
        "webhook-driver-kill": functools.partial(webhook.webhook_driver_kill, pipeline="dataframe", pace_s=0.1),
        "webhook-driver-front-kill": functools.partial(webhook.webhook_front_kill_in_driver, pipeline="dataframe",
                                                       pace_s=0.1),
        "mqtt-driver-kill": functools.partial(mqtt.mqtt_driver_kill, pipeline="dataframe", pace_s=0.02),
        "slow-sink": df_sinks.slow_sink,
        "sink-outage": df_sinks.sink_outage,
        "aggregate": df_sinks.aggregate,
    }


SCENARIOS: dict[str, Callable[..., Report]] = {
    "fail-rate": fail_rate,
    "kill-worker": kill_worker,
    "poison": poison,
    "batch-fails": batch_fails,
}


def scenario(name: str) -> Callable[..., Report] | None:
    """The DataFrame variant of scenario ``name``, or None if it has none."""
    return SCENARIOS.get(name) or _variants().get(name)


def names() -> list[str]:
    """Every scenario with a DataFrame variant."""
    return sorted({*SCENARIOS, *_variants()})
