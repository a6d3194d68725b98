"""The driver program of the replay-precision benchmark: ``python -m runtime.bench.replay_app``.

:mod:`runtime.bench.replay` persists the records itself, then starts this program, which runs
two queries of the same topology on the same namespace and checkpoint, one after the other,
in one SparkSession (``local[2]``: one attempt per task, so a dead Python worker fails the
whole micro-batch, the case Spark's batch-level recovery handles):

- **phase 1**: ``source -> map(CountPasses) -> key_by(user) -> sink`` with a
  :class:`KillingSink`. The sink task of partition ``--kill-partition`` writes (at least)
  ``--kill-after`` records, waits until every other sink task of the batch has flushed its
  acks, then its Python worker dies (``os._exit``). The batch fails and the query terminates.
  The program prints ``{"phase": 1, "outcome": "failed", ...}`` and waits for a line ``go``
  on stdin (the harness measures what is pending meanwhile).
- **phase 2**: the same topology (same operator and stage ids, so the same flush tokens) with
  a plain :class:`~runtime.testing.CollectingSink`, started on the same checkpoint: Spark
  re-runs the failed batch from its offset log, the FT source skips the records that
  completed. Runs until drained, prints ``{"phase": 2, "outcome": "drained", "stats": ...}``.

Exit 0 when phase 1 failed and phase 2 drained, else 1. Both phases use an empty source:
every record was persisted before phase 1 started, so the first micro-batch holds all of
them. :class:`CountPasses` appends the ``"i"`` of every record it sees to
``<workdir>/passes/phase<k>-<pid>.txt`` (one unbuffered append per record, so a dying worker
loses none): the records a phase processed.

Restarting the query in the same driver, rather than in a new driver process, saves one
Spark start-up per round; Spark's recovery path is the same (the uncommitted batch is
re-planned from the checkpoint's offset log).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from runtime.sinks import SinkContext
from runtime.spark.session import local_session
from runtime.testing import CollectingSink, once
from runtime.topology import Topology

TOPOLOGY = "replaybench"
SOURCE = "events"
TRIGGER_S = 0.2
OTHERS_WAIT_S = 120.0  # how long the dying task waits for the other sink tasks to flush
KILL_EXIT_CODE = 3
GO = "go"  # the harness's word on stdin: phase 1 was measured, start phase 2

_FDS: dict[str, int] = {}  # pass files opened in this (worker) process, by path


def user_key(value: Any) -> Any:
    """The routing and key_by key of the benchmark's records."""
    return value["user"]


class CountPasses:
    """A map that returns its input unchanged and appends its ``"i"`` to this process's pass file."""

    def __init__(self, directory: str, phase: int) -> None:
        self.directory = directory
        self.phase = phase

    def __call__(self, value: Any) -> Any:
        path = os.path.join(self.directory, f"phase{self.phase}-{os.getpid()}.txt")
        fd = _FDS.get(path)
        if fd is None:
            os.makedirs(self.directory, exist_ok=True)
            fd = _FDS[path] = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
        os.write(fd, f"{int(value['i'])}\n".encode())
        return value


def read_passes(directory: str | Path, phase: int) -> list[int]:
    """Every ``"i"`` that :class:`CountPasses` saw in ``phase`` (one entry per pass)."""
    out: list[int] = []
    for path in sorted(Path(directory).glob(f"phase{phase}-*.txt")):
        out.extend(int(x) for x in path.read_text().split())
    return out


class KillingSink(CollectingSink):
    """A collecting sink whose task of Spark partition ``partition`` dies once (see the module notes).

    Markers in ``marks``: ``flushed-p<c>`` once the task of partition ``c`` flushed its acks
    (``after_flush``), ``kill`` when the worker dies, ``others-flushed`` if every other
    partition had flushed by then. ``written-before-kill`` holds how many records the dying
    task wrote first.
    """

    def __init__(self, directory: str | Path, marks: str | Path, *, partition: int, after: int,
                 partitions: int) -> None:
        super().__init__(directory)
        self.marks = str(marks)
        self.partition = partition
        self.after = after
        self.partitions = partitions
        self._task: int | None = None
        self._written = 0

    def write(self, values: list[Any], ctx: SinkContext) -> None:
        from pyspark import TaskContext

        tc = TaskContext.get()
        task = tc.taskAttemptId() if tc is not None else None
        if task != self._task:  # a worker may run several tasks with one sink object
            self._task, self._written = task, 0
        super().write(values, ctx)
        self._written += len(values)
        if ctx.partition == self.partition and self._written >= self.after and once(self.marks, "kill"):
            others = [c for c in range(self.partitions) if c != self.partition]
            deadline = time.monotonic() + OTHERS_WAIT_S
            while time.monotonic() < deadline and not all(
                Path(self.marks, f"flushed-p{c}").exists() for c in others
            ):
                time.sleep(0.05)
            if all(Path(self.marks, f"flushed-p{c}").exists() for c in others):
                once(self.marks, "others-flushed")
            Path(self.marks, "written-before-kill").write_text(str(self._written))
            os._exit(KILL_EXIT_CODE)  # the worker vanishes before its task flushed any ack

    def after_flush(self, ctx: SinkContext) -> None:
        once(self.marks, f"flushed-p{ctx.partition}")


def build(cfg: FTConfig, workdir: Path, phase: int, *, kill_partition: int, kill_after: int) -> Topology:
    """The benchmark topology of ``phase`` (identical ids in both phases; only the sink differs)."""
    out = workdir / "out"
    sink: CollectingSink = CollectingSink(out)
    if phase == 1:
        sink = KillingSink(out, workdir / "marks", partition=kill_partition, after=kill_after,
                           partitions=cfg.num_channels)
    topo = Topology(TOPOLOGY, cfg)
    (topo.source(SOURCE, [], key=user_key)
     .map(CountPasses(str(workdir / "passes"), phase))
     .key_by(user_key)
     .sink(sink))
    return topo


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def run_phase(spark: Any, args: argparse.Namespace, phase: int) -> dict[str, Any]:
    """Run one phase on ``spark``; returns what it saw (``outcome``: failed, drained or timeout)."""
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, timeout_s=args.timeout_s,
                   num_channels=args.partitions)
    workdir = Path(args.workdir)
    topo = build(cfg, workdir, phase, kill_partition=args.kill_partition, kill_after=args.kill_after)
    query = topo.start(spark, checkpoint_location=str(workdir / "checkpoint"), trigger_interval_s=TRIGGER_S)
    result: dict[str, Any] = {"phase": phase, "outcome": "timeout"}
    deadline = time.monotonic() + args.deadline_s
    try:
        while time.monotonic() < deadline:
            died = query.query.exception()
            if died is not None:
                result.update(outcome="failed", error=_first_line(died))
                break
            if query.drained():
                query.query.processAllAvailable()  # the next trigger commits the batch and trims
                result["outcome"] = "drained"
                break
            time.sleep(0.1)
    finally:
        query.stop()
    result["stats"] = query.stats()
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Phase 1, then (after ``go`` on stdin) phase 2; exit 0 when both ended as expected."""
    p = argparse.ArgumentParser(prog="python -m runtime.bench.replay_app")
    p.add_argument("--redis-url", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--kill-partition", type=int, default=0)
    p.add_argument("--kill-after", type=int, default=1)
    p.add_argument("--batch-rows", type=int, default=250)
    p.add_argument("--timeout-s", type=float, default=120.0, help="the records' timeout")
    p.add_argument("--deadline-s", type=float, default=300.0, help="how long each phase may run")
    args = p.parse_args(argv)
    spark = local_session("ftlayer-bench-replay", master="local[2]")  # no task retries
    # sink-stage input arrives in Arrow batches of this many rows, so the dying task has
    # written some batches (and holds the rest) when it dies
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", str(args.batch_rows))
    first = run_phase(spark, args, 1)
    print(json.dumps(first), flush=True)
    if first["outcome"] != "failed" or sys.stdin.readline().strip() != GO:
        return 1
    second = run_phase(spark, args, 2)
    print(json.dumps(second), flush=True)
    return 0 if second["outcome"] == "drained" else 1


if __name__ == "__main__":
    sys.exit(main())
