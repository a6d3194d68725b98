"""A DataFrame driver for the driver-restart test: ``python -m tests.runtime.df_driver_app``.

Phase 1 ingests N records, reads them with ``ftlayer.read_stream``, filters a third out and
writes the rest slowly through ``foreachBatch(ftlayer.acking(fn))`` into JSON-lines files, so the
test can SIGKILL it mid-run. Phase 2 is the restarted driver: same namespace, names and
checkpoint, nothing new ingested (a generator cannot rewind); it runs until every record
persisted by phase 1 is acked, then exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import ftlayer
from ftlayer.config import FTConfig
from runtime.dataframe import sources
from runtime.spark.session import local_session


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--phase", type=int, required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--records", type=int, default=1500)
    args = p.parse_args()
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, timeout_s=12.0, num_buckets=3,
                   ingest_batch_records=100)  # small stream entries: batches of about 200 records
    spark = local_session("ftlayer-df-driver-restart")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    handle = sources.source("dfrestart", "events", config=cfg, num_channels=2)
    if args.phase == 1:
        handle.ingest({"i": i, "user": f"u{i % 11}"} for i in range(args.records))
    df = ftlayer.read_stream(spark, "dfrestart", "events", schema="i long, user string", config=cfg,
                             num_channels=2, max_records_per_batch=200)

    def write(batch: Any, batch_id: int) -> None:
        rows = [r.asDict() for r in batch.collect()]
        time.sleep(0.3)  # slow: the kill lands while records are in flight
        (out / f"{batch_id}-{uuid.uuid4().hex}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))

    query = (df.filter("i % 3 != 0").writeStream.foreachBatch(ftlayer.acking(write, config=cfg))
             .option("checkpointLocation", args.checkpoint).trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    deadline = time.monotonic() + (300 if args.phase == 2 else 600)
    ok = False
    while time.monotonic() < deadline and query.exception() is None:
        st = handle.stats()
        if st["persisted"] == args.records and st["acked"] == args.records and handle.layer.pending_count() == 0:
            ok = True
            break
        time.sleep(0.2)
    query.stop()
    print("drained" if ok else "not drained", handle.stats(), query.exception(), flush=True)
    sources.stop_all()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
