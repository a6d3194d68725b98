"""The chaos matrix: every scenario of issue 27's list, on both pipelines, through one or more sinks.

``scripts/chaos-matrix --sink postgres --sink delta`` (or ``python -m runtime.chaos.matrix``) runs
``ftlayer chaos`` once per (sink, pipeline, scenario), one after another (each starts its own
Spark), and prints one line each: the verdict, what was lost, and the duplicates the target
shows (ids written twice; with an effectively-once sink the checker reads the target back, so
that is what a user of the table would see), and the run's seconds (Spark's start included, a
wait for ``--lock`` not). The report of each run is kept in ``--out``.

Scenarios, on both pipelines: kill-driver, kill-worker, kill-executor (two executor JVMs,
``local-cluster``), batch-fails, fail-rate, kill-redis, delayed-acks, poison and mixed. Exit
status 0 only if every run passed with 0 lost and, for an effectively-once sink, 0 duplicates.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

TOPOLOGY = ("kill-driver", "kill-worker", "kill-executor", "batch-fails", "fail-rate", "kill-redis",
            "delayed-acks", "poison", "mixed")
DATAFRAME = TOPOLOGY
EFFECTIVELY_ONCE = ("postgres", "delta", "redis")
LOCAL_CLUSTER = "local-cluster[2,1,1024]"
LOCK_TAKEN = "chaos-matrix: lock taken"


@dataclass(frozen=True)
class Cell:
    """One run's outcome, read from its report."""

    sink: str
    pipeline: str
    scenario: str
    ok: bool
    lost: int | None
    duplicates: int | None
    seconds: float

    @property
    def passed(self) -> bool:
        clean = self.lost == 0 and (self.sink not in EFFECTIVELY_ONCE or self.duplicates == 0)
        return self.ok and clean

    def line(self) -> str:
        def show(v: int | None) -> str:
            return "?" if v is None else str(v)
        return (f"{self.sink:9s} {self.pipeline:10s} {self.scenario:14s} {'ok' if self.passed else 'FAILED':7s}"
                f" lost {show(self.lost):>4s}  duplicates {show(self.duplicates):>4s}  {self.seconds:6.0f} s")


def parse_report(text: str) -> tuple[bool, int | None, int | None]:
    """(verdict ok, lost, duplicate ids) from ``ftlayer chaos`` output (every report, for
    ``--durability all``: the worst)."""
    verdicts = re.findall(r"chaos scenario \S+: (OK|FAILED)", text)
    lost = [int(n) for n in re.findall(r"^\s*lost\s+(\d+)", text, re.M)]
    dups = [int(n) for n in re.findall(r"^\s*duplicates\s+(\d+) ids", text, re.M)]
    ok = bool(verdicts) and all(v == "OK" for v in verdicts)
    return ok, (max(lost) if lost else None), (max(dups) if dups else None)


def lock_taken(text: str, default: float) -> float:
    """When the run got the ``--lock`` (epoch seconds, from its first output line), else ``default``."""
    m = re.search(rf"^{LOCK_TAKEN} (\d+\.\d+)", text, re.M)
    return float(m.group(1)) if m else default


def run_cell(sink: str, pipeline: str, scenario: str, out: Path, *, sink_url: str | None = None,
             lock: Path | None = None) -> Cell:
    # under --lock the run says when it got the lock, so its seconds leave out the wait
    locked = ["flock", str(lock), "sh", "-c", f'echo "{LOCK_TAKEN} $(date +%s.%N)"; exec "$@"', "sh"] if lock else []
    cmd = [*locked, sys.executable, "-m", "runtime.cli.main", "chaos", scenario, "--pipeline", pipeline, "--sink", sink]
    if sink_url:
        cmd += ["--sink-url", sink_url]
    if scenario == "kill-executor":
        cmd += ["--master", LOCAL_CLUSTER]
    if scenario == "kill-redis":
        cmd += ["--durability", "waitaof"]  # the loss-free mode on one server; `all` is its own test
    started = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    text = done.stdout + done.stderr
    seconds = time.time() - lock_taken(text, started)
    (out / f"{sink}-{pipeline}-{scenario}.txt").write_text(f"$ {' '.join(cmd)}\nexit {done.returncode}\n\n{text}")
    ok, lost, dups = parse_report(text)
    return Cell(sink, pipeline, scenario, ok and done.returncode == 0, lost, dups, seconds)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/chaos-matrix", description=__doc__.split("\n\n")[0])
    p.add_argument("--sink", action="append", choices=("lines", *EFFECTIVELY_ONCE),
                   help="a sink to run the matrix through (repeat; default postgres and delta)")
    p.add_argument("--pipeline", choices=("topology", "dataframe", "both"), default="both")
    p.add_argument("--scenario", action="append", help="only these scenarios (repeat)")
    p.add_argument("--sink-url", default=None, help="the sink's URL (default: each run starts its own target)")
    p.add_argument("--out", type=Path, default=Path("chaos-matrix"), help="directory for each run's report")
    p.add_argument("--lock", type=Path, default=None,
                   help="run each scenario under flock on this file (to share the machine with other Spark jobs)")
    args = p.parse_args(argv)
    sinks = args.sink or ["postgres", "delta"]
    pipelines = ("topology", "dataframe") if args.pipeline == "both" else (args.pipeline,)
    args.out.mkdir(parents=True, exist_ok=True)
    cells: list[Cell] = []
    for sink in sinks:
        for pipeline in pipelines:
            for scenario in TOPOLOGY if pipeline == "topology" else DATAFRAME:
                if args.scenario and scenario not in args.scenario:
                    continue
                cell = run_cell(sink, pipeline, scenario, args.out, sink_url=args.sink_url, lock=args.lock)
                cells.append(cell)
                print(cell.line(), flush=True)
    failed = [c for c in cells if not c.passed]
    print(f"{len(cells) - len(failed)} of {len(cells)} runs passed; reports in {args.out}", flush=True)
    return 1 if failed or not cells else 0


if __name__ == "__main__":
    raise SystemExit(main())
