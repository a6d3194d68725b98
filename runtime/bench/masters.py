"""End-to-end throughput on two Spark masters: ``local[2]`` and ``local-cluster[2,1,1024]``.

The same FT-on topology as ``runtime.bench.e2e`` (source -> map -> key_by -> map -> sink),
with the same records, on one Redis server. One JVM holds one SparkContext, so each
measurement runs in its own process (``python -m runtime.bench.masters --child``): it builds
a session with the master, runs a warm-up query (not counted: JVM, executors and Python
workers starting), then one measured query, and prints its records/s. The parent alternates
the two masters ``repeats`` times and reports the medians with their spread, and
``local_cluster_vs_local_ratio`` = median(local-cluster) / median(local[2]).

On the 2-core machine both masters get two task slots; local-cluster adds two executor JVMs,
so the ratio shows what running Spark's executors in their own JVMs (as on a real cluster)
costs here, not a speed-up: there are no more cores to gain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from typing import Any

MASTERS = ("local[2]", "local-cluster[2,1,1024]")


def _child(url: str, master: str, records: int) -> float:
    from ftlayer.config import FTConfig
    from runtime.bench.e2e import run_ftlayer
    from runtime.spark.session import local_session, stop_session

    spark = local_session("ftlayer-bench-masters", master=master)
    try:
        cfg = FTConfig(redis_url=url, max_pending=50_000, timeout_s=120.0)
        run_ftlayer(spark, cfg, min(records, 50_000), 0, ft_on=True)  # warm-up, not counted
        return run_ftlayer(spark, cfg, records, 0, ft_on=True).rate
    finally:
        stop_session(spark)


def _measure(url: str, master: str, records: int) -> float:
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.bench.masters", "--child", "--redis-url", url, "--master", master,
         "--records", str(records)],
        capture_output=True, text=True, timeout=1800, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        msg = f"bench on {master} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
        raise RuntimeError(msg)
    return float(json.loads(lines[-1])["records_per_s"])


def bench_masters(url: str, records: int = 200_000, repeats: int = 2,
                  progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """FT-on e2e records/s on each master, alternating; see the module notes."""
    say = progress or (lambda _m: None)
    got: dict[str, list[float]] = {m: [] for m in MASTERS}
    for r in range(repeats):
        for master in MASTERS if r % 2 == 0 else tuple(reversed(MASTERS)):
            rate = _measure(url, master, records)
            got[master].append(rate)
            say(f"  round {r + 1}: {master} {rate:,.0f} records/s (FT on)")
    ratios = [c / lo for c, lo in zip(got[MASTERS[1]], got[MASTERS[0]], strict=True)]
    return {
        "records": records,
        "records_per_s": {m: _spread(v) for m, v in got.items()},
        "local_cluster_vs_local_ratio": _spread(ratios),
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--master", default=MASTERS[0])
    p.add_argument("--records", type=int, default=200_000)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps({"records_per_s": _child(args.redis_url, args.master, args.records)}), flush=True)
        return 0
    print(json.dumps(bench_masters(args.redis_url, args.records), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
