"""The README tour with default settings, for the default-durability chaos test: ``python -m tests.runtime.tour_app``.

No redis_url, no checkpoint, no state_dir: everything lives in ``./.ftlayer/tour/``. The
source stands for a socket: it cannot rewind, and a re-run continues after the last record
it handed out (``./produced`` holds that count), so a re-run can only deliver what ftlayer
persisted before the kill. It emits 400 lines at once, then 50 lines/s up to ``--records``,
so a test can kill the driver mid-stream; ``--unpaced`` (the re-run) hands out the rest at once,
since no kill comes then. It prints ``drained`` and the counters as JSON on its last line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from runtime.sinks import JsonLinesSink
from runtime.spark.session import local_session
from runtime.topology import Topology

PRODUCED = Path("produced")


def clicks(n: int, paced: bool = True) -> Iterator[str]:
    """Lines ``i|user|page`` from where the last run stopped handing them out."""
    start = int(PRODUCED.read_text()) if PRODUCED.exists() else 0
    for i in range(start, n):
        tmp = PRODUCED.with_suffix(".tmp")
        tmp.write_text(str(i + 1))
        tmp.replace(PRODUCED)  # handed out (atomically): a socket would not send it again
        yield f"{i}|user-{i % 97}|/page/{i % 13}"
        if paced and i >= 400 and i % 10 == 9:
            time.sleep(0.2)  # 400 at once, then 50 records/s: the stream is still flowing at the kill


def parse(line: str) -> dict[str, Any]:
    time.sleep(0.004)  # slow enough that batches are in flight when the driver is killed
    i, user, page = line.split("|")
    return {"i": int(i), "user": user, "page": page}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--records", type=int, default=2000)
    p.add_argument("--unpaced", action="store_true", help="hand out the rest at once (a re-run after the kill)")
    args = p.parse_args()
    topo = Topology("tour", FTConfig.load())
    (topo.source("events", clicks(args.records, paced=not args.unpaced))
         .map(parse)
         .key_by(lambda e: e["user"])
         .map(lambda e: {**e, "segment": len(e["user"]) % 3})
         .sink(JsonLinesSink(Path("out").resolve())))
    query = topo.start(local_session("tour"))
    print("started", flush=True)
    ok = query.await_drained(600)
    query.stop()
    print("drained" if ok else "not drained", flush=True)
    print(json.dumps(next(iter(query.stats().values()))), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
