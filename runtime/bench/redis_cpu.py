"""Redis CPU per record, phase by phase: what the server spends on each record's life.

One round drives one source through the real FT layer the way a query does, with no Spark
(so the server's figures are not blurred by what Spark costs the shared cores):

1. **persist**: ``records`` small records in ingest's calls (``ingest_batch_records`` per
   ``persist_frames``, split into PERSIST calls of ``CALL_MAX_RECORDS``);
2. **read**: every channel read whole through READ_CHANNEL, as FT source tasks do;
3. **ack**: each record's completing delta, in sink-task sized groups, through the
   progressive completing-only flush a sink task sends by default (``FTLayer.complete``);
4. **trim**: the channel streams trimmed to their tails, as the FT service does after a
   batch commits.

Each phase's figure is the server's own CPU time (``INFO cpu``: ``used_cpu_user`` +
``used_cpu_sys`` of the server process, command handling and network I/O included) spent
during that phase, divided by ``records``. ``redis_cpu_us_per_record`` is the sum of the four
phases. The INFO calls themselves cost a few microseconds per phase, not per record.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.frames import encode_source_frames
from ftlayer.ids import RecordId, new_ids
from ftlayer.layer import FTLayer
from runtime.bench.common import delete_namespace, summary
from serialization.payload import pack_payload

PHASES = ("persist", "read", "ack", "trim")
TOPOLOGY, SOURCE = "cpubench", "events"
Progress = Callable[[str], None]


def server_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the server process has used (user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def one_round(url: str, records: int, *, channels: int = 2, sink_group: int = 1000) -> dict[str, float]:
    """One round (see the module notes): server CPU microseconds per record, per phase."""
    namespace = "benchcpu" + uuid.uuid4().hex[:8]
    cfg = FTConfig(redis_url=url, namespace=namespace, num_channels=channels, max_pending=10**9)
    layer = FTLayer(cfg, TOPOLOGY, SOURCE, num_channels=channels).open()
    client = redis.Redis.from_url(url)
    payload = pack_payload({"i": 1, "user": "user-1", "page": "/p/1"})
    batch = min(cfg.ingest_batch_records, cfg.flush_batch_size)
    spent: dict[str, float] = {}
    try:
        # persist: ingest's frames, its batch size
        ids: list[int] = []
        t0 = server_cpu_s(client)
        for start in range(0, records, batch):
            n = min(batch, records - start)
            fresh = new_ids(2 * n)
            ids.extend(fresh)
            layer.persist_frames(encode_source_frames(layer.source_id, fresh, list(range(n)), [payload] * n,
                                                      [i % channels for i in range(n)]))
        spent["persist"] = server_cpu_s(client) - t0
        # read: every channel whole, as the FT source's tasks do
        t0 = server_cpu_s(client)
        read = sum(len(b.values) for c in range(channels) for b in layer.persistence.iter_channel(c))
        spent["read"] = server_cpu_s(client) - t0
        if read != records:
            msg = f"redis cpu bench: read {read} of {records} records"
            raise RuntimeError(msg)
        # ack: completing deltas (sid -> current id) in sink-task sized groups
        acks = [RecordId(ids[2 * i], ids[2 * i + 1]) for i in range(records)]
        t0 = server_cpu_s(client)
        for start in range(0, records, sink_group):
            layer.complete({r.source_record_id: r.current_record_id for r in acks[start : start + sink_group]})
        spent["ack"] = server_cpu_s(client) - t0
        if layer.pending_count() != 0:
            msg = f"redis cpu bench: {layer.pending_count()} records still pending after the acks"
            raise RuntimeError(msg)
        t0 = server_cpu_s(client)
        for c in range(channels):
            layer.trim_channel(c)
        spent["trim"] = server_cpu_s(client) - t0
    finally:
        client.close()
        delete_namespace(url, namespace)
    return {phase: spent[phase] * 1e6 / records for phase in PHASES}


def bench_redis_cpu(url: str, records: int = 200_000, repeats: int = 3,
                    progress: Progress | None = None) -> dict[str, Any]:
    """``repeats`` rounds; per phase and in total, median/min/max of server CPU µs per record."""
    say = progress or (lambda _msg: None)
    rounds = []
    for r in range(repeats):
        got = one_round(url, records)
        got["total"] = sum(got[p] for p in PHASES)
        rounds.append(got)
        say(f"redis cpu round {r + 1}/{repeats}: " + ", ".join(f"{p} {got[p]:.2f}" for p in (*PHASES, "total"))
            + " us/record")
    return {
        "records": records,
        "repeats": repeats,
        "us_per_record": {p: summary([r[p] for r in rounds]) for p in (*PHASES, "total")},
        "method": "server CPU (INFO cpu, user+sys) during each phase / records; persist in ingest batches, "
        "read through READ_CHANNEL, ack through completing-only flushes of 1000, trim to the tails; no Spark",
    }
