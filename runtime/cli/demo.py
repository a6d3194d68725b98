"""The main job: click events through a real Spark streaming query with FT on, and real faults.

Pipeline: a generator of click events (it cannot rewind: only ftlayer can
replay its records) -> parse -> filter out bots -> key_by(user) -> per-user
enrichment -> JSON-lines file sink. It runs on local Spark and the embedded
Redis (or ``FTLAYER_REDIS_URL``), injects FailRecord on a fraction of records,
one poison record that always fails, and kills one Python worker with
``os._exit`` mid-partition. It shows progress while it runs (a rich bar on a
terminal, a ``[demo]`` line every 2 s otherwise; see ``runtime.driver.progress``) and
ends with a report: records in, delivered, duplicates, replays, dead letters, lost (must
be 0) and acker entries left (must be 0). Exit status 1 if either is not 0.

Console: each injected fault is announced in one line of its own when it happens; Spark's
own log (the killed worker's stack traces included) goes to ``spark.log`` in the demo's
work directory (:mod:`runtime.spark.spark_logs`); the report is the last thing printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.errors import FailRecord
from ftlayer.records.keyhash import key_hash
from runtime.cli.demo_events import click_events
from runtime.driver.progress import TaskProgress
from runtime.sinks import JsonLinesSink
from runtime.testing import once
from runtime.topology import FTQuery, Topology
from serialization.payload import unpack_payload


class Parse:
    """Parse a raw line; fails FailRecord on a fraction (first attempt only) and on the poison line."""

    def __init__(self, marks: Path, fail_every: int, poison: int, kill_at: int) -> None:
        self.marks, self.fail_every, self.poison, self.kill_at = marks, fail_every, poison, kill_at

    def __call__(self, line: str) -> dict[str, Any]:
        i, user, page, agent, ts = line.split("|")
        n = int(i)
        if n == self.poison:
            msg = f"poison record {n}: cannot parse"
            raise ValueError(msg)
        if n == self.kill_at and once(self.marks, "kill"):
            os._exit(9)  # a Python worker dies mid-partition
        if self.fail_every and n % self.fail_every == 0 and once(self.marks, f"f{n}"):
            msg = f"transient failure on record {n}"
            raise FailRecord(msg)
        return {"i": n, "user": user, "page": page, "bot": agent.startswith("bot"), "ts": datetime.fromisoformat(ts)}


def enrich(event: dict[str, Any]) -> dict[str, Any]:
    """Per-user enrichment: runs in the partition that owns the user's key."""
    return {**event, "segment": "heavy" if key_hash(event["user"]) % 3 == 0 else "light",
            "hour": event["ts"].hour}


def progress(query: FTQuery, bar: TaskProgress) -> None:
    """Show the FT figures of the demo's source; the bar is acked + dead-lettered of all records."""
    st = next(iter(query.stats().values()))
    bar.update(st["acked"] + st["dead_lettered"], figures={
        "persisted": st["persisted"], "acked": st["acked"], "pending": st["pending"],
        "failed": st["failed_explicit"] + st["failed_timeout"], "replayed": st["replayed"],
        "dead": st["dead_lettered"],
    })


class FaultAnnouncer:
    """One line per injected fault, when the driver first sees it (marks files, dead letters)."""

    def __init__(self, marks: Path, fail_every: int, poison: int, kill_at: int, spark_log: Path) -> None:
        self.marks, self.fail_every, self.poison, self.kill_at = marks, fail_every, poison, kill_at
        self.spark_log = spark_log
        self.said: set[str] = set()

    def lines(self, stats: dict[str, int]) -> list[str]:
        """The announcements that became due since the last call."""
        due: list[tuple[str, str]] = []
        if "kill" not in self.said and (self.marks / "kill").exists():
            due.append(("kill", f"fault: a Python worker was killed (os._exit) at record {self.kill_at}; Spark "
                                f"retries its task; the stack traces are in {self.spark_log}"))
        if "fail" not in self.said and self.fail_every and any(self.marks.glob("f*")):
            due.append(("fail", f"fault: every {self.fail_every}th record raises FailRecord once; ftlayer "
                                "replays each of them"))
        if "poison" not in self.said and stats["failed_explicit"] and stats["replayed"] and stats["dead_lettered"]:
            due.append(("poison", f"fault: poison record {self.poison} failed on every replay and was "
                                  "dead-lettered"))
        self.said.update(kind for kind, _ in due)
        return [line for _, line in due]


def run(records: int, fail_every: int, timeout_s: float, spark: Any = None) -> int:
    work = Path(tempfile.mkdtemp(prefix="ftlayer-demo-"))
    marks = work / "marks"
    marks.mkdir()
    # the demo's state (embedded server's AOF) lives in its own fresh work dir: its report
    # counts this run only, so it must not resume an earlier run's counters
    cfg = FTConfig.load(env=os.environ).replace(timeout_s=timeout_s, max_replays=3, state_dir=str(work / "state"))
    spark_log = work / "spark.log"
    if spark is None:
        from runtime.spark.session import local_session
        from runtime.spark.spark_logs import log_to_file

        spark = local_session("ftlayer-demo", conf=log_to_file(spark_log))
    topo = Topology("clicks", cfg)
    sink = JsonLinesSink(work / "out")
    parse = Parse(marks, fail_every, poison=records // 2 + 1, kill_at=records // 3)
    faults = FaultAnnouncer(marks, fail_every, parse.poison, parse.kill_at, spark_log)
    (
        topo.source("events", click_events(records))
        .map(parse)
        .filter(lambda e: not e["bot"])
        .key_by(lambda e: e["user"])
        .map(enrich)
        .sink(sink)
    )
    query = topo.start(spark, checkpoint_location=str(work / "checkpoint"), trigger_interval_s=0.5,
                       max_records_per_batch=5000)
    bar = TaskProgress("demo", total=records)  # a rich bar on a terminal, a line every 2 s otherwise
    bar.log(f"topology 'clicks' started; FT on; Redis namespace '{cfg.namespace}'; output {work}")
    bar.log(f"Spark's log goes to {spark_log}")
    try:
        deadline = time.monotonic() + 120 + 10 * timeout_s
        while not query.drained() and time.monotonic() < deadline:
            failure = query.query.exception()
            if failure is not None:
                raise failure
            progress(query, bar)
            for line in faults.lines(next(iter(query.stats().values()))):
                bar.log(line)
            time.sleep(0.5)
        progress(query, bar)
        for line in faults.lines(next(iter(query.stats().values()))):
            bar.log(line)
    finally:
        bar.close()
        query.stop()
    return report(query, sink, records, marks)


def report(query: FTQuery, sink: JsonLinesSink, records_in: int, marks: Path) -> int:
    layer = query.layers[0]
    st = layer.stats()
    lines = sink.read_all()
    delivered = Counter(line["value"]["i"] for line in lines)
    dead = layer.list_dead_letters(10_000)
    dead_i = {int(unpack_payload(d.record.payload).split("|")[0]) for d in dead if d.record}
    bots = {i for i in range(records_in) if i % 40 == 7}
    # a record is accounted for if it was delivered, filtered as a bot, or dead-lettered
    lost = len(set(range(records_in)) - set(delivered) - bots - dead_i)
    left = st["pending"] + st["failed_waiting"]
    users = Counter(line["value"]["user"] for line in lines)
    print("\n== ftlayer demo report ==")
    print(f"records in           {records_in}")
    print(f"records delivered    {len(delivered)}  ({len(bots)} bot clicks filtered, {len(users)} users)")
    print(f"duplicates           {sum(delivered.values()) - len(delivered)}")
    print(f"replays              {st['replayed']}")
    print(f"dead letters         {len(dead)}" + (f"  ({dead[0].reason.strip().splitlines()[-1]})" if dead else ""))
    print(f"worker killed        {'yes' if (marks / 'kill').exists() else 'no'}")
    print(f"lost                 {lost}   (must be 0)")
    print(f"acker entries left   {left}   (must be 0)")
    print(f"leftover state       {layer.leftovers() or 'none'}")
    return 0 if lost == 0 and left == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftlayer demo", description="Run the demo pipeline with faults.")
    parser.add_argument("pipeline", nargs="?", choices=("topology", "dataframe"), default="topology",
                        help="topology (default): the Topology API pipeline; dataframe: the same clicks as a "
                             "DataFrame pipeline (SQL parsing, a windowed count per user, a Parquet sink)")
    parser.add_argument("--records", type=int, default=20_000, help="click events to generate")
    parser.add_argument("--fail-every", type=int, default=50,
                        help="every Nth record raises FailRecord once (0: none)")
    parser.add_argument("--timeout-s", type=float, default=20.0,
                        help="FT timeout for the demo [env FTLAYER_TIMEOUT_S]")
    args = parser.parse_args(argv)
    if args.pipeline == "dataframe":
        from runtime.cli.demo_dataframe import run as run_dataframe

        return run_dataframe(args.records, args.fail_every, args.timeout_s)
    return run(args.records, args.fail_every, args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
