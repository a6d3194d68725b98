"""Chaos: kill -9 one of two ``ftlayer ingest`` processes feeding a running query, then restart it.

Producing apart from consuming (issue 18's parallel ingest): a DataFrame query
(``ftlayer.read_stream`` -> ``foreachBatch(ftlayer.acking(...))``) runs on the chaos source; two
``ftlayer ingest`` processes read one JSON-lines file as ``--worker 0/2`` and ``--worker 1/2``
(every line goes to exactly one worker by its line number) in batches of 200 records, each
saving its file offset after each persisted batch. Once a sixth of the records are persisted and
the victim (worker 1) has saved an offset, it is SIGKILLed; a new ``ftlayer ingest --worker 1/2``
with the same offsets directory resumes from the saved offset.

What it asserts (the checker counts the lines the scenario wrote, not what ingest reported):
every line reaches the sink (0 lost), the victim stopped mid-file, the restarted worker and the
other worker exit 0, and the only duplicates are the victim's lines persisted after its last
saved offset (at most one batch).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from runtime.chaos.base import SOURCE, TOPOLOGY, ScenarioContext
from runtime.chaos.errors import ChaosError
from runtime.checker import Report, check
from runtime.driver.file_source import offset_file

BATCH = 200  # records per persist in each ingest process: the kill lands between batches


def kill_ingest(ctx: ScenarioContext, records: int) -> Report:
    """SIGKILL one of two ingest workers mid-file and restart it; see the module notes."""
    import ftlayer
    from runtime.dataframe import sources

    cfg = ctx.config.replace(timeout_s=60.0)
    data = ctx.workdir / "events.jsonl"
    with data.open("w") as fh:
        for i in range(records):
            fh.write(json.dumps({"i": i, "user": f"u{i % 7}"}) + "\n")
    offsets = ctx.workdir / "offsets"
    handle = sources.source(TOPOLOGY, SOURCE, config=cfg, num_channels=2)
    df = ftlayer.read_stream(ctx.spark, TOPOLOGY, SOURCE, schema="i long, user string", config=cfg, num_channels=2)
    lines: list[dict[str, Any]] = []

    def write(batch: Any, _batch_id: int) -> None:
        lines.extend({"value": {"i": r["i"]}, "replay": r["replay"] > 0}
                     for r in batch.select("i", "_ftlayer.replay").collect())

    query = (df.writeStream.foreachBatch(ftlayer.acking(write, config=cfg))
             .option("checkpointLocation", str(ctx.checkpoint)).trigger(processingTime="500 milliseconds").start())

    def worker(w: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "runtime.cli.main", "ingest", TOPOLOGY, SOURCE, str(data), "--key", "user",
             "--worker", f"{w}/2", "--num-channels", "2", "--redis-url", cfg.redis_url, "--namespace",
             cfg.namespace, "--offsets-dir", str(offsets)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "FTLAYER_INGEST_BATCH_RECORDS": str(BATCH)},
        )

    report_notes: list[str] = []
    expectations: list[tuple[str, bool]] = []
    try:
        victim, other = worker(1), worker(0)
        saved_at = offset_file(offsets, str(data), (1, 2))
        deadline = time.monotonic() + 120
        while (handle.stats()["persisted"] < records // 6 or not saved_at.exists()) and time.monotonic() < deadline:
            if victim.poll() is not None:
                msg = "chaos kill-ingest: the victim ended before it could be killed (raise --records)"
                raise ChaosError(msg)
            time.sleep(0.01)
        victim.send_signal(signal.SIGKILL)
        victim.wait(30)
        saved = int(saved_at.read_text())
        size = data.stat().st_size
        expectations.append((f"the victim was SIGKILLed mid-file (offset {saved} of {size} bytes)", 0 < saved < size))
        ctx.say(f"ingest worker 1/2 SIGKILLed at offset {saved} of {size}; restarting it")
        again = worker(1)
        for name, proc in (("worker 0/2", other), ("restarted worker 1/2", again)):
            out, _ = proc.communicate(timeout=600)
            expectations.append((f"{name} exited 0", proc.returncode == 0))
            if proc.returncode != 0:
                report_notes.append(f"{name}: {out.strip()[-500:]}")
        _drain(query, handle, records)
    finally:
        query.stop()
        handle.stop()
    report = check([ctx.layer(cfg.replace(num_channels=2))], lines, range(records), strict=False,
                   scenario=ctx.name)
    copies = Counter(line["value"]["i"] for line in lines)
    extra = [i for i, n in copies.items() if n > 1]
    report.expect(f"only the victim's lines were persisted twice, at most one batch ({len(extra)} ids)",
                  all(i % 2 == 1 for i in extra) and len(extra) <= BATCH)
    for what, held in expectations:
        report.expect(what, held)
    report.notes.extend(ctx.notes + report_notes)
    report.elapsed_s = time.monotonic() - ctx.started
    return report


def _drain(query: Any, handle: Any, records: int, timeout_s: float = 300.0) -> None:
    """Wait until every persisted record is acked (the query up all along)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if query.exception() is not None:
            msg = f"chaos kill-ingest: the query died: {query.exception()}"
            raise ChaosError(msg)
        st = handle.stats()
        if st["persisted"] >= records and handle.layer.pending_count() == 0 and st["acked"] >= st["persisted"]:
            return
        time.sleep(0.5)
    msg = f"chaos kill-ingest: not drained within {timeout_s:.0f} s: {handle.stats()}"
    raise ChaosError(msg)

