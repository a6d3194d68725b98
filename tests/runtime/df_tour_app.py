"""The README's DataFrame tour with default settings, for the default-durability test: ``python -m
tests.runtime.df_tour_app``.

No redis_url, no state_dir, no config argument: the embedded server's AOF lives in
``./.ftlayer/clicks/redis/`` and the query checkpoints to ``./ck`` (the tour names its checkpoint).
The source stands for a socket: it cannot rewind, and a re-run continues after the last record it
handed out (``./produced`` holds that count), so a re-run can only deliver what ftlayer persisted
before a kill. It emits 20 records at once, then, once the sink has written a batch, 2.5 records/s
up to ``--records``; the sink appends one JSON-lines file per batch to ``./out``, and waits while
``./hold`` exists. It prints the counters as JSON on its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ftlayer
from ftlayer import local_session

PRODUCED = Path("produced")
HOLD = Path("hold")


def clicks(n: int) -> Iterator[dict[str, Any]]:
    start = int(PRODUCED.read_text()) if PRODUCED.exists() else 0
    for i in range(start, n):
        tmp = PRODUCED.with_suffix(".tmp")
        tmp.write_text(str(i + 1))
        tmp.replace(PRODUCED)  # handed out: a socket would not send it again
        yield {"i": i, "user": f"user-{i % 7}", "page": f"/page/{i % 13}"}
        if i >= 20:
            # a client that sends on only once the pipeline answers: on a loaded machine Spark may
            # take longer to start than the whole paced stream, and the kill must land mid-stream
            ready = time.monotonic() + 300
            while not any(Path("out").glob("*.jsonl")) and time.monotonic() < ready:
                time.sleep(0.1)
            time.sleep(0.4)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=60)
    args = p.parse_args()
    spark = local_session("df-tour")
    out = Path("out")
    out.mkdir(exist_ok=True)
    ingest = ftlayer.ingest("clicks", "events", clicks(args.records))
    events = ftlayer.read_stream(spark, "clicks", "events", schema="i long, user string, page string")

    def write(df: Any, batch_id: int) -> None:
        rows = [r.asDict() for r in df.collect()]
        time.sleep(0.5)  # a slow sink: records are in flight when the driver is killed
        while HOLD.exists():  # the test holds the sink so that the kill finds records not yet delivered
            time.sleep(0.05)
        (out / f"{batch_id}-{uuid.uuid4().hex}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))

    query = (events.select("i", "user").writeStream.foreachBatch(ftlayer.acking(write))
             .option("checkpointLocation", "ck").trigger(processingTime="300 milliseconds").start())
    print("started", flush=True)
    handle = ftlayer.source("clicks", "events")
    deadline = time.monotonic() + 300
    ok = False
    while time.monotonic() < deadline and query.exception() is None:
        st = handle.stats()
        if ingest.done and st["pending"] == 0 and st["failed_waiting"] == 0:
            ok = True
            break
        time.sleep(0.2)
    query.stop()
    print("drained" if ok else f"not drained {query.exception()}", flush=True)
    print(json.dumps(handle.stats()), flush=True)
    ftlayer.stop_all()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
