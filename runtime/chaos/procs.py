"""Chaos scenarios that kill whole processes: the driver (SIGKILL, then a restarted driver) and the
Redis server (SIGKILL, then a restart from its AOF after 3 s, or 60 s in long-outage).

Outages last longer than redis-py's own retries (~0.7 s), so they test ftlayer's handling:
ingest pauses and resumes, tasks and the FT source wait within ``outage_budget_s``. The query
must live through them (a restart by the harness fails the scenario), and the checker counts
every record the source produced: one that ingest took and never persisted is lost, not excused.

What each asserts is in docs/fault-injection.md. The Redis kill runs against a server the scenario
owns (an :class:`~ftlayer.servers.embedded.EmbeddedServer` with a data directory), configured the way ftlayer
configures its embedded server for the durability mode: ``appendfsync always`` for ``waitaof``,
``everysec`` otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from typing import Any

from ftlayer.config.options import SINGLE_SERVER_DURABILITY
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.frames import SemiDeserializedSerializer
from ftlayer.servers.embedded import EmbeddedServer
from runtime.chaos.base import ScenarioContext, build, finish, run_query, sink_args, spawn_driver
from runtime.chaos.errors import ChaosError
from runtime.chaos.faults import ChaosMap, Sampler
from runtime.chaos.scenarios import paced
from runtime.checker import Report
from runtime.testing import CollectingSink, ScriptedSource
from serialization.payload import unpack_payload

WINDOW_S = 2.0  # everysec: up to ~1 s of acknowledged persists, ~2 s under fsync stalls


def pending_ids(layer: FTLayer) -> list[int]:
    """The ``"i"`` of every record pending in ``layer`` right now (decoded from their chunks)."""
    serializer = SemiDeserializedSerializer()
    return [int(unpack_payload(serializer.decode(frame).payload)["i"])
            for _sid, frame in layer.iter_pending()]


def _driver(ctx: ScenarioContext, phase: int, records: int, pipeline: str) -> subprocess.Popen[str]:
    cfg = ctx.config
    return spawn_driver(ctx, "runtime.chaos.driver_app",
                        ["--phase", str(phase), "--redis-url", cfg.redis_url, "--namespace", cfg.namespace,
                         "--workdir", str(ctx.workdir), "--records", str(records), "--pipeline", pipeline,
                         *sink_args(ctx)], f"driver{phase}.log")


def kill_driver(ctx: ScenarioContext, records: int, kill_timeout_s: float = 240.0,
                pipeline: str = "topology") -> Report:
    """SIGKILL the driver (and its Spark JVM) while records are pending; a restarted driver (same
    pipeline, namespace and checkpoint, a source with nothing new) finishes everything."""
    layer = ctx.layer()
    first = _driver(ctx, 1, records, pipeline)
    ctx.say("phase 1 driver started")
    at_kill: dict[str, int] = {}
    try:
        deadline = time.monotonic() + kill_timeout_s
        while time.monotonic() < deadline:
            st = layer.stats()
            if st["persisted"] >= records and records // 10 < st["acked"] < records:
                break
            if first.poll() is not None:
                msg = f"chaos kill-driver: phase 1 ended (exit {first.returncode}) before it could be killed"
                raise ChaosError(msg)
            time.sleep(0.1)
        else:
            msg = f"chaos kill-driver: phase 1 never reached the kill point: {layer.stats()}"
            raise ChaosError(msg)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # the driver and its Spark JVM, no clean shutdown
        first.wait(30)
    at_kill = layer.stats()
    pending = pending_ids(layer)
    ctx.faults.record("kill-driver", pending)
    ctx.notes.append(f"driver killed with {at_kill['pending']} pending, {at_kill['acked']} acked")
    ctx.say(f"driver killed ({at_kill['pending']} pending); starting phase 2")
    second = _driver(ctx, 2, records, pipeline)
    out, _ = second.communicate(timeout=600)
    ctx.say(f"phase 2 driver exited {second.returncode}")
    ctx.notes.append(f"restarted driver: exit {second.returncode}: {out.strip().splitlines()[-1:] or ''}")
    report = finish(ctx, [layer], CollectingSink(ctx.out_dir), range(records))
    report.expect(f"killed while records were pending ({at_kill['pending']})", at_kill["pending"] > 0)
    report.expect("the restarted driver drained and exited 0", second.returncode == 0)
    return report


def kill_redis(ctx: ScenarioContext, records: int, durability: str = "everysec", down_s: float = 3.0, *,
               server: EmbeddedServer | None = None, pipeline: str = "topology") -> Report:
    """SIGKILL the Redis server mid-run (half the records ingested) and restart it from its AOF
    after ``down_s``; assert what ``durability`` promises (see the module notes) and that the
    query lived through the outage."""
    if durability not in SINGLE_SERVER_DURABILITY:
        msg = f"chaos kill-redis: durability must be one of {SINGLE_SERVER_DURABILITY}, got {durability!r}"
        raise ChaosError(msg)
    own = server is None
    if server is None:
        fsync = "always" if durability == "waitaof" else "everysec"
        server = EmbeddedServer(data_dir=ctx.workdir / "redis", appendfsync=fsync).start()
    try:
        return _kill_redis(ctx, records, durability, down_s, server=server, pipeline=pipeline)
    finally:
        if own:
            server.stop()


def long_outage(ctx: ScenarioContext, records: int, down_s: float = 60.0, *,
                server: EmbeddedServer | None = None, pipeline: str = "topology") -> Report:
    """The Redis server is down for ``down_s`` (60 s) in the middle of the stream: SIGKILLed and
    restarted from its AOF (``appendfsync always``, ``waitaof``: a kill loses nothing persisted).
    Nothing the source produced may be lost and the query must not die."""
    own = server is None
    if server is None:
        server = EmbeddedServer(data_dir=ctx.workdir / "redis", appendfsync="always").start()
    if down_s >= ctx.config.outage_budget_s:
        msg = f"chaos long-outage: down_s={down_s} must stay below outage_budget_s={ctx.config.outage_budget_s}"
        raise ChaosError(msg)
    try:
        return _kill_redis(ctx, records, "waitaof", down_s, server=server, pipeline=pipeline)
    finally:
        if own:
            server.stop()


def _kill_redis(ctx: ScenarioContext, records: int, durability: str, down_s: float, *,
                server: EmbeddedServer, pipeline: str = "topology") -> Report:
    ctx.config = ctx.config.replace(redis_url=server.url, durability=durability, timeout_s=20.0)
    step = max(records // 60, 1)
    source = ScriptedSource(paced(records, step, 0.1, warm=ctx.layer()))  # ingest spans ~8 s
    ingestors: list[Any] = []

    def acknowledged() -> int:  # records whose persist returned, over every query incarnation
        return sum(ing.ingested for ing in ingestors)

    sampler = Sampler(acknowledged).start()
    kill: dict[str, float] = {}

    def tick(running: Sequence[Any]) -> None:
        # runs on the thread that started the server: its parent-death signal (PR_SET_PDEATHSIG)
        # is tied to that thread, so a restart from a short-lived thread would be SIGTERMed
        ingestors.extend(ing for ing in running if ing not in ingestors)
        if "t" in kill or (acknowledged() < records // 2 and not source.ended):
            return
        kill["acked"] = acknowledged()
        kill["t"] = time.monotonic()
        server.kill()
        time.sleep(down_s)
        server.start()
        kill["back"] = time.monotonic()

    sink = ctx.sink()
    try:
        if pipeline == "dataframe":
            from runtime.chaos.df_pipeline import run_pipeline

            report, restarts = run_pipeline(ctx, source, [], on_tick=lambda ing: tick([ing]))
        else:
            restarts = run_query(ctx, lambda: build(ctx.config, source, ChaosMap([]), sink, keyed=False),
                                 on_tick=lambda q: tick(q.ingestors), max_records_per_batch=500)
            report = finish(ctx, [ctx.layer()], sink, source)
    finally:
        sampler.stop()
    if "t" not in kill:
        report.expect("the Redis server was killed", False)
        return report
    t_kill = kill["t"]
    window = kill["acked"] - sampler.at(t_kill - WINDOW_S)
    ctx_note = (f"{durability}: server SIGKILLed at {kill['acked']} acknowledged persists, back after "
                f"{kill['back'] - t_kill:.2f} s; {window} persists acknowledged in the {WINDOW_S:.0f} s "
                f"before the kill; query restarts {restarts}")
    report.notes.append(ctx_note)
    report.expect(f"the query lived through the outage (restarts {restarts})", restarts == 0)
    lost = report.lost
    # the source's records, not ingest's: a record ingest took and never persisted is lost
    unacknowledged = source.emitted - acknowledged()
    if unacknowledged:
        report.notes.append(f"{unacknowledged} records were read from the source but never persisted")
    if durability == "waitaof":
        report.expect(f"waitaof: nothing the source produced was lost ({len(lost)} lost, "
                      f"{unacknowledged} never persisted)", not lost and unacknowledged == 0)
    else:
        early = [i for i in lost if (source.emitted_at(i) or 0.0) < t_kill - WINDOW_S - 0.5]
        report.lost_in_window = [i for i in lost if i not in set(early)]
        report.lost = early
        report.notes.append(f"{durability}: {len(report.lost_in_window)} acknowledged records lost in the "
                            f"window (bound {window})")
        report.expect(f"{durability}: loss bounded by the last {WINDOW_S:.0f} s of persists "
                      f"({len(lost)} <= {window})", len(lost) <= window)
    return report
