"""The DataFrame variants of the matrix's executor kill, delayed acks and mixed faults.

The same faults as their Topology versions (:mod:`runtime.chaos.scenarios`,
:mod:`runtime.chaos.executors`), on the DataFrame pipeline of :mod:`runtime.chaos.dataframe`:

- ``kill-executor`` (needs ``local-cluster[N,C,M]``): the task that processes one id (30 % into the
  stream) stops in the row function and a driver thread SIGKILLs *that task's* executor JVM, so the
  kill lands mid-batch, with the task running. Spark runs the lost task again on the other
  executor; its records were never acked (acks come at Spark's commit), so the re-run reads them.
- ``delayed-acks``: the ``foreachBatch`` write of the last ``delayed`` records (alone in their batch)
  stalls after reading them until their timeout fired and the replayer filed their copies: the
  batch's hold lapsed (``max_batch_s``), so the first attempt is still in flight while its replay
  exists. Then it writes and Spark commits. Spark plans one batch after another, so the copies
  cannot be read before that commit; settling the batch finds the records failed by timeout and
  completes them late (``late_completions``), which settles the copies unread (into an
  effectively-once ``--sink`` the write reads the batch a second time, after they timed out:
  that read skips them, so they are not completed late and their replays write them). Each record then
  reaches any sink once; an effectively-once sink would also drop a copy that was read (same
  lineage id). The DataFrame path has no XOR acks, so there is no ``late_deltas`` to count here.
- ``mixed``: fail-rate (2 %), a Python worker exiting (``os._exit``), a poison record and
  ``CLIENT KILL`` every 200 ms, on a keyed pipeline (``repartition(user)`` before the row
  function). The Topology version also duplicates every flush; the DataFrame path acks at Spark's
  commit and sends no flush, so that fault has nothing to hit.
"""

from __future__ import annotations

import time
from typing import Any

from runtime.chaos.base import ScenarioContext
from runtime.chaos.df_pipeline import Lines, run_pipeline
from runtime.chaos.executors import ExecutorKiller, StallUntilKilled, check_kill_executor
from runtime.chaos.faults import ConnectionDropper, FailAtRate, KillWorker, Poison, RecordFault
from runtime.chaos.scenarios import paced, warm_up
from runtime.checker import Report
from runtime.testing import EOF, Emit, FaultLog, Pause, ScriptedSource


def kill_executor(ctx: ScenarioContext, records: int, at_fraction: float = 0.3) -> Report:
    """SIGKILL the executor JVM running the task of id ``records * at_fraction`` while it runs."""
    check_kill_executor(ctx, at_fraction)
    ctx.config = ctx.config.replace(timeout_s=30.0)
    layer = ctx.layer()
    at = max(1, int(records * at_fraction))
    stall = StallUntilKilled(ctx.faults, at)
    # no probe (and no /proc scan) until the task stalled; then the records acked at the kill
    killer = ExecutorKiller(str(ctx.spark.sparkContext.applicationId),
                            lambda: int(layer.stats()["acked"]) if stall.jvm_file.exists() else -1, 0,
                            pick=stall.victim)
    source = ScriptedSource(paced(records, 250, 0.2, warm=layer))
    killer.start()
    try:
        report, restarts = run_pipeline(ctx, source, [stall])
    finally:
        killer.stop()
    report.notes.append(f"executor JVM {killer.killed} SIGKILLed while its task held id {at} "
                        f"({killer.progress_at_kill} acked then); query restarts {restarts}")
    report.expect(f"the JVM running the task of id {at} was SIGKILLed mid-task and died ({killer.error or 'ok'})",
                  killer.killed is not None and killer.gone and stall.victim([killer.killed]) == killer.killed)
    report.expect(f"the kill came mid-run ({killer.progress_at_kill} of {records} acked)",
                  0 <= killer.progress_at_kill < records)
    return report


class StalledWrite:
    """``Lines(before_write=...)``: the first write holding one of ``ids`` waits (polling the FT
    counters, at most ``bound_s``) until as many records timed out and were replayed as it holds of
    ``ids``. ``seen`` keeps what it saw: the counters' rise and the seconds it waited."""

    def __init__(self, faults: FaultLog, ids: frozenset[int], stats: Any, bound_s: float,
                 name: str = "delayed-acks") -> None:
        self.log, self.ids, self.stats, self.bound_s, self.name = faults, ids, stats, bound_s, name
        self.seen: dict[str, float] = {}

    def __call__(self, batch: list[int]) -> None:
        mine = self.ids.intersection(batch)
        if not mine or not self.log.once(self.name, "stall"):
            return
        self.log.record(self.name, batch)
        before, started = self.stats(), time.monotonic()
        rise = dict.fromkeys(("failed_timeout", "replayed"), 0)
        while time.monotonic() - started < self.bound_s:
            now = self.stats()
            rise = {k: now[k] - before[k] for k in rise}
            if min(rise.values()) >= len(mine):
                break
            time.sleep(0.1)
        self.seen = {**rise, "held": len(mine), "waited_s": time.monotonic() - started}


def delayed_acks(ctx: ScenarioContext, records: int, delayed: int = 3, timeout_s: float = 4.0,
                 max_batch_s: float = 2.0) -> Report:
    """The write of the last ``delayed`` records stalls until they timed out and were replayed
    (module notes); each must reach the sink once."""
    cfg = ctx.config = ctx.config.replace(timeout_s=timeout_s, num_buckets=3, max_batch_s=max_batch_s)
    layer = ctx.layer()
    ids = frozenset(range(records - delayed, records))
    # the delayed records come alone, once everything before them was acked, so that the stall
    # holds nothing else back past the timeout
    source = ScriptedSource([*warm_up(layer), Emit(records - delayed - 1),
                             Pause(120, until=lambda: layer.stats()["acked"] >= records - delayed),
                             Emit(delayed), EOF])
    # the hold's bound, the latest expiry T(1 + 1/(n-1)), the replayer's first backoff, and slack
    bound_s = cfg.max_batch_s + cfg.timeout_s * (1 + 1 / (cfg.num_buckets - 1)) + cfg.replay_backoff_initial_s + 10
    stall = StalledWrite(ctx.faults, ids, layer.stats, bound_s)
    writer = Lines(ctx.out_dir, ctx.faults, target=ctx.target, before_write=stall)
    report, _ = run_pipeline(ctx, source, [], write=writer, max_records_per_batch=None)
    s, seen = report.stats, stall.seen
    report.notes.append(f"the stalled write held {seen.get('held', 0):.0f} delayed records and waited "
                        f"{seen.get('waited_s', 0):.1f} s")
    report.expect(f"while the write was in flight its delayed records timed out ({seen.get('failed_timeout', 0):.0f}) "
                  f"and were replayed ({seen.get('replayed', 0):.0f})",
                  bool(seen) and min(seen["failed_timeout"], seen["replayed"]) >= delayed)
    late = s.get("late_completions", 0)
    if writer.reads_twice:
        # the sink's write reads the batch again, after they timed out: that read skipped them, so
        # the commit must leave them to their replays (BATCH_SETTLE completes late only what every
        # read handed on); the report's loss check shows the replays wrote them
        report.notes.append(f"the write's own read of the batch skipped them: late_completions={late}, "
                            "their replays wrote them")
    else:
        report.expect(f"the batch's commit completed them late (late_completions={late})", late >= delayed)
    report.expect(f"each record reached the sink once ({report.duplicates} ids twice)", report.duplicates == 0)
    report.expect("every replay of a delayed record is attributed to the fault",
                  not ids & set(report.unexplained_replays))
    return report


def mixed(ctx: ScenarioContext, records: int, *, rate: float = 0.02, kills: int = 1, poisoned: int = 1,
          drop_interval_s: float = 0.2) -> Report:
    """fail-rate, worker exits, poison and dropped connections at once, on a keyed pipeline."""
    ctx.config = ctx.config.replace(timeout_s=30.0, max_replays=3)
    log = ctx.faults
    kill_at = [records * (2 * k + 1) // (2 * kills) for k in range(kills)]
    bad = {records // 4 + 7 * k for k in range(poisoned)}
    faults: list[RecordFault] = [FailAtRate(log, rate), KillWorker(log, kill_at, how="exit"), Poison(log, bad)]
    source = ScriptedSource(paced(records, 500, 0.1, warm=ctx.layer()))
    dropper = ConnectionDropper(ctx.config.redis_url, drop_interval_s)
    report, _ = run_pipeline(ctx, source, faults, keyed=True, dropper=dropper)
    report.notes.append(f"CLIENT KILL rounds {dropper.rounds}, connections killed {dropper.killed}")
    report.expect(f"records failed at rate {rate} ({log.marks('fail-rate')})", rate == 0 or log.marks("fail-rate") > 0)
    report.expect(f"workers killed ({log.marks('kill-worker')}/{kills})", log.marks("kill-worker") == kills)
    report.expect("exactly the poison ids were dead-lettered", {i for i, _ in report.dead_letters} == bad)
    report.expect(f"connections were killed ({dropper.killed})", dropper.killed > 0)
    return report
