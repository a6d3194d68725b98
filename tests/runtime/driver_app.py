"""A driver program for the driver-restart test: ``python -m tests.runtime.driver_app``.

Phase 1 ingests N click events and processes them slowly, so the test can
SIGKILL it mid-run. Phase 2 is the restarted driver: same topology, same
checkpoint and namespace, and a source that has nothing new (a generator
cannot rewind); it runs until everything persisted by phase 1 is done.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from ftlayer.config import FTConfig
from runtime.sinks import JsonLinesSink
from runtime.spark.session import local_session
from runtime.topology import Topology


def slow(e: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.005)
    return e


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--phase", type=int, required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--records", type=int, default=1500)
    args = p.parse_args()
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, timeout_s=12.0, num_buckets=3)
    source: Any = ({"i": i, "user": f"u{i % 11}"} for i in range(args.records)) if args.phase == 1 else []
    topo = Topology("restart", cfg)
    topo.source("clicks", source, key=lambda e: e["user"]).map(slow).sink(JsonLinesSink(args.out))
    spark = local_session("ftlayer-driver-restart")
    query = topo.start(spark, checkpoint_location=args.checkpoint, trigger_interval_s=0.2,
                       max_records_per_batch=400)
    print("started", flush=True)
    ok = query.await_drained(300 if args.phase == 2 else 600)
    query.stop()
    print("drained" if ok else "not drained", query.stats(), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
