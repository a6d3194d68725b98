"""Chaos on a Valkey Cluster: kill -9 the primary that owns the source in the middle of a run.

The scenario starts its own cluster from the shipped valkey-server (3 primaries, 1 replica
each, ``cluster-node-timeout`` 1.5 s) and runs the chaos pipeline against it. Once half the
records are acknowledged (their persist returned), a driver-side tick SIGKILLs the primary that
owns the source's hash tag and waits until its replica serves the slots. The new primary has no
replica then: for ``hold_s`` (3 s) every ``replicated`` persist times out unconfirmed, and
ingest must hold its batch and retry it. Then the killed node is restarted on its data
directory, rejoins as the new primary's replica, and confirmations resume.

What it asserts (the checker counts what the source produced, not what ingest handed over):

- ``replicated`` / ``replicated-aof``: nothing the source produced is lost. A persist that could
  not be confirmed during the failover is retried with the same records (ingest pauses).
- the other modes wait for no replica: records acknowledged by the old primary and not yet
  streamed to a replica may be lost. The scenario reports how many and asserts only that every
  loss lies in the seconds before the kill.
- the primary was killed and a replica took over.

Spark tasks that hit the dead primary fail and are retried by Spark; a micro-batch that exhausts
its task attempts stops the query, and the harness restarts it on its checkpoint (counted and
reported, not a failure: the records are still pending and are read again).
"""

from __future__ import annotations

import time

from ftlayer.config import DURABILITY_MODES
from ftlayer.servers.cluster import EmbeddedCluster
from runtime.chaos.base import ScenarioContext, build, finish, run_query
from runtime.chaos.errors import ChaosError
from runtime.chaos.faults import ChaosMap, Sampler
from runtime.chaos.scenarios import paced
from runtime.checker import Report
from runtime.testing import ScriptedSource
from runtime.topology import FTQuery

WINDOW_S = 2.0  # asynchronous replication: what the dead primary had not yet streamed


def kill_primary(ctx: ScenarioContext, records: int, durability: str = "replicated", hold_s: float = 3.0) -> Report:
    """SIGKILL the source's primary when half the records are acknowledged; see the module notes."""
    if durability not in DURABILITY_MODES:
        msg = f"chaos kill-primary: durability must be one of {DURABILITY_MODES}, got {durability!r}"
        raise ChaosError(msg)
    with EmbeddedCluster(primaries=3, replicas=1, data_dir=ctx.workdir / "cluster") as cluster:
        # a short wait per attempt: the no-replica window is spent in a few retries, not one long wait
        ctx.config = ctx.config.replace(redis_url=cluster.urls[0], durability=durability, timeout_s=20.0,
                                        waitaof_timeout_ms=500)
        return _kill_primary(ctx, records, durability, cluster, hold_s)


def _kill_primary(ctx: ScenarioContext, records: int, durability: str, cluster: EmbeddedCluster,
                  hold_s: float) -> Report:
    layer = ctx.layer()
    owner = int(layer.store.node_client().connection_pool.connection_kwargs["port"])
    step = max(records // 60, 1)
    source = ScriptedSource(paced(records, step, 0.1, warm=layer))  # ingest spans ~8 s
    queries: list[FTQuery] = []

    def acknowledged() -> int:  # records whose persist returned, over every query incarnation
        return sum(ing.ingested for q in queries for ing in q.ingestors)

    sampler = Sampler(acknowledged).start()
    kill: dict[str, float] = {}

    def tick(query: FTQuery) -> None:
        if not queries or queries[-1] is not query:
            queries.append(query)
        if "t" in kill or (acknowledged() < records // 2 and not source.ended):
            return
        kill["acked"] = acknowledged()
        kill["t"] = time.monotonic()
        cluster.kill_primary(owner)
        ctx.say(f"primary on port {owner} SIGKILLed at {kill['acked']} acknowledged persists")
        result = cluster.wait_failover(owner)
        kill["took"] = result.seconds
        kill["new"] = result.new_primary_port
        time.sleep(hold_s)  # the new primary has no replica: replicated persists stay unconfirmed
        kill["pauses"] = sum(ing.durability_retries for q in queries for ing in q.ingestors)
        node = next(n for n in cluster.nodes if n.port == owner)
        node.start()  # rejoins (nodes.conf in its data dir) as the new primary's replica
        kill["rejoined"] = cluster.wait_replica(result.new_primary_port)
        ctx.say(f"replica {result.new_primary_port} took over in {result.seconds:.1f} s; the killed node "
                f"rejoined as its replica {kill['rejoined']:.1f} s after the hold")

    sink = ctx.sink()
    try:
        restarts = run_query(ctx, lambda: build(ctx.config, source, ChaosMap([]), sink, keyed=True),
                             on_tick=tick, max_records_per_batch=500, max_restarts=5)
    finally:
        sampler.stop()
    report = finish(ctx, [ctx.layer()], sink, source)
    if "t" not in kill:
        report.expect("the owning primary was killed", False)
        return report
    report.expect(f"a replica took over (port {int(kill['new'])}, {kill['took']:.1f} s)", kill["new"] != owner)
    report.notes.append(
        f"{durability}: primary {owner} SIGKILLed at {int(kill['acked'])} acknowledged persists; replica "
        f"{int(kill['new'])} serving after {kill['took']:.1f} s; {hold_s:.0f} s without a replica (ingest "
        f"paused on unconfirmed persists: {int(kill['pauses'])} times); the old node rejoined as a replica "
        f"{kill['rejoined']:.1f} s later; query restarts {restarts}"
    )
    lost = report.lost
    # the server's count, not the ingestors' (a query restarted and drained between two ticks
    # is never seen by them)
    unacknowledged = max(0, source.emitted - ctx.layer().stats()["persisted"])
    if unacknowledged:
        report.notes.append(f"{unacknowledged} records were read from the source but never persisted")
    if durability.startswith("replicated"):
        report.expect(f"{durability}: ingest retried the persists no replica confirmed ({int(kill['pauses'])})",
                      kill["pauses"] > 0)
        report.expect(f"{durability}: nothing the source produced was lost ({len(lost)} lost, "
                      f"{unacknowledged} never persisted)", not lost and unacknowledged == 0)
    else:
        window = int(kill["acked"]) - sampler.at(kill["t"] - WINDOW_S)
        report.lost_in_window = list(lost)
        report.lost = []
        report.notes.append(f"{durability}: {len(lost)} acknowledged records lost in the failover "
                            f"(persists in the last {WINDOW_S:.0f} s before the kill: {window})")
        report.expect(f"{durability}: loss bounded by the last {WINDOW_S:.0f} s of persists "
                      f"({len(lost)} <= {window})", len(lost) <= window)
    return report
