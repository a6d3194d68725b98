"""Benchmarks that print ratios measured side by side in one run.

The acker and memory benchmarks (``ftlayer bench acker``; :mod:`runtime.cli.bench`
runs all benchmarks):

- **acker vs raw**: XOR updates per second through :class:`AckerTable` (one
  non-completing XOR, then the completing one, for each of N pending records,
  in batched flushes) against raw pipelined ``HSET`` + ``HDEL`` of the same
  count on the same server. Variants alternate, each repeated; median and
  spread are printed.
- **bytes per pending record**: Redis ``used_memory`` growth per pending
  record after persisting N records, minus the msgpack payload size.

:func:`write_results` merges a summary into ``<bench --out>/results.json`` (keys
``acker_vs_raw_ratio`` and ``bytes_per_pending_record`` come from here, plus
raw figures, the machine and the date).
"""

from __future__ import annotations

import json
import os
import platform
import struct
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.ids import child_id
from ftlayer.records.keyhash import key_hash, pmod
from runtime.bench.common import delete_namespace, summary
from runtime.driver.progress import TaskProgress
from serialization.payload import pack_payload
from serialization.serializers import make_records


def _machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def _progress(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def _acker_round(url: str, n: int, batch: int) -> float:
    """Seconds for 2n XOR updates (n in, n completing) through the AckerTable."""
    cfg = FTConfig(redis_url=url, namespace="bench" + uuid.uuid4().hex[:8], flush_batch_size=batch)
    layer = FTLayer(cfg, "bench", "acker", num_channels=2).open()
    records = make_records(layer, list(range(n)), key=lambda v: v % 2)  # chunked, as ingest files them
    layer.persist(records)
    # first flush: an operator anchors each record and emits one child; second: the sink acks it
    children = {r.record_id.source_record_id: child_id(r.record_id.current_record_id, 1, 0) for r in records}
    first = {r.record_id.source_record_id: r.record_id.current_record_id ^ children[r.record_id.source_record_id]
             for r in records}
    second = children
    start = time.perf_counter()
    layer.xor(first, token="a")
    done = layer.xor(second, token="b")
    elapsed = time.perf_counter() - start
    if len(done.acked) != n:
        msg = f"acker bench: {len(done.acked)} of {n} records completed"
        raise RuntimeError(msg)
    delete_namespace(url, cfg.namespace)
    return elapsed


def _raw_round(url: str, n: int, batch: int) -> float:
    """Seconds for n pipelined HSET then n HDEL (8-byte fields and values), batch per round trip."""
    client = redis.Redis.from_url(url)
    key = "benchraw" + uuid.uuid4().hex[:8]
    fields = [struct.pack(">q", i + 1) for i in range(n)]
    value = struct.pack(">q", 12345)
    start = time.perf_counter()
    for i in range(0, n, batch):
        pipe = client.pipeline(transaction=False)
        for f in fields[i : i + batch]:
            pipe.hset(key, f, value)
        pipe.execute()
    for i in range(0, n, batch):
        pipe = client.pipeline(transaction=False)
        for f in fields[i : i + batch]:
            pipe.hdel(key, f)
        pipe.execute()
    elapsed = time.perf_counter() - start
    client.delete(key)
    return elapsed


def bench_acker(url: str, n: int, repeats: int, batch: int) -> dict[str, Any]:
    """Alternate acker and raw rounds; return updates/s figures and their ratio.

    Shows a progress bar of the rounds on stderr (plain ``[bench]`` lines when stderr is not a terminal).
    """
    acker_rates: list[float] = []
    raw_rates: list[float] = []
    ratios: list[float] = []
    runs: list[tuple[str, Callable[[str, int, int], float], list[float]]] = [
        ("acker", _acker_round, acker_rates),
        ("raw", _raw_round, raw_rates),
    ]
    with TaskProgress("bench", total=2 * repeats, stream=sys.stderr, plain_interval_s=30) as bar:
        for r in range(repeats):
            pair: dict[str, float] = {}
            order = runs if r % 2 == 0 else runs[::-1]
            for name, fn, sink in order:
                bar.update(info=f"round {r + 1}/{repeats}: {name}")
                rate = 2 * n / fn(url, n, batch)
                sink.append(rate)
                pair[name] = rate
                bar.update(advance=1, info=f"round {r + 1}/{repeats}: {name} {rate:,.0f}/s")
            ratios.append(pair["acker"] / pair["raw"])
            bar.log(f"acker round {r + 1}/{repeats}: acker {pair['acker']:,.0f}/s raw {pair['raw']:,.0f}/s")
    return {
        "updates": 2 * n,
        "flush_batch_size": batch,
        "acker_updates_per_s": summary(acker_rates),
        "raw_hset_hdel_per_s": summary(raw_rates),
        "ratio": summary(ratios),
    }


def bench_memory(url: str, n: int, payload_bytes: int) -> dict[str, Any]:
    """Redis memory per pending record beyond its msgpack payload, at n pending records."""
    client = redis.Redis.from_url(url)
    cfg = FTConfig(redis_url=url, namespace="benchmem" + uuid.uuid4().hex[:8])
    layer = FTLayer(cfg, "bench", "mem", num_channels=2).open()
    payload = pack_payload("x" * max(0, payload_bytes - 3))  # msgpack str header is 1-3 bytes
    hashes = [key_hash(i) for i in range(n)]
    chunks = layer.new_chunks([payload] * n, hashes, [pmod(h, 2) for h in hashes])  # as ingest files them
    payload_len = len(payload)
    client.execute_command("MEMORY", "PURGE")  # type: ignore[no-untyped-call]
    before = int(client.info("memory")["used_memory"])
    layer.persist_chunks(chunks)
    del chunks
    # the channel index is trimmed when Spark commits; measure the steady state after that
    for ch in range(2):
        layer.trim_channel(ch)
    # Close the writer's connections first: their query buffers still hold the last
    # persist call's arguments and would be counted as if they were per-record state.
    layer.disconnect()
    client.execute_command("MEMORY", "PURGE")  # type: ignore[no-untyped-call]
    after = int(client.info("memory")["used_memory"])
    per_record = (after - before) / n
    per_key: dict[str, float] = {}
    for key in client.scan_iter(match=layer.keys.prefix + "*", count=1000):
        usage = int(client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)  # type: ignore[no-untyped-call]
        per_key[key.decode()[len(layer.keys.prefix):]] = usage / n
    chunk_count = int(client.hlen(layer.keys.chunks))
    delete_namespace(url, cfg.namespace)
    key_bytes = sum(per_key.values())
    return {
        "pending_records": n,
        "payload_bytes": payload_len,
        "chunks": chunk_count,
        "used_memory_per_record": per_record,
        "used_memory_bytes_beyond_payload": per_record - payload_len,
        "key_bytes_per_record": key_bytes,
        "bytes_per_pending_record": key_bytes - payload_len,
        "bytes_per_record_by_key": {k: round(v, 3) for k, v in sorted(per_key.items()) if v >= 0.001},
        "method": "bytes_per_pending_record = sum of MEMORY USAGE (SAMPLES 0) over the source's keys / n "
        "- payload, records filed as ingest files them (chunks per channel); used_memory_* is INFO memory "
        "growth (includes the hash tables' bucket arrays)",
        "breakdown": "layout format 3 (chunks): frame header 48 B and initial ack value 8 B per record, "
        "settled bit 1/8 B, and per chunk of up to 1024 records three hash fields, a state header, "
        "a bucket-list entry and a channel-stream entry (trimmed)",
    }


def write_results(update: dict[str, Any], path: Path) -> dict[str, Any]:
    """Merge ``update`` into the results file ``path`` (so separate benches keep each other's keys).

    No default: a path inside the installed package (its old default) is no place for results;
    ``ftlayer bench --out`` names the directory (``scripts/bench``: the checkout's docs/bench)."""
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    data.update(update)
    data["machine"] = _machine()
    data["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data
