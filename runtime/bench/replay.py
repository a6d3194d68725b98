"""Replay precision: after a killed Python worker fails a micro-batch, how many records are processed again?

One round (real Redis, real local Spark in a driver subprocess, see :mod:`runtime.bench.replay_app`):

1. **Persist** ``records`` (B) records, keyed by user over ``partitions`` (P) channels, through
   the ingest path (:class:`~runtime.driver.ingest.Ingestor`) before any query runs, so the first
   micro-batch holds all B: P source partitions, a keyed shuffle, P sink tasks.
2. **Fail the batch** (phase 1, ``local[2]``: no task retries). The sink task of one partition
   writes about half of its records, waits until every other sink task has flushed its acks,
   and its Python worker dies. The job fails and the query terminates, as a batch that Spark's
   own recovery must re-run. Timing the kill after the other tasks finished is deliberate: it
   is the case where the batch was mostly done, which batch-level recovery re-runs in full.
3. **Lost in flight** = records still pending in Redis now (their trees did not complete).
   **Spark re-run** = record ids in the failed batch's offset range, read from the checkpoint's
   offset log and the channel streams: what Spark re-runs when it recovers the batch (B).
4. **Recover** (phase 2: the query restarted on the same checkpoint by the same driver process,
   with no fault). Spark re-plans the uncommitted batch from its offset log and re-runs it; the
   FT source skips records that completed. **Reprocessed** = records passing the first map
   again (one line per pass, see :class:`~runtime.bench.replay_app.CountPasses`).
5. **Check**: every record delivered, nothing pending, nothing leaked (:func:`runtime.checker.check`),
   no timeout replays (``timeout_s`` = 120 s; the ``replayed`` counter is reported).

Figures per round: ``replay_precision`` = reprocessed / lost_in_flight (1.0 = only what was lost
is processed again), ``spark_rerun_over_lost`` = spark_rerun / lost_in_flight, ``same_ids``
(the reprocessed ids are exactly the lost ones), ``sink_duplicates`` (records the dying task
wrote before it died: written, never acked, so delivered twice; at-least-once allows it).
Acks are flushed once per task, so the unit of loss is the killed task's partition.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.keyhash import key_hash, pmod
from runtime.bench.common import delete_namespace, round_dirs, summary
from runtime.bench.replay_app import GO, SOURCE, TOPOLOGY, read_passes, user_key
from runtime.chaos.procs import pending_ids
from runtime.checker import check
from runtime.driver.ingest import Ingestor
from runtime.spark.ft_offsets import START_ID, compare_ids
from runtime.spark.ft_source import channel_key
from runtime.testing import CollectingSink

Progress = Callable[[str], None]
USERS = 37
TIMEOUT_S = 120.0  # long enough that nothing times out: every replay counted is a re-run
PHASE_TIMEOUT_S = 600.0


class ReplayBenchError(FTLayerError):
    """The replay-precision benchmark could not run a round (a phase ended the wrong way)."""


def make_value(i: int) -> dict[str, Any]:
    """Record ``i`` of a round."""
    return {"i": i, "user": f"u{i % USERS}"}


class Driver:
    """The driver subprocess of one round (its own process group) and its JSON result lines."""

    def __init__(self, url: str, namespace: str, workdir: Path, *, partitions: int, kill_partition: int,
                 kill_after: int, batch_rows: int) -> None:
        cmd = [sys.executable, "-m", "runtime.bench.replay_app", "--redis-url", url, "--namespace", namespace,
               "--workdir", str(workdir), "--partitions", str(partitions), "--kill-partition",
               str(kill_partition), "--kill-after", str(kill_after), "--batch-rows", str(batch_rows),
               "--timeout-s", str(TIMEOUT_S), "--deadline-s", str(PHASE_TIMEOUT_S - 60)]
        self.log = workdir / "driver.log"
        with self.log.open("w") as err:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                         text=True, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, name="bench-replay-driver-out", daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # end of output

    def result(self, phase: int) -> dict[str, Any]:
        """The next JSON line the driver prints (phase ``phase``'s result); ReplayBenchError if none."""
        deadline = time.monotonic() + PHASE_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                self.kill()
                msg = (f"replay bench: the driver gave no phase {phase} result (exit {self.proc.returncode}; "
                       f"log: {self.log})")
                raise ReplayBenchError(msg)
            if line.startswith("{"):
                got: dict[str, Any] = json.loads(line)
                return got

    def go(self) -> None:
        """Let the driver start phase 2."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(GO + "\n")
        self.proc.stdin.flush()

    def wait(self) -> int:
        try:
            return self.proc.wait(PHASE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the driver and its Spark JVM
        self.proc.wait(30)


def channel_entries(layer: FTLayer) -> dict[int, list[tuple[str, int]]]:
    """Per channel, every stream entry as (stream id, record ids filed in it)."""
    client = layer.client
    out: dict[int, list[tuple[str, int]]] = {}
    for c in range(layer.num_channels):
        entries: list[tuple[str, int]] = []
        after = "-"
        while True:
            page = cast("list[tuple[bytes, dict[bytes, bytes]]]",
                        client.xrange(layer.keys.channel(c), after, "+", count=1000))
            for entry_id, fields in page:
                eid = entry_id.decode()
                entries.append((eid, int(fields.get(b"n", b"0"))))  # the records of its chunks
                after = "(" + eid
            if len(page) < 1000:
                break
        out[c] = entries
    return out


def _offsets(checkpoint: Path, batch: int) -> dict[str, str]:
    """The FT source's end offset of ``batch`` from Spark's offset log (``offsets/<batch>``)."""
    path = checkpoint / "offsets" / str(batch)
    try:
        lines = path.read_text().splitlines()
        # "v1", the batch metadata, then one line per source: ours is the only one
        offset: dict[str, str] = json.loads(lines[2])
    except (OSError, IndexError, ValueError) as exc:
        msg = f"replay bench: cannot read the FT source offset of batch {batch} from {path}"
        raise ReplayBenchError(msg) from exc
    return offset


def failed_batch_records(checkpoint: Path, entries: dict[int, list[tuple[str, int]]]) -> tuple[int, int]:
    """(batch id, record ids in its offset range): the last batch in the offset log without a commit.

    ``entries`` are the channel streams as they were before the query ran (the FT service trims
    entries whose records all completed, so they cannot be read afterwards). Every record id filed
    in ``(start, end]`` counts, completed ones included: that range is what Spark re-runs.
    """
    batches = sorted(int(p.name) for p in (checkpoint / "offsets").iterdir() if p.name.isdigit())
    commits = checkpoint / "commits"
    committed = {int(p.name) for p in commits.iterdir() if p.name.isdigit()} if commits.is_dir() else set()
    uncommitted = [b for b in batches if b not in committed]
    if not uncommitted:
        msg = f"replay bench: no uncommitted batch in {checkpoint} (the fault did not fail a batch)"
        raise ReplayBenchError(msg)
    batch = uncommitted[-1]
    end = _offsets(checkpoint, batch)
    start = _offsets(checkpoint, batch - 1) if batch > 0 else {k: START_ID for k in end}
    total = 0
    for c, listed in entries.items():
        k = channel_key(c)
        total += sum(n for eid, n in listed if compare_ids(eid, start[k]) > 0 and compare_ids(eid, end[k]) <= 0)
    return batch, total


def replay_round(url: str, records: int, workdir: Path, *, partitions: int = 2, kill_partition: int = 0,
                 batch_rows: int = 250) -> dict[str, Any]:
    """One round (see the module notes); returns its figures. Raises ReplayBenchError if the
    driver did not do its part (phase 1 must fail, phase 2 must drain)."""
    namespace = "benchreplay" + uuid.uuid4().hex[:8]
    cfg = FTConfig(redis_url=url, namespace=namespace, timeout_s=TIMEOUT_S, num_channels=partitions)
    layer = FTLayer(cfg, TOPOLOGY, SOURCE, num_channels=partitions).open()
    try:
        ingest = Ingestor(layer, (make_value(i) for i in range(records)), key=user_key)
        ingest.run()  # synchronously: all B persisted before the query exists
        if ingest.error is not None or layer.pending_count() != records:
            msg = f"replay bench: ingest persisted {layer.pending_count()} of {records} records ({ingest.error})"
            raise ReplayBenchError(msg)
        entries = channel_entries(layer)
        per_partition = Counter(pmod(key_hash(user_key(make_value(i))), partitions) for i in range(records))
        kill_after = max(1, per_partition[kill_partition] // 2)
        driver = Driver(url, namespace, workdir, partitions=partitions, kill_partition=kill_partition,
                        kill_after=kill_after, batch_rows=batch_rows)
        try:
            first = driver.result(1)
            if first.get("outcome") != "failed":
                msg = f"replay bench: phase 1 ended {first.get('outcome')!r}, not failed (log: {driver.log})"
                raise ReplayBenchError(msg)
            lost_ids = pending_ids(layer)  # the driver waits: nothing moves while we look
            if not lost_ids:
                msg = f"replay bench: the batch failed but nothing is pending (log: {driver.log})"
                raise ReplayBenchError(msg)
            acked_at_failure = layer.stats()["acked"]
            batch, spark_rerun = failed_batch_records(workdir / "checkpoint", entries)
            driver.go()
            second = driver.result(2)
            code = driver.wait()
        finally:
            driver.kill()
        if second.get("outcome") != "drained" or code != 0:
            msg = f"replay bench: phase 2 ended {second.get('outcome')!r} (exit {code}; log: {driver.log})"
            raise ReplayBenchError(msg)
        marks = workdir / "marks"
        before_kill = marks / "written-before-kill"
        again = read_passes(workdir / "passes", 2)
        report = check([layer], CollectingSink(workdir / "out"), range(records), {"kill-worker": lost_ids})
        final = layer.stats()
        lost = len(lost_ids)
        return {
            "records": records,
            "partitions": partitions,
            "records_per_partition": [per_partition[c] for c in range(partitions)],
            "killed_partition": kill_partition,
            "written_before_kill": int(before_kill.read_text()) if before_kill.exists() else 0,
            "other_tasks_flushed_first": (marks / "others-flushed").exists(),
            "phase1_error": first.get("error", ""),
            "failed_batch": batch,
            "lost_in_flight": lost,
            "acked_before_recovery": acked_at_failure,
            "spark_rerun": spark_rerun,
            "reprocessed": len(again),
            "reprocessed_distinct": len(set(again)),
            "same_ids": set(again) == set(lost_ids),
            "replay_precision": len(again) / lost,
            "spark_rerun_over_lost": spark_rerun / lost,
            "timeout_replays": final["replayed"],
            "failed_timeout": final["failed_timeout"],
            "sink_lines": report.lines,
            "sink_duplicates": report.extra_copies,
            "delivered": report.delivered,
            "lost": len(report.lost),
            "pending_after": final["pending"] + final["failed_waiting"],
            "leaked": report.leaked,
            "ok": report.ok,
        }
    finally:
        delete_namespace(url, namespace)


def bench_replay(url: str, *, records: int = 20_000, repeats: int = 3, workdir: Path | None = None,
                 progress: Progress | None = None, partitions: int = 2) -> dict[str, Any]:
    """Run ``repeats`` rounds (see the module notes); returns per-round figures and median/min/max.

    ``replay_precision`` (top level) is the median of reprocessed / lost_in_flight over the
    rounds (1.0 = only the records the fault lost were processed again);
    ``spark_rerun_over_lost`` is the median of what Spark's batch recovery re-runs (the whole
    batch) over the same lost count. ``workdir`` holds each round's checkpoint, sink output,
    pass files and driver logs (a temporary directory, removed afterwards, if None).
    """
    say = progress or (lambda _msg: None)
    rounds: list[dict[str, Any]] = []
    with round_dirs(workdir, "ftlayer-bench-replay-", repeats) as dirs:
        for r, rdir in enumerate(dirs):
            say(f"replay round {r + 1}/{repeats}: {records:,} records over {partitions} partitions")
            got = replay_round(url, records, rdir, partitions=partitions)
            rounds.append(got)
            say(f"  lost in flight {got['lost_in_flight']:,}, reprocessed {got['reprocessed']:,} "
                f"(precision {got['replay_precision']:.3f}), Spark re-runs {got['spark_rerun']:,} "
                f"({got['spark_rerun_over_lost']:.2f}x), sink duplicates {got['sink_duplicates']:,}, "
                f"ok={got['ok']}")
    keys = ("replay_precision", "spark_rerun_over_lost", "lost_in_flight", "reprocessed", "spark_rerun",
            "sink_duplicates", "timeout_replays")
    out: dict[str, Any] = {
        "replay_precision": summary([r["replay_precision"] for r in rounds])["median"],
        "records": records,
        "partitions": partitions,
        "repeats": repeats,
        "all_ok": all(r["ok"] for r in rounds),
        "all_same_ids": all(r["same_ids"] for r in rounds),
        **{f"{k}_summary": summary([float(r[k]) for r in rounds]) for k in keys},
        "rounds": rounds,
        "method": "B records persisted first, one micro-batch over P partitions and a keyed shuffle; a "
        "sink task's Python worker dies (local[2], no task retry) after the other sink tasks flushed; "
        "lost_in_flight = records pending after the failure; reprocessed = records through the first "
        "map when the restarted query re-runs the batch from the checkpoint; spark_rerun = record ids in the "
        "failed batch's offset range",
    }
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m runtime.bench.replay``: print the figures as JSON (results.json is the lead's)."""
    from ftlayer.servers.embedded import EmbeddedServer

    p = argparse.ArgumentParser(prog="python -m runtime.bench.replay", description=__doc__.split("\n")[0])
    p.add_argument("--records", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--workdir", help="keep checkpoints, outputs and driver logs here")
    args = p.parse_args(argv)
    url = os.environ.get("FTLAYER_REDIS_URL", "")
    server = None if url else EmbeddedServer().start()
    try:
        res = bench_replay(url or (server.url if server else ""), records=args.records, repeats=args.repeats,
                           workdir=Path(args.workdir) if args.workdir else None, partitions=args.partitions,
                           progress=lambda m: print(f"[bench] {m}", file=sys.stderr, flush=True))
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(res, indent=2))
    return 0 if res["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
