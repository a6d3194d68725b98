"""Cluster scaling benchmark: persist + ack throughput of 2 client processes, 1 primary vs 3.

Two Valkey Clusters are started from the shipped valkey-server, side by side: one with 1
primary, one with 3 (no replicas: the figure is about spreading the primaries' work). Each
round runs the same load on one of them, alternating: 2 client processes (spawned, so each
has its own interpreter and connections), both ingesting into **one source of 16 virtual
shards** (parallel ingest) through the real FT layer: persist ``records`` small records in
batches of ``batch`` (chunks spread over the shards, one PERSIST per shard touched), then ack
each batch's records (the completing XOR, one FLUSH per shard touched). Aggregate throughput =
all records / the slower client's wall time.

Placement: each shard has its own hash tag, chosen so the 16 shards land 5/6/5 on 3 primaries
(``ftlayer.keyspace.shard_tags``); on the 1-primary cluster all 16 share the one primary.
``cluster_scaling_ratio`` = median aggregate throughput on 3 primaries / on 1 primary. (With
``shards=1`` each client drives a source of its own, placed on different primaries: how a
deployment scaled before shards.)

What limits it on a 2-core machine: the primaries and the two clients share two cores. Since
layout format 3 a record costs the server about 1 µs of CPU and the Python client several, so
one primary is no longer the bottleneck here: the clients are, and spreading the server work
over three primaries frees little. The CPU per record of servers and clients is reported.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import statistics
import struct
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.shard_tags import key_slot_of, slot_ranges
from ftlayer.records.chunks import CHUNK_IN_HEADER, PackedChunk, bitmap_bytes
from ftlayer.servers.cluster import EmbeddedCluster
from serialization.payload import pack_payload

TOPOLOGY = "bench"


def spread_sources(clients: int, primaries: int) -> list[str]:
    """``clients`` source names whose hash tags lie on distinct primaries (as far as there are any)."""
    ranges = slot_ranges(primaries)
    names: list[str] = []
    used: set[int] = set()
    i = 0
    while len(names) < clients:
        name = f"c{i}"
        slot = key_slot_of(f"{{{TOPOLOGY}/{name}}}")
        owner = next(j for j, (lo, hi) in enumerate(ranges) if lo <= slot <= hi)
        if owner not in used or len(used) >= primaries:
            names.append(name)
            used.add(owner)
        i += 1
    return names


def _client(job: tuple[str, str, str, int, int, int], go: Any, out: Any) -> None:
    """One client process: persist and ack ``records`` records; put its wall time on ``out``."""
    url, namespace, source, records, batch, shards = job
    layer = FTLayer(FTConfig(redis_url=url, namespace=namespace, max_pending=10**9, num_shards=shards), TOPOLOGY,
                    source, num_channels=2).open()
    payload = pack_payload({"i": 1, "user": "u1"})
    go.wait()
    started, cpu0 = time.perf_counter(), time.process_time()
    done = 0
    while done < records:
        n = min(batch, records - done)
        chunks = layer.new_chunks([payload] * n, list(range(n)), [i % 2 for i in range(n)])
        layer.persist_chunks(chunks)
        layer.ack({sid: cid for c in chunks for sid, cid in zip(c.sids, _acks(c), strict=True)})
        done += n
    out.put((source, time.perf_counter() - started, time.process_time() - cpu0, layer.pending_count()))


def _acks(chunk: PackedChunk) -> tuple[int, ...]:
    """The initial ack values (current ids) of a packed chunk's records, in index order."""
    n = chunk.records
    start = CHUNK_IN_HEADER.size + bitmap_bytes(n)
    return struct.unpack_from(f">{n}q", chunk.blob, start)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round(cluster: EmbeddedCluster, sources: list[str], records: int, batch: int,
           shards: int = 1) -> tuple[float, float, float, float]:
    """One round (2 spawned clients, a fresh namespace): aggregate records/s, the CPU per record, in
    microseconds, of the servers and of the clients, and the busiest server's share of the servers' CPU."""
    url = cluster.urls[0]
    pids = [n.pid for n in cluster.nodes if n.pid is not None]
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    namespace = "bench" + uuid.uuid4().hex[:8]
    procs = [ctx.Process(target=_client, args=((url, namespace, s, records, batch, shards), go, out))
             for s in sources]
    for p in procs:
        p.start()
    time.sleep(3.0)  # every client connected and registered its source before the clock starts
    server0 = {p: _cpu_s(p) for p in pids}
    go.set()
    results: list[Any] = []
    deadline = time.monotonic() + 600
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead or time.monotonic() > deadline:
                for p in procs:
                    p.kill()
                msg = f"cluster bench: a client process failed (exit codes {dead}) or timed out"
                raise RuntimeError(msg) from None
    per_node = [_cpu_s(p) - server0[p] for p in pids]
    server_s = sum(per_node)
    for p in procs:
        p.join(60)
    left = [pending for *_, pending in results]
    if shards > 1:  # one shared source: count once all clients are done
        left = [FTLayer(FTConfig(redis_url=url, namespace=namespace, num_shards=shards), TOPOLOGY, sources[0],
                        num_channels=2).pending_count()]
    if any(left):
        msg = f"cluster bench: records left pending after the acks: {left}"
        raise RuntimeError(msg)
    total = len(sources) * records
    client_s = sum(cpu for _, _, cpu, _ in results)
    busiest = max(per_node) / server_s if server_s > 0 else 1.0
    return (total / max(elapsed for _, elapsed, _, _ in results), 1e6 * server_s / total, 1e6 * client_s / total,
            busiest)


def bench_cluster_scaling(
    records: int = 200_000, repeats: int = 3, batch: int = 5000, progress: Callable[[str], None] | None = None,
    shards: int = 16,
) -> dict[str, Any]:
    """Median aggregate persist+ack records/s on 1 and 3 primaries, alternating rounds; see the module notes.

    With ``shards`` > 1 both clients ingest into one source of that many virtual shards (its
    shards spread over the primaries); with 1, each client has a source of its own, the two
    placed on different primaries (how one scaled before shards)."""
    say = progress or (lambda _m: None)
    sources = ["events", "events"] if shards > 1 else spread_sources(2, 3)
    got: dict[str, list[float]] = {"1_primary": [], "3_primaries": []}
    server_us: dict[str, list[float]] = {"1_primary": [], "3_primaries": []}
    client_us: dict[str, list[float]] = {"1_primary": [], "3_primaries": []}
    busiest: dict[str, list[float]] = {"1_primary": [], "3_primaries": []}
    with EmbeddedCluster(primaries=1, replicas=0) as one, EmbeddedCluster(primaries=3, replicas=0) as three:
        for r in range(repeats):
            for label, cluster in (("1_primary", one), ("3_primaries", three)):
                rate, srv, cli, top = _round(cluster, sources, records, batch, shards)
                got[label].append(rate)
                server_us[label].append(srv)
                client_us[label].append(cli)
                busiest[label].append(top)
                say(f"  round {r + 1}: {label} {rate:,.0f} records/s (2 clients); CPU per record: servers "
                    f"{srv:.1f} us, clients {cli:.1f} us; busiest primary {100 * top:.0f} % of the servers' CPU")
    ratios = [t / o for t, o in zip(got["3_primaries"], got["1_primary"], strict=True)]
    # what the cluster could carry before its busiest primary saturates, relative to one primary
    capacity = [o / t for t, o in zip(busiest["3_primaries"], busiest["1_primary"], strict=True)]
    return {
        "clients": 2,
        "records_per_client": records,
        "batch": batch,
        "sources": sorted(set(sources)),
        "num_shards": shards,
        "records_per_s": {k: _spread(v) for k, v in got.items()},
        "server_cpu_us_per_record": {k: _spread(v) for k, v in server_us.items()},
        "client_cpu_us_per_record": {k: _spread(v) for k, v in client_us.items()},
        "busiest_primary_share": {k: _spread(v) for k, v in busiest.items()},
        "ratio": _spread(ratios),
        "primary_capacity_ratio": _spread(capacity),
        "method": "aggregate persist+ack records/s of 2 spawned clients (one source, parallel ingest) on a "
        "1-primary and a 3-primary cluster, alternating; servers' and clients' CPU from /proc; "
        "primary_capacity_ratio = busiest primary's share of the servers' CPU on 1 primary / on 3 (how far "
        "the server-side ceiling rises when the shards spread)",
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}
