"""Redis CPU per record, phase by phase: what the server spends on each record's life.

One round drives one source through the real FT layer the way a query does, with no Spark
(so the server's figures are not blurred by what Spark costs the shared cores):

1. **persist**: ``records`` small keyed records in ingest's calls (``ingest_batch_records`` per
   batch, ids drawn in chunks per channel, split into PERSIST calls of ``CALL_MAX_RECORDS``);
2. **read**: every channel read whole through READ_CHANNEL, as FT source tasks do;
3. **ack**: each record's completing delta through the progressive completing-only flush a
   sink task sends by default (``FTLayer.complete``, every ``sink_ack_every_records``), the
   records grouped and ordered as a keyed exchange hands them to ``sink_tasks`` sink tasks:
   each task gets the records whose second key routes to it, in the order the read tasks
   produced them (channel by channel, chunk by chunk);
4. **trim**: the channel streams trimmed to their tails, as the FT service does after a
   batch commits.

Each phase's figure is the server's own CPU time (``INFO cpu``: ``used_cpu_user`` +
``used_cpu_sys`` of the server process, command handling and network I/O included) spent
during that phase, divided by ``records``. ``redis_cpu_us_per_record`` is the sum of the four
phases. The INFO calls themselves cost a few microseconds per phase, not per record.

The worst case is measured too, outside the total: ``ack_scattered`` acks the same records
with every flush drawn at random from the whole batch (so each flush touches nearly every
chunk once), which no Spark plan produces but a user's own shuffling could.
"""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Callable
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.keyhash import key_hash, pmod
from runtime.bench.common import delete_namespace, summary
from serialization.payload import pack_payload

PHASES = ("persist", "read", "ack", "trim")
_CID = struct.Struct(">q")  # a frame's current record id, at offset 16
TOPOLOGY, SOURCE = "cpubench", "events"
Progress = Callable[[str], None]


def server_cpu_s(client: redis.Redis) -> float:
    """CPU seconds the server process has used (user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def one_round(url: str, records: int, *, channels: int = 2, sink_tasks: int = 2, sink_group: int = 1000,
              scattered: bool = False) -> dict[str, float]:
    """One round (see the module notes): server CPU microseconds per record, per phase."""
    namespace = "benchcpu" + uuid.uuid4().hex[:8]
    cfg = FTConfig(redis_url=url, namespace=namespace, num_channels=channels, max_pending=10**9)
    layer = FTLayer(cfg, TOPOLOGY, SOURCE, num_channels=channels).open()
    client = redis.Redis.from_url(url)
    payload = pack_payload({"i": 1, "user": "user-1", "page": "/p/1"})
    batch = min(cfg.ingest_batch_records, cfg.flush_batch_size)
    spent: dict[str, float] = {}
    try:
        # persist: ingest's chunks, its batch size; records routed by key over the channels
        t0 = server_cpu_s(client)
        for start in range(0, records, batch):
            n = min(batch, records - start)
            hashes = [key_hash(start + i) for i in range(n)]
            layer.persist_new([payload] * n, hashes, [pmod(h, channels) for h in hashes])
        spent["persist"] = server_cpu_s(client) - t0
        # read: every channel whole, as the FT source's tasks do
        read: list[tuple[int, int]] = []  # (sid, cid) in read order, channel by channel
        t0 = server_cpu_s(client)
        for c in range(channels):
            for b in layer.persistence.iter_channel(c):
                sids, frames = b.pending()
                read.extend(zip(sids, (_CID.unpack_from(f, 16)[0] for f in frames), strict=True))
        spent["read"] = server_cpu_s(client) - t0
        if len(read) != records:
            msg = f"redis cpu bench: read {len(read)} of {records} records"
            raise RuntimeError(msg)
        # ack: completing deltas, per sink task in the order a keyed exchange delivers them
        if scattered:
            random.Random(7).shuffle(read)
            tasks = [read]
        else:
            tasks = [[r for r in read if pmod(key_hash(r[1]), sink_tasks) == p] for p in range(sink_tasks)]
        t0 = server_cpu_s(client)
        for rows in tasks:
            for start in range(0, len(rows), sink_group):
                layer.complete(dict(rows[start : start + sink_group]))
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
    """``repeats`` rounds; per phase and in total, median/min/max of server CPU µs per record.
    Then one round with scattered acks (the worst case, reported as ``ack_scattered``)."""
    say = progress or (lambda _msg: None)
    rounds = []
    for r in range(repeats):
        got = one_round(url, records)
        got["total"] = sum(got[p] for p in PHASES)
        rounds.append(got)
        say(f"redis cpu round {r + 1}/{repeats}: " + ", ".join(f"{p} {got[p]:.2f}" for p in (*PHASES, "total"))
            + " us/record")
    worst = one_round(url, records, scattered=True)
    say(f"redis cpu, scattered acks: ack {worst['ack']:.2f} us/record")
    return {
        "records": records,
        "repeats": repeats,
        "us_per_record": {p: summary([r[p] for r in rounds]) for p in (*PHASES, "total")},
        "ack_scattered_us_per_record": round(worst["ack"], 3),
        "layout": "format 3: chunks (ftlayer.records.chunks)",
        "method": "server CPU (INFO cpu, user+sys) during each phase / records; persist in ingest's chunked "
        "batches, read through READ_CHANNEL, ack through completing-only flushes of 1000 per sink task in "
        "keyed-exchange order (2 sink tasks), trim to the tails; no Spark. ack_scattered: the same acks in "
        "random order over the whole batch (worst case, not in the total)",
    }
