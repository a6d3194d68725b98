"""Driver CPU per record ingested: what the ingest process spends from a source's records to persisted.

One round runs a real :class:`~runtime.driver.ingest.Ingestor` (no thread: ``run()`` on the
calling thread, so nothing else of this process competes) over ``records`` small records already
in memory, into a fresh source on a real Redis, with the default batch size
(``FTConfig.ingest_batch_records`` / ``flush_batch_size``: 20,000) and default durability. The
records are the e2e benchmark's (:func:`runtime.bench.e2e.make_value`: ``{"i": i, "user":
"user-<i % 97>", "page": "/p/<i % 13>"}``, 26 to 31 bytes of msgpack), keyed by ``user`` (the key
hash, channel by key), over 2 channels. Two sources are measured, alternating:

- ``iterable``: a list handed to ingest as is, one record per step of the source, as
  ``Topology.source(iterable)`` and the e2e benchmarks feed it (the headline figure);
- ``poll``: a poll source returning 1,000 records per ``poll()`` (as the webhook and MQTT
  sources hand over a request or a delivery at once);
- ``schema``: the iterable, with the records' schema checked at ingest (``ingest(..., schema=...)``:
  :class:`~runtime.spark.schema_check.SchemaCheck` of ``i long, user string, page string``): what
  a misfit dead-lettered at ingest instead of at read costs every record that fits.

The figure is this process's CPU time (``time.process_time``: user + system of every thread of
the process; the Redis server is another process, its CPU is ``redis_cpu_us_per_record``'s)
during ``run()``, divided by the records persisted: packing, key hashing, routing, ids, frames,
chunks, the persist calls' client side (redis-py and the socket writes) and the ingest loop.
Building the records is not in it (they exist before the clock starts). A round's namespace is
deleted afterwards.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.bench.common import delete_namespace, summary
from runtime.bench.e2e import make_value
from runtime.driver.ingest import Ingestor

SOURCES = ("iterable", "poll", "schema")
POLL_RECORDS = 1000
TOPOLOGY, SOURCE = "ingestbench", "events"
Progress = Callable[[str], None]


class _PollSource:
    """Hands ``values`` over ``POLL_RECORDS`` at a time; None once they are all out (ends ingest)."""

    def __init__(self, values: list[Any]) -> None:
        self.values = values
        self.at = 0

    def poll(self) -> list[Any] | None:
        if self.at >= len(self.values):
            return None
        got = self.values[self.at : self.at + POLL_RECORDS]
        self.at += POLL_RECORDS
        return got


def _user(value: dict[str, Any]) -> Any:
    return value["user"]


def _schema_check() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from runtime.spark.schema_check import SchemaCheck

    return SchemaCheck(StructType([StructField("i", LongType()), StructField("user", StringType()),
                                   StructField("page", StringType())]))


def one_round(url: str, records: int, source: str, *, channels: int = 2) -> float:
    """One round (see the module notes): this process's CPU µs per record persisted."""
    if source not in SOURCES:
        msg = f"unknown ingest source {source!r}: choose from {SOURCES}"
        raise ValueError(msg)
    namespace = "benchingest" + uuid.uuid4().hex[:8]
    cfg = FTConfig(redis_url=url, namespace=namespace, num_channels=channels, max_pending=10**9)
    layer = FTLayer(cfg, TOPOLOGY, SOURCE, num_channels=channels).open()
    values = [make_value(i, 0) for i in range(records)]
    feed: Iterable[Any] | _PollSource = _PollSource(values) if source == "poll" else values
    ingestor = Ingestor(layer, feed, key=_user, check=_schema_check() if source == "schema" else None)
    try:
        t0 = time.process_time()
        ingestor.run()
        spent = time.process_time() - t0
        if ingestor.error is not None or ingestor.ingested != records:
            msg = f"ingest cpu bench: {ingestor.ingested} of {records} records persisted ({ingestor.error!r})"
            raise RuntimeError(msg)
        if layer.pending_count() != records:
            msg = f"ingest cpu bench: {layer.pending_count()} records pending, {records} persisted"
            raise RuntimeError(msg)
    finally:
        delete_namespace(url, namespace)
    return spent * 1e6 / records


def bench_ingest_cpu(url: str, records: int = 200_000, repeats: int = 5,
                     progress: Progress | None = None) -> dict[str, Any]:
    """``repeats`` alternating rounds of each source (after one unmeasured warm-up round each);
    median/min/max of the driver's CPU µs per record. ``ingest_us_per_record`` is the
    iterable source's median."""
    say = progress or (lambda _msg: None)
    for source in SOURCES:  # warm-up: imports, the scripts loaded into the server, first allocations
        one_round(url, min(records, 20_000), source)
    got: dict[str, list[float]] = {s: [] for s in SOURCES}
    for r in range(repeats):
        for source in SOURCES:
            got[source].append(one_round(url, records, source))
        say(f"ingest cpu round {r + 1}/{repeats}: " + ", ".join(f"{s} {got[s][-1]:.2f}" for s in SOURCES)
            + " us/record")
    return {
        "records": records,
        "repeats": repeats,
        "us_per_record": {s: summary(got[s]) for s in SOURCES},
        "record": "runtime.bench.e2e.make_value(i, 0), keyed by 'user', 2 channels",
        "method": "time.process_time() of the ingest process around Ingestor.run() (no thread) over records "
        "already in memory, default batch size and durability, / records persisted; iterable: a list, one record "
        f"per source step; poll: {POLL_RECORDS} records per poll(); schema: the iterable with a 3-column schema "
        "checked at ingest (SchemaCheck); the Redis server's CPU excluded "
        "(redis_cpu_us_per_record)",
    }
