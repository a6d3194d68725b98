"""Chaos scenarios of the DataFrame path's sink side: a slow sink, a sink outage, a stateful aggregate.

- ``slow-sink``: the first batch's write takes three times ``timeout_s``. Its records are held
  while it runs (``ftlayer.acker.holds``): none may time out or replay.
- ``sink-outage``: the sink raises for five times ``timeout_s`` from its first write on. The
  batch is retried in place with the sink breaker open (``ftlayer.acker.breaker``): nothing may be
  failed, replayed or dead-lettered, and everything is delivered once the sink is back.
- ``aggregate``: ``groupBy(user).count()`` in complete mode (state in Spark's state store), with
  a Python worker killed once in the row function and one batch failing after its write and
  before Spark's commit log entry (a directory stands where the entry must go; it is removed
  and the query restarted on its checkpoint). Every final count must equal what the source
  produced for that user: a record acked before the commit, or replayed into committed state,
  would make a count short or long.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from runtime.chaos.base import SOURCE, TOPOLOGY, ScenarioContext, _first_line, finish
from runtime.chaos.df_pipeline import TRIGGER, Lines, run_pipeline
from runtime.chaos.errors import ChaosError
from runtime.chaos.faults import ChaosMap, KillWorker
from runtime.chaos.scenarios import paced
from runtime.checker import Report
from runtime.testing import ScriptedSource, default_value


def slow_sink(ctx: ScenarioContext, records: int, timeout_s: float = 4.0) -> Report:
    """The first batch with rows writes for 3 x ``timeout_s``: 0 timeouts, 0 replays (it held them)."""
    ctx.config = ctx.config.replace(timeout_s=timeout_s, num_buckets=3)
    source = ScriptedSource(paced(records, max(records // 4, 1), 0.05, warm=ctx.layer()))
    # no cap on a batch's records: a capped batch ends inside a stream entry, and the unread rest of
    # that entry counts as read once the batch's hold ended, so it can time out before the next batch
    # holds it (a known gap, see docs/guarantees.md "Not promised"; this scenario is about the hold)
    slow = Lines(ctx.out_dir, ctx.faults, slow_s=3 * timeout_s, target=ctx.target)
    report, _ = run_pipeline(ctx, source, [], write=slow, max_records_per_batch=None)
    st = report.stats
    report.expect("the slow write happened", ctx.faults.marks("slow-sink") == 1)
    report.expect(f"no record timed out ({st.get('failed_timeout', 0)}) or replayed ({st.get('replayed', 0)})",
                  st.get("failed_timeout", 0) == 0 and st.get("replayed", 0) == 0)
    report.expect(f"the batch held its records ({st.get('refiled_held', 0)} timeouts postponed)",
                  st.get("refiled_held", 0) > 0)
    return report


def sink_outage(ctx: ScenarioContext, records: int, timeout_s: float = 4.0) -> Report:
    """The sink is down for 5 x ``timeout_s``: retried in place, breaker open; 0 failed, 0 dead letters."""
    ctx.config = ctx.config.replace(timeout_s=timeout_s, num_buckets=3)
    source = ScriptedSource(paced(records, max(records // 4, 1), 0.05, warm=ctx.layer()))
    down = Lines(ctx.out_dir, ctx.faults, outage_s=5 * timeout_s, target=ctx.target)
    report, _ = run_pipeline(ctx, source, [], write=down)
    st = report.stats
    refused = ctx.faults.affected().get("sink-outage", set())
    report.expect(f"the sink refused writes ({len(refused)} records met the outage)", len(refused) > 0)
    report.expect(f"nothing failed ({st.get('failed_explicit', 0)}), replayed ({st.get('replayed', 0)}) or "
                  f"dead-lettered ({st.get('dead_lettered', 0)})",
                  st.get("failed_explicit", 0) == st.get("replayed", 0) == st.get("dead_lettered", 0) == 0)
    return report


class _Counts:
    """``foreachBatch`` writer of the aggregate: the complete table of each batch, as a JSON file."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def __call__(self, df: Any, batch_id: int) -> None:
        table = {r["user"]: int(r["count"]) for r in df.collect()}
        self.out.mkdir(parents=True, exist_ok=True)
        tmp = self.out / f".counts-{batch_id}.tmp"
        tmp.write_text(json.dumps(table))
        tmp.replace(self.out / f"counts-{batch_id:06d}.json")


def _final_counts(out: Path) -> dict[str, int]:
    files = sorted(out.glob("counts-*.json"))
    return json.loads(files[-1].read_text()) if files else {}


def aggregate(ctx: ScenarioContext, records: int, fail_commit_of: int = 2, timeout_s: float = 20.0,
              run_timeout_s: float = 300.0) -> Report:
    """A stateful aggregate through a killed worker and a batch that fails before its commit log
    entry (module notes): every final count must be whole."""
    import ftlayer
    from runtime.dataframe import sources

    ctx.config = ctx.config.replace(timeout_s=timeout_s, num_buckets=3)
    cfg = ctx.config
    source = ScriptedSource(paced(records, max(records // 10, 1), 0.1, warm=ctx.layer()))
    mapper = ChaosMap([KillWorker(ctx.faults, [records // 3])])
    handle = sources.source(TOPOLOGY, SOURCE, config=cfg, num_channels=cfg.num_channels)
    ingestor = handle.ingest(source, key=lambda v: v["user"])
    blocked = ctx.checkpoint / "commits" / str(fail_commit_of)

    def apply(i: int, user: str) -> int:
        mapper({"i": i, "user": user})
        return 1

    def start() -> Any:
        df = ftlayer.read_stream(ctx.spark, TOPOLOGY, SOURCE, schema="i long, user string", config=cfg,
                                 num_channels=cfg.num_channels, max_records_per_batch=max(records // 8, 1))
        counts = (df.withColumn("ok", ftlayer.udf(apply, "int", config=cfg)("i", "user"))
                  .filter("ok IS NOT NULL").groupBy("user").count())
        return (counts.writeStream.outputMode("complete").foreachBatch(ftlayer.acking(_Counts(ctx.out_dir),
                                                                                      config=cfg))
                .option("checkpointLocation", str(ctx.checkpoint)).trigger(processingTime=TRIGGER).start())

    restarts, deadline = 0, time.monotonic() + run_timeout_s
    try:
        query = start()
        while time.monotonic() < deadline:
            if (ctx.checkpoint / "commits" / str(fail_commit_of - 1)).is_file() and not blocked.exists() \
                    and ctx.faults.once("commit-fails", f"b{fail_commit_of}"):
                blocked.mkdir(parents=True)  # the commit log entry of that batch cannot be written
            died = query.exception()
            if died is not None:
                query.stop()
                if restarts >= 3:
                    msg = f"chaos aggregate: the query died {restarts + 1} times; last: {_first_line(died)}"
                    raise ChaosError(msg) from died
                restarts += 1
                ctx.notes.append(f"query died ({_first_line(died)}); restarted on its checkpoint (#{restarts})")
                if blocked.is_dir():
                    blocked.rmdir()
                query = start()
                continue
            st = handle.stats()
            if ingestor.done and st["pending"] == 0 and st["failed_waiting"] == 0:
                query.processAllAvailable()
                break
            time.sleep(0.25)
        query.stop()
    finally:
        ingestor.stop()
        handle.stop()
    report = finish(ctx, [ctx.layer()], [], [])
    expected = Counter(default_value(i)["user"] for i in source.emitted_ids)
    final = _final_counts(ctx.out_dir)
    report.records_in = sum(expected.values())
    report.delivered = sum(final.values())
    wrong = sorted(u for u in set(expected) | set(final) if final.get(u, 0) != expected[u])
    report.notes.append(f"{len(expected)} users; final counts sum {sum(final.values())} of "
                        f"{sum(expected.values())} produced")
    report.expect(f"every count is whole ({len(wrong)} users wrong: {wrong[:5]})", not wrong and bool(final))
    report.expect("a worker was killed", ctx.faults.marks("kill-worker") == 1)
    report.expect(f"a batch failed before its commit log entry and was re-run (restarts {restarts})",
                  ctx.faults.marks("commit-fails") == 1 and restarts >= 1)
    report.expect("nothing was dead-lettered", not report.dead_letters)
    return report
