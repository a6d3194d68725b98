"""In-process chaos scenarios: faults inside Spark tasks and on the Redis connections.

Each function takes a :class:`~runtime.chaos.base.ScenarioContext` and the number of
records, runs the chaos topology under its faults, and returns the checker's
:class:`~runtime.checker.Report` with the scenario's own expectations added
(``report.expect``). What each one asserts is in docs/fault-injection.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ftlayer.facade.ft_layer import FTLayer
from runtime.chaos.base import ScenarioContext, build, finish, run_query
from runtime.chaos.errors import ChaosError
from runtime.chaos.faults import (
    ChaosMap,
    ConnectionDropper,
    DelayingSink,
    FailAtRate,
    FailBatchSink,
    KillWorker,
    Poison,
    RecordFault,
)
from runtime.checker import Report
from runtime.driver.progress import TaskProgress
from runtime.sinks import ExecutorSink
from runtime.testing import EOF, Emit, Pause, ScriptedSource, Step
from runtime.topology import FTQuery


def warm_up(layer: FTLayer, wait_s: float = 120.0) -> list[Step]:
    """Script steps that emit one record and wait until it was acked: the query's first batch
    (planning, Python workers starting) is then over before the bulk is persisted, so a slow
    start cannot push records past their timeout."""
    return [Emit(1), Pause(wait_s, until=lambda: layer.stats()["acked"] >= 1)]


def paced(records: int, step: int, pause_s: float, *, warm: FTLayer | None = None) -> list[Step]:
    """A script that emits ``records`` in steps of ``step`` with a pause after each, then EOF;
    with ``warm``, the first record is a :func:`warm_up` on that layer."""
    script: list[Step] = warm_up(warm) if warm is not None and records > 0 else []
    left = records - len(script) // 2
    while left > 0:
        script += [Emit(min(step, left)), Pause(pause_s)]
        left -= step
    return [*script, EOF]


def _run(
    ctx: ScenarioContext,
    source: ScriptedSource,
    faults: list[RecordFault],
    *,
    sink: ExecutorSink | None = None,
    keyed: bool = False,
    max_records_per_batch: int | None = 500,
    dup_flushes: bool = False,
    dropper: ConnectionDropper | None = None,
    on_tick: Callable[[FTQuery], None] | None = None,
    timeout_s: float = 300.0,
) -> tuple[Report, int]:
    """Run the chaos topology to drain under ``faults``; the report and the query restarts."""
    sink = sink or ctx.sink()
    mapper = ChaosMap(faults)
    if dropper is not None:
        dropper.start()
    try:
        restarts = run_query(ctx, lambda: build(ctx.config, source, mapper, sink, keyed=keyed),
                             max_records_per_batch=max_records_per_batch, dup_flushes=dup_flushes,
                             on_tick=on_tick, timeout_s=timeout_s)
    finally:
        if dropper is not None:
            dropper.stop()
    if dropper is not None:
        ctx.notes.append(f"CLIENT KILL rounds {dropper.rounds}, connections killed {dropper.killed}")
    report = finish(ctx, [ctx.layer()], sink, source)
    return report, restarts


def fail_rate(ctx: ScenarioContext, records: int, rate: float = 0.05) -> Report:
    """``FailRecord`` for ``rate`` of the ids (each once): all replayed and delivered."""
    ctx.config = ctx.config.replace(timeout_s=30.0, max_replays=3)
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = _run(ctx, source, [FailAtRate(ctx.faults, rate)])
    hit = ctx.faults.affected().get("fail-rate", set())
    report.expect(f"some ids failed ({len(hit)})", len(hit) > 0)
    report.expect("every failed id was replayed and delivered", hit <= set(report.replayed_ids))
    report.expect("failed_explicit >= failed ids", report.stats.get("failed_explicit", 0) >= len(hit))
    return report


def kill_worker(ctx: ScenarioContext, records: int, how: str = "sigkill") -> Report:
    """A Python worker is killed mid-partition once (before its flush); the task retry redoes it."""
    ctx.config = ctx.config.replace(timeout_s=30.0)
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = _run(ctx, source, [KillWorker(ctx.faults, [records // 2], how=how)])
    report.expect("a worker was killed", ctx.faults.marks("kill-worker") == 1)
    return report


def batch_fails(ctx: ScenarioContext, records: int, batch: int = 2) -> Report:
    """Every task of micro-batch ``batch`` dies on all 4 attempts; the query dies and is
    restarted on its checkpoint; the failed batch is re-run and everything arrives."""
    ctx.config = ctx.config.replace(timeout_s=30.0)
    # small persist calls (one stream entry each), so that batches of records/6 can be cut
    source = ScriptedSource(paced(records, max(records // 12, 1), 0.05))
    sink = FailBatchSink(ctx.out_dir, ctx.faults, batch=batch, inner=ctx.eo_sink())
    report, restarts = _run(ctx, source, [], sink=sink, max_records_per_batch=max(records // 6, 1))
    report.expect(f"batch {batch} failed on every attempt ({ctx.faults.marks('batch-fails')} task attempts)",
                  ctx.faults.marks("batch-fails") >= 4)
    report.expect(f"the query died and was restarted ({restarts})", restarts >= 1)
    return report


def duplicate_flushes(ctx: ScenarioContext, records: int) -> Report:
    """Every flush is sent twice with the same token: the second is skipped, nothing replays.

    The pipeline is keyed, so each record crosses two stages: a duplicate of the first stage's
    flush applied twice would cancel its XOR and the record could never complete."""
    ctx.config = ctx.config.replace(timeout_s=30.0)
    ctx.strict = True
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = _run(ctx, source, [], dup_flushes=True, keyed=True)
    s = report.stats
    report.expect(f"duplicate flushes were skipped ({s.get('duplicate_flushes', 0)})",
                  s.get("duplicate_flushes", 0) > 0)
    report.expect("no spurious replay (replayed == failed_timeout == 0)",
                  s.get("replayed", 0) == 0 and s.get("failed_timeout", 0) == 0)
    report.expect("every record acked exactly once (acked == records)", s.get("acked", 0) == records)
    return report


def delayed_acks(ctx: ScenarioContext, records: int, delayed: int = 3, timeout_s: float = 5.0,
                 max_batch_s: float = 2.0) -> Report:
    """The sink hangs (past ``max_batch_s``, so its batch no longer holds its records) and then
    past the timeout before writing the last ``delayed`` records: they time out and are
    replayed; their late acks are ignored (late_deltas)."""
    cfg = ctx.config = ctx.config.replace(timeout_s=timeout_s, num_buckets=3, max_batch_s=max_batch_s)
    layer = ctx.layer()
    ids = range(records - delayed, records)
    # the delayed records come alone, once everything before them was acked, so that the stall
    # holds nothing else back past the timeout
    source = ScriptedSource([*warm_up(layer), Emit(records - delayed - 1),
                             Pause(120, until=lambda: layer.stats()["acked"] >= records - delayed),
                             Emit(delayed), EOF])
    # past the hold's bound and then the latest expiry (T * (1 + 1/(n-1))) plus the service's
    # replay latency, but short enough that the replays, which wait for the stalled batch, do
    # not time out themselves
    sleep_s = cfg.max_batch_s + cfg.timeout_s * (1 + 1 / (cfg.num_buckets - 1)) + 1.5
    sink = DelayingSink(ctx.out_dir, ctx.faults, ids, sleep_s, inner=ctx.eo_sink())
    report, _ = _run(ctx, source, [], sink=sink, max_records_per_batch=None)
    s = report.stats
    report.expect(f"late acks were ignored (late_deltas={s.get('late_deltas', 0)})", s.get("late_deltas", 0) > 0)
    if ctx.eo_sink() is None:
        report.expect("the delayed records timed out and were replayed", set(ids) <= set(report.replayed_ids))
    else:  # the target keeps the first write of each lineage id: the replays' writes were dropped
        report.expect(f"the delayed records timed out ({s.get('failed_timeout', 0)}) and were replayed "
                      f"({s.get('replayed', 0)}), and the target kept one row of each",
                      s.get("failed_timeout", 0) >= len(ids) and s.get("replayed", 0) >= len(ids))
    report.expect("every replay of a delayed record is attributed to the fault",
                  not set(ids) & set(report.unexplained_replays))
    return report


def poison(ctx: ScenarioContext, records: int, count: int = 1) -> Report:
    """Records that always fail are dead-lettered with their reason after max_replays."""
    ctx.config = ctx.config.replace(timeout_s=30.0, max_replays=2)
    bad = {records // 3 + k for k in range(count)}
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    report, _ = _run(ctx, source, [Poison(ctx.faults, bad)])
    dead = {i for i, _ in report.dead_letters}
    report.expect(f"exactly the poison ids were dead-lettered ({sorted(bad)})", dead == bad)
    report.expect("each dead letter says why", all("always fails" in r for _, r in report.dead_letters))
    report.expect("dead letters after max_replays=2 replays each",
                  report.stats.get("replayed", 0) >= 2 * len(bad))
    return report


def drop_connections(ctx: ScenarioContext, records: int, interval_s: float = 0.2) -> Report:
    """``CLIENT KILL TYPE normal`` every ``interval_s`` while records flow and flushes run."""
    ctx.config = ctx.config.replace(timeout_s=30.0)
    source = ScriptedSource(paced(records, 250, 0.2, warm=ctx.layer()))
    dropper = ConnectionDropper(ctx.config.redis_url, interval_s)
    report, _ = _run(ctx, source, [], dropper=dropper)
    report.expect(f"connections were killed ({dropper.killed})", dropper.killed > 0)
    return report


def mixed(ctx: ScenarioContext, records: int, *, rate: float = 0.02, kills: int = 1, poisoned: int = 1,
          drop_interval_s: float = 0.2, max_records_per_batch: int | None = 500, progress: bool = False,
          pace: tuple[int, float] = (500, 0.1)) -> Report:
    """Several faults at once: fail-rate, worker kills, poison, dropped connections, duplicated
    flushes, on a keyed pipeline (key_by, so a shuffle and a second stage)."""
    ctx.config = ctx.config.replace(timeout_s=30.0, max_replays=3, max_pending=max(20_000, 4 * pace[0]))
    log = ctx.faults
    kill_at = [records * (2 * k + 1) // (2 * kills) for k in range(kills)]
    bad = {records // 4 + 7 * k for k in range(poisoned)}
    faults: list[RecordFault] = [FailAtRate(log, rate), KillWorker(log, kill_at, how="exit"), Poison(log, bad)]
    source = ScriptedSource(paced(records, *pace, warm=ctx.layer()))
    dropper = ConnectionDropper(ctx.config.redis_url, drop_interval_s)
    bar = TaskProgress(f"chaos {ctx.name}", total=records, plain_interval_s=10.0) if progress else None
    on_tick = _progress_tick(bar) if bar is not None else None
    try:
        report, _ = _run(ctx, source, faults, keyed=True, dup_flushes=True, dropper=dropper,
                         max_records_per_batch=max_records_per_batch, on_tick=on_tick,
                         timeout_s=max(300.0, records / 100))
    finally:
        if bar is not None:
            try:
                st = ctx.layer().stats()
                bar.update(st["acked"] + st["dead_lettered"], figures=_figures(st), force=True)
            finally:
                bar.close()
    s = report.stats
    report.expect(f"records failed at rate {rate} ({log.marks('fail-rate')})", rate == 0 or log.marks("fail-rate") > 0)
    report.expect(f"workers killed ({log.marks('kill-worker')}/{kills})", log.marks("kill-worker") == kills)
    report.expect("exactly the poison ids were dead-lettered", {i for i, _ in report.dead_letters} == bad)
    report.expect(f"connections were killed ({dropper.killed})", dropper.killed > 0)
    report.expect(f"duplicate flushes were skipped ({s.get('duplicate_flushes', 0)})",
                  s.get("duplicate_flushes", 0) > 0)
    return report


def _figures(st: dict[str, int]) -> dict[str, float]:
    return {k: st[k] for k in ("persisted", "acked", "pending", "replayed", "dead_lettered", "duplicate_flushes")}


def _progress_tick(bar: TaskProgress) -> Callable[[FTQuery], None]:
    """Progress: records done (acked or dead-lettered) out of the total, and the counters."""

    def tick(query: FTQuery) -> None:
        try:
            st = next(iter(query.stats().values()))
        except Exception:  # Redis away for a moment: skip this update
            return
        bar.update(st["acked"] + st["dead_lettered"], figures=_figures(st))

    return tick


def soak(ctx: ScenarioContext, records: int, **params: Any) -> Report:
    """The mixed scenario at a large size with progress lines (not for CI)."""
    unknown = sorted(set(params) - set(inspect.signature(mixed).parameters))
    if unknown:
        msg = f"chaos scenario 'soak' takes no parameter {unknown[0]!r}"
        raise ChaosError(msg)
    kills = max(1, records // 100_000)
    defaults: dict[str, Any] = {"rate": 0.001, "kills": kills, "poisoned": 5, "drop_interval_s": 1.0,
                                "max_records_per_batch": 20_000, "progress": True, "pace": (5_000, 0.0)}
    defaults.update(params)
    return mixed(ctx, records, **defaults)
