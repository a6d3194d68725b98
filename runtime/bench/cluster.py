"""Cluster scaling benchmark: persist + ack throughput of 2 client processes, 1 primary vs 3.

Two Valkey Clusters are started from the shipped valkey-server, side by side: one with 1
primary, one with 3 (no replicas: the figure is about spreading the primaries' work). Each
round runs the same load on one of them, alternating: 2 client processes (spawned, so each
has its own interpreter and connections), each driving its own source through the real FT
layer: persist ``records`` small records in calls of ``batch``, then ack each call's records
(the completing XOR), so every record costs one PERSIST and one FLUSH entry on the server.
Aggregate throughput = all records / the slower client's wall time.

Placement: a source's keys share one hash tag, so one source lives on one primary. The two
sources are named so their tags fall in the slot ranges of different primaries of the
3-primary cluster (the first names ``c0``, ``c1``, ... that do); on the 1-primary cluster the
same names share the one primary. ``cluster_scaling_ratio`` = median aggregate throughput on
3 primaries / on 1 primary.

What limits it on a 2-core machine: the primaries and the two clients share two cores, so with
3 primaries two server processes and two Python clients compete for them; the ratio measures
how much of the one-primary bottleneck (one server core) the spread removes.
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

from ftlayer.chunks import CHUNK_IN_HEADER, PackedChunk, bitmap_bytes
from ftlayer.cluster_server import EmbeddedCluster
from ftlayer.config import FTConfig
from ftlayer.layer import FTLayer
from ftlayer.shards import key_slot_of, slot_ranges
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


def _client(job: tuple[str, str, str, int, int], go: Any, out: Any) -> None:
    """One client process: persist and ack ``records`` records; put its wall time on ``out``."""
    url, namespace, source, records, batch = job
    layer = FTLayer(FTConfig(redis_url=url, namespace=namespace, max_pending=10**9), TOPOLOGY, source,
                    num_channels=2).open()
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


def _round(cluster: EmbeddedCluster, sources: list[str], records: int, batch: int) -> tuple[float, float, float]:
    """One round (2 spawned clients, a fresh namespace): aggregate records/s, and the CPU seconds per
    record, in microseconds, of the servers and of the clients."""
    url = cluster.urls[0]
    pids = [n.pid for n in cluster.nodes if n.pid is not None]
    ctx = mp.get_context("spawn")
    go, out = ctx.Event(), ctx.Queue()
    namespace = "bench" + uuid.uuid4().hex[:8]
    procs = [ctx.Process(target=_client, args=((url, namespace, s, records, batch), go, out)) for s in sources]
    for p in procs:
        p.start()
    time.sleep(3.0)  # every client connected and registered its source before the clock starts
    server0 = sum(_cpu_s(p) for p in pids)
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
    server_s = sum(_cpu_s(p) for p in pids) - server0
    for p in procs:
        p.join(60)
    if any(pending for *_, pending in results):
        msg = f"cluster bench: records left pending after the acks: {results}"
        raise RuntimeError(msg)
    total = len(sources) * records
    client_s = sum(cpu for _, _, cpu, _ in results)
    return (total / max(elapsed for _, elapsed, _, _ in results), 1e6 * server_s / total, 1e6 * client_s / total)


def bench_cluster_scaling(
    records: int = 200_000, repeats: int = 3, batch: int = 5000, progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Median aggregate persist+ack records/s on 1 and 3 primaries, alternating rounds; see the module notes."""
    say = progress or (lambda _m: None)
    sources = spread_sources(2, 3)
    got: dict[str, list[float]] = {"1_primary": [], "3_primaries": []}
    server_us: dict[str, list[float]] = {"1_primary": [], "3_primaries": []}
    client_us: dict[str, list[float]] = {"1_primary": [], "3_primaries": []}
    with EmbeddedCluster(primaries=1, replicas=0) as one, EmbeddedCluster(primaries=3, replicas=0) as three:
        for r in range(repeats):
            for label, cluster in (("1_primary", one), ("3_primaries", three)):
                rate, srv, cli = _round(cluster, sources, records, batch)
                got[label].append(rate)
                server_us[label].append(srv)
                client_us[label].append(cli)
                say(f"  round {r + 1}: {label} {rate:,.0f} records/s (2 clients); CPU per record: servers "
                    f"{srv:.1f} us, clients {cli:.1f} us")
    ratios = [t / o for t, o in zip(got["3_primaries"], got["1_primary"], strict=True)]
    return {
        "clients": 2,
        "records_per_client": records,
        "batch": batch,
        "sources": sources,
        "records_per_s": {k: _spread(v) for k, v in got.items()},
        "server_cpu_us_per_record": {k: _spread(v) for k, v in server_us.items()},
        "client_cpu_us_per_record": {k: _spread(v) for k, v in client_us.items()},
        "ratio": _spread(ratios),
    }


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}
