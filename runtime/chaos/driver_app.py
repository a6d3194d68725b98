"""The driver program that the kill-driver scenario SIGKILLs: ``python -m runtime.chaos.driver_app``.

With ``--pipeline dataframe`` it runs the chaos DataFrame pipeline instead
(:func:`runtime.chaos.df_pipeline.serve`), with the same phases.

Phase 1 ingests ``--records`` chaos records (ids 0..N-1, in steps of 100) and processes them
slowly (``--sleep-ms`` per record), so the harness can kill it mid-run. Phase 2 is the
restarted driver: the same chaos topology, namespace and checkpoint (``<workdir>/checkpoint``),
and a source with nothing new (a generator cannot rewind); it runs until everything phase 1
persisted is done, prints ``drained`` and the counters, and exits 0 (1 if it did not drain in
time).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.chaos.base import END_FILE, SOURCE, TOPOLOGY, TRIGGER_S, build
from runtime.chaos.faults import ChaosMap
from runtime.chaos.scenarios import paced
from runtime.chaos.targets import Target
from runtime.spark.session import local_session
from runtime.testing import EOF, ScriptedSource


def _identity_batches(batches: Iterator[Any]) -> Iterator[Any]:
    yield from batches


def warm_python_workers(spark: Any) -> None:
    """Run a tiny mapInArrow job, so Python workers are up before the query's first batch.

    A restarted driver's FT service replays the records that timed out at once; if the first
    micro-batch then spends many seconds starting workers, the replays time out again.
    """
    spark.range(0, 64, numPartitions=2).mapInArrow(_identity_batches, "id long").collect()


def driver_options(prog: str) -> argparse.ArgumentParser:
    """The options every chaos driver program takes (this one, ``runtime.chaos.webhook``, ``runtime.chaos.mqtt``)."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--timeout-s", type=float, default=8.0, help="the topology's record timeout")
    p.add_argument("--sleep-ms", type=float, default=5.0, help="processing time per record")
    p.add_argument("--pipeline", choices=("topology", "dataframe"), default="topology")
    p.add_argument("--sink-spec", default=None, help="the scenario's target (runtime.chaos.targets.Target.spec)")
    return p


def driver_setup(args: argparse.Namespace) -> tuple[FTConfig, Path, Target]:
    """The driver program's FT config, workdir and target, from :func:`driver_options`' arguments."""
    workdir = Path(args.workdir)
    target = Target.from_spec(args.sink_spec) if args.sink_spec else Target("lines", str(workdir / "out"))
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, timeout_s=args.timeout_s, num_buckets=3)
    return cfg, workdir, target


def run_pipeline(spark: Any, source: Any, args: argparse.Namespace, *, drain_s: float = 300.0, push: Any = None) -> int:
    """Run the chaos pipeline (``args.pipeline``) on ``source`` until it drained; print ``started`` (the
    Topology query) and then ``drained`` or ``not drained`` with the counters; the exit code (0: drained).

    ``push``: a push source (``end()``: stop taking records) that takes records until the scenario drops
    :data:`~runtime.chaos.base.END_FILE` into the workdir; then it is ended and the pipeline drains.
    None: ``source`` ends by itself. The drain waits at most ``drain_s``.
    """
    cfg, workdir, target = driver_setup(args)

    def until_end(alive: Callable[[], bool] = lambda: True) -> None:
        while not (workdir / END_FILE).exists() and alive():
            time.sleep(0.1)
        push.end()

    sleep_s = args.sleep_ms / 1000
    if args.pipeline == "dataframe":
        from runtime.chaos.df_pipeline import serve

        ok, stats = serve(spark, cfg, source, workdir, sleep_s=sleep_s, drain_s=drain_s,
                          before_drain=until_end if push is not None else None, target=target)
        print("drained" if ok else "not drained", stats, flush=True)
        return 0 if ok else 1
    topo = build(cfg, source, ChaosMap([], sleep_s=sleep_s), target.topology_sink(), keyed=False)
    query = topo.start(spark, checkpoint_location=str(workdir / "checkpoint"), trigger_interval_s=TRIGGER_S,
                       max_records_per_batch=400)
    print("started", flush=True)
    if push is not None:
        until_end(lambda: query.query.exception() is None)
    ok = query.await_drained(drain_s)
    if ok:
        query.query.processAllAvailable()
    query.stop()
    print("drained" if ok else "not drained", query.stats(), flush=True)
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run one phase; the exit code says whether it drained."""
    p = driver_options("python -m runtime.chaos.driver_app")
    p.add_argument("--phase", type=int, choices=(1, 2), required=True)
    p.add_argument("--records", type=int, default=1500)
    args = p.parse_args(argv)
    cfg, _, _ = driver_setup(args)
    # phase 1: persist calls of 100 records (stream entries small enough for 400-record batches)
    layer = FTLayer(cfg, TOPOLOGY, SOURCE)
    source = ScriptedSource(paced(args.records, 100, 0.02, warm=layer) if args.phase == 1 else [EOF])
    spark = local_session("ftlayer-chaos-driver")
    warm_python_workers(spark)
    return run_pipeline(spark, source, args, drain_s=300 if args.phase == 2 else 600)


if __name__ == "__main__":
    sys.exit(main())
