"""An ingest-only driver for the loss-window test: ``python -m tests.runtime.ingest_app``.

A generator source that cannot rewind appends each id to ``--produced`` (one ``O_APPEND`` write,
so it survives a SIGKILL of this process) just before it yields it; the Ingestor persists them
with ``ingest_batch_records = --batch``, until the test SIGKILLs the process.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.driver.ingest import Ingestor


def produce(path: str) -> Iterator[dict[str, Any]]:
    fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o644)
    i = 0
    while True:
        os.write(fd, f"{i}\n".encode())
        yield {"i": i, "user": f"u{i % 7}"}
        i += 1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--redis-url", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--produced", required=True)
    p.add_argument("--batch", type=int, required=True)
    args = p.parse_args()
    cfg = FTConfig(redis_url=args.redis_url, namespace=args.namespace, ingest_batch_records=args.batch,
                   max_pending=10**9)
    layer = FTLayer(cfg, "window", "gen", num_channels=2).open()
    Ingestor(layer, produce(args.produced), key=lambda e: e["user"]).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
