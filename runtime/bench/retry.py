"""Task retries, measured fairly: a sink task's Python worker dies; what does each engine redo?

Both variants run in one driver subprocess (:mod:`runtime.bench.retry_app`) on ``local[2,4]``,
so Spark retries the dead task instead of aborting the job (the replay-precision benchmark,
:mod:`runtime.bench.replay`, covers the other case: ``local[2]``, the batch fails and a
restarted query recovers it). Each round:

- ``ftlayer``: ``records`` records persisted first, one micro-batch, ``source -> map ->
  key_by(user) -> sink`` with default settings; the first attempt of the sink task of
  partition 0 dies once it wrote half as many records as an average partition holds.
- ``spark``: the same shape in plain Structured Streaming (``rate-micro-batch``,
  ``repartition`` by user, a ``foreach`` writer) with the same kill.

Per variant and round, from the lines every attempt wrote: ``partition_records`` (records
of the killed task), ``written_before_kill`` (by the dead attempt), ``rewritten_by_retry``
(records the retry wrote: what the engine re-ran through the sink), ``sink_duplicates``
(lines beyond one per record) and ``lost``. Spark's retry re-runs the whole task, so it
rewrites ``partition_records`` and duplicates all ``written_before_kill``; ftlayer's retry
skips what the dead attempt had already acked (``sink_ack_every_records``), so it rewrites
only the rest and duplicates at most what was written after the last ack.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from runtime.bench.common import delete_namespace, round_dirs, summary
from runtime.bench.retry_app import SOURCE, TOPOLOGY, user_of
from runtime.driver.ingest import Ingestor

Progress = Callable[[str], None]
DEADLINE_S = 600.0


class RetryBenchError(FTLayerError):
    """The task-retry benchmark could not complete a round."""


def count_lines(directory: Path, records: int) -> dict[str, Any]:
    """What the attempts wrote: per (partition, attempt) file names ``p<p>-a<a>-<pid>.txt``."""
    per_task: Counter[tuple[int, int]] = Counter()
    seen: Counter[int] = Counter()
    killed: set[int] = set()
    for path in directory.glob("p*-a*-*.txt"):
        part, attempt = (int(x[1:]) for x in path.name.split("-")[:2])
        values = [int(v) for v in path.read_text().split()]
        per_task[(part, attempt)] += len(values)
        seen.update(values)
        if part == 0:
            killed.update(values)
    lines = sum(seen.values())
    return {
        "partition_records": len(killed),
        "written_before_kill": per_task[(0, 0)],
        "rewritten_by_retry": sum(n for (p, a), n in per_task.items() if p == 0 and a > 0),
        "sink_duplicates": lines - len(seen),
        "lost": records - len(set(seen) & set(range(records))),
    }


def retry_round(url: str, records: int, workdir: Path, *, batch_rows: int = 250) -> dict[str, Any]:
    """One round of both variants (see the module notes)."""
    namespace = "benchretry" + uuid.uuid4().hex[:8]
    cfg = FTConfig(redis_url=url, namespace=namespace, num_channels=2, max_pending=10**9)
    layer = FTLayer(cfg, TOPOLOGY, SOURCE, num_channels=2).open()
    try:
        Ingestor(layer, ({"i": i, "user": user_of(i)} for i in range(records)), key=lambda e: e["user"]).run()
        if layer.pending_count() != records:
            msg = f"retry bench: {layer.pending_count()} of {records} records persisted"
            raise RetryBenchError(msg)
        cmd = [sys.executable, "-m", "runtime.bench.retry_app", "--redis-url", url, "--namespace", namespace,
               "--workdir", str(workdir), "--variant", "ftlayer", "--variant", "spark", "--records", str(records),
               "--kill-after", str(max(1, records // 4)), "--batch-rows", str(batch_rows)]
        log = workdir / "driver.log"
        with log.open("w") as err:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=DEADLINE_S,
                                  check=False)
        runs = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or len(runs) != 2:
            msg = f"retry bench: the driver exited {proc.returncode} with {len(runs)} of 2 runs (log: {log})"
            raise RetryBenchError(msg)
        out: dict[str, Any] = {}
        for run in runs:
            got = count_lines(workdir / run["variant"] / "lines", records)
            got.update(killed=run["killed"], seconds=run["seconds"])
            if run["variant"] == "ftlayer":
                stats = run["stats"][SOURCE]
                got.update(acked=stats["acked"], pending_after=stats["pending"], timeout_replays=stats["replayed"])
            out[run["variant"]] = got
        return out
    finally:
        delete_namespace(url, namespace)


def bench_retry(url: str, *, records: int = 20_000, repeats: int = 3, progress: Progress | None = None,
                workdir: Path | None = None) -> dict[str, Any]:
    """``repeats`` rounds; per variant the median/min/max of each count, and
    ``retry_duplicates_vs_spark`` = ftlayer's sink duplicates / Spark's (median over rounds)."""
    say = progress or (lambda _msg: None)
    rounds: list[dict[str, Any]] = []
    with round_dirs(workdir, "ftlayer-bench-retry-", repeats) as dirs:
        for r, rdir in enumerate(dirs):
            say(f"retry round {r + 1}/{repeats}: {records:,} records, local[2,4], a sink worker killed mid-task")
            got = retry_round(url, records, rdir)
            rounds.append(got)
            for v in ("ftlayer", "spark"):
                g = got[v]
                say(f"  {v:8} task of {g['partition_records']:,}: wrote {g['written_before_kill']:,} before the kill, "
                    f"retry rewrote {g['rewritten_by_retry']:,}, sink duplicates {g['sink_duplicates']:,}, "
                    f"lost {g['lost']}")
    keys = ("partition_records", "written_before_kill", "rewritten_by_retry", "sink_duplicates", "lost")
    out: dict[str, Any] = {
        "records": records,
        "repeats": repeats,
        "master": "local[2,4]",
        **{v: {k: summary([float(r[v][k]) for r in rounds]) for k in keys} for v in ("ftlayer", "spark")},
        "retry_duplicates_vs_spark": summary(
            [r["ftlayer"]["sink_duplicates"] / max(1, r["spark"]["sink_duplicates"]) for r in rounds]),
        "all_killed": all(r[v]["killed"] for r in rounds for v in ("ftlayer", "spark")),
        "lost_total": sum(r[v]["lost"] for r in rounds for v in ("ftlayer", "spark")),
        "rounds": rounds,
    }
    return out
