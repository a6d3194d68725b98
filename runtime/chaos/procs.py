"""Chaos scenarios that kill whole processes: the driver (SIGKILL, then a restarted driver) and the
Redis server (SIGKILL, then a restart from its AOF after 3 s, or 60 s in long-outage).

Outages last longer than redis-py's own retries (~0.7 s), so they test ftlayer's handling:
ingest pauses and resumes, tasks and the FT source wait within ``outage_budget_s``. The query
must live through them (a restart by the harness fails the scenario), and the checker counts
every record the source produced: one that ingest took and never persisted is lost, not excused.

What each asserts is in docs/fault-injection.md. The Redis kill runs against a server the scenario
owns (an :class:`~ftlayer.server.EmbeddedServer` with a data directory), configured the way ftlayer
configures its embedded server for the durability mode: ``appendfsync always`` for ``waitaof``,
``everysec`` otherwise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftlayer.config import SINGLE_SERVER_DURABILITY
from ftlayer.frames import SemiDeserializedSerializer
from ftlayer.layer import FTLayer
from ftlayer.server import EmbeddedServer
from runtime.chaos.base import ChaosError, ScenarioContext, build, finish, run_query, sink_args
from runtime.chaos.faults import ChaosMap, Sampler
from runtime.chaos.scenarios import paced
from runtime.checker import Report
from runtime.testing import CollectingSink, ScriptedSource
from serialization.payload import unpack_payload

WINDOW_S = 2.0  # everysec: up to ~1 s of acknowledged persists, ~2 s under fsync stalls
DRIVER_TIMEOUT_S = 8.0  # the record timeout of the driver programs a scenario kills (their --timeout-s)
DRIVER_BUCKETS = 3  # and their num_buckets


def all_due_after_s(timeout_s: float = DRIVER_TIMEOUT_S, num_buckets: int = DRIVER_BUCKETS) -> float:
    """Seconds after a driver's death by which every record it left pending is due for its timeout.

    A record fails at the first expiry ``timeout_s * (1 + 1/(num_buckets - 1))`` after its persist
    or the last refile by a running batch's hold (``ftlayer.holds``), and the dead driver's holds
    lapse within one lease (at most one rotation interval). A driver restarted this long after the
    kill finds every record the dead one left pending due, as one that spends longer than that
    starting its JVM does.
    """
    return timeout_s * (1 + 1 / (num_buckets - 1))


def release_after(release: Path, since: float, delay_s: float) -> None:
    """Create ``release`` (``runtime.testing.hold_until``) ``delay_s`` after ``since`` (monotonic)."""
    time.sleep(max(0.0, since + delay_s - time.monotonic()))
    release.touch()


def pending_ids(layer: FTLayer) -> list[int]:
    """The ``"i"`` of every record pending in ``layer`` right now (decoded from their chunks)."""
    serializer = SemiDeserializedSerializer()
    return [int(unpack_payload(serializer.decode(frame).payload)["i"])
            for _sid, frame in layer.iter_pending()]


def _driver(ctx: ScenarioContext, phase: int, records: int, pipeline: str,
            hold_until: Path | None = None) -> subprocess.Popen[str]:
    cfg = ctx.config
    hold = ["--hold-until", str(hold_until)] if hold_until is not None else []
    return subprocess.Popen(
        [sys.executable, "-m", "runtime.chaos.driver_app", "--phase", str(phase), "--redis-url", cfg.redis_url,
         "--namespace", cfg.namespace, "--workdir", str(ctx.workdir), "--records", str(records),
         "--timeout-s", str(DRIVER_TIMEOUT_S), "--pipeline", pipeline, *hold, *sink_args(ctx)],
        stdout=subprocess.PIPE, stderr=(ctx.workdir / f"driver{phase}.log").open("w"), text=True,
        start_new_session=True,
    )


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc``'s process group (a driver and its Spark JVM) if it still runs, and reap it."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def kill_driver(ctx: ScenarioContext, records: int, kill_timeout_s: float = 240.0,
                pipeline: str = "topology") -> Report:
    """SIGKILL the driver (and its Spark JVM) while records are pending; a restarted driver (same
    pipeline, namespace and checkpoint, a source with nothing new) finishes everything.

    The restarted driver's process starts with the first one and holds, its JVM up
    (``runtime.testing.hold_until``), touching nothing of the scenario, until every record the
    killed driver left pending is due for its timeout (:func:`all_due_after_s` after the kill, as
    when the restart spends that long starting a JVM); the scenario does not wait out a JVM start."""
    layer = ctx.layer()
    release = ctx.workdir / "release-driver2"
    first = _driver(ctx, 1, records, pipeline)
    second = _driver(ctx, 2, records, pipeline, hold_until=release)
    ctx.say("phase 1 driver started (and the phase 2 driver, held until the kill)")
    try:
        return _kill_driver(ctx, layer, first, second=second, release=release, records=records,
                            kill_timeout_s=kill_timeout_s)
    finally:
        kill_group(second)  # only if the scenario failed before it ended


def _kill_driver(ctx: ScenarioContext, layer: FTLayer, first: subprocess.Popen[str], *,
                 second: subprocess.Popen[str], release: Path, records: int, kill_timeout_s: float) -> Report:
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
        kill_group(first)  # the driver and its Spark JVM, no clean shutdown
    killed_at = time.monotonic()
    at_kill = layer.stats()
    pending = pending_ids(layer)
    ctx.faults.record("kill-driver", pending)
    ctx.notes.append(f"driver killed with {at_kill['pending']} pending, {at_kill['acked']} acked")
    ctx.say(f"driver killed ({at_kill['pending']} pending); phase 2 starts once they are due")
    release_after(release, killed_at, all_due_after_s())
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
            from runtime.chaos.dataframe import _run

            report, restarts = _run(ctx, source, [], on_tick=lambda ing: tick([ing]))
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
