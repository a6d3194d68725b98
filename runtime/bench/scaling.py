"""Scaling benchmark: throughput and Redis memory as the number of pending records grows.

For each size N (default 10k, 100k, 1M) one fresh namespace on the server is
filled through the real FT layer (:class:`~ftlayer.facade.ft_layer.FTLayer`, 2 channels,
records routed by key) and these figures are taken at N pending records:

- ``persist_per_s``: records/s of :meth:`FTLayer.persist` while the table grows
  from 0 to N, in ``flush_batch_size`` chunks. Only the persist calls are timed,
  not building the records.
- ``used_memory_bytes``: growth of ``INFO memory`` ``used_memory`` from the
  opened, empty namespace to N pending records (includes the hash table's bucket
  array and allocator overhead); ``used_memory_per_record`` is that / N.
- ``bytes_per_pending_record``: sum of ``MEMORY USAGE <key> SAMPLES 0`` over the
  source's keys / N (the payload included); ``bytes_per_record_beyond_payload``
  subtracts the msgpack payload. Measured as in ``runtime.bench.acker.bench_memory``:
  channel streams trimmed first (Spark trims them on commit), the writer's
  connections closed first (their buffers still hold the last persist call).
- ``acker_updates_per_s``: XOR updates/s through the AckerTable for a sample of
  ``min(sample, N)`` of the pending records while N are pending: one
  non-completing XOR (an operator's anchor + child), then the completing one
  (the sink's ack), like ``runtime.bench.acker._acker_round``. Only the XOR calls are
  timed. The completed sample is then replaced by as many fresh records
  (untimed), so the drain starts again from N pending.
- ``drain_per_s``: records/s of completing acks for all N pending records, in
  ``flush_batch_size`` chunks, down to 0 pending. The namespace must then hold no
  pending record (else :class:`ScalingBenchError`); its keys are deleted
  afterwards in every case.

The Python side keeps only two ``array('q')`` of ids (16 B per record) and one
chunk of records at a time, so 1M records cost ~16 MB here; Redis holds
roughly 150 B per record (~150 MB at 1M).

``python -m runtime.bench.scaling --out DIR`` runs it on an embedded server (or
``$FTLAYER_REDIS_URL``) and writes ``DIR/scaling.json`` and the PNG plots of
:func:`runtime.bench.plot.plot_scaling`.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import os
import sys
import time
import uuid
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import redis

from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError, FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.ids import child_id
from runtime.driver.progress import TaskProgress
from serialization.payload import pack_payload
from serialization.serializers import make_records

DEFAULT_SIZES: tuple[int, ...] = (10_000, 100_000, 1_000_000)
NUM_CHANNELS = 2
_OPERATOR = 1  # operator id of the simulated anchor step (any fixed value)
Ids = tuple["array[int]", "array[int]"]  # (source_record_ids, current_record_ids) of the pending records

METHOD = (
    "per size N, fresh namespace, real FTLayer (2 channels, key-routed records, msgpack str payload). "
    "persist_per_s: N / time in persist calls (flush_batch_size chunks, record building untimed). "
    "used_memory_bytes: INFO used_memory growth from the empty namespace to N pending "
    "(channel streams trimmed, writer connections closed, MEMORY PURGE); used_memory_per_record = that / N. "
    "bytes_per_pending_record: sum of MEMORY USAGE SAMPLES 0 over the source's keys / N; "
    "bytes_per_record_beyond_payload: that minus the payload. "
    "acker_updates_per_s: 2*min(sample, N) / time of one non-completing then one completing XOR per sampled "
    "record at N pending (the sample is then replaced by fresh records). "
    "drain_per_s: N / time of completing acks of all N records in flush_batch_size chunks."
)


class ScalingBenchError(FTLayerError, RuntimeError):
    """The scaling benchmark saw the FT layer disagree with what it wrote (lost or extra records)."""


def bench_scaling(
    url: str,
    sizes: Sequence[int] = DEFAULT_SIZES,
    *,
    payload_bytes: int = 32,
    sample: int = 20_000,
    progress: TextIO | bool = True,
    namespace_prefix: str = "benchscale",
) -> dict[str, Any]:
    """Measure throughput and memory at each pending level in ``sizes``; see the module contract.

    ``progress``: ``True`` shows a :class:`TaskProgress` on stderr, a stream shows it
    there, ``False`` shows nothing. Each size uses the fresh namespace
    ``<namespace_prefix><8 hex digits>``, deleted afterwards. Returns a JSON-friendly dict with ``sizes``,
    ``points`` (one per size, in order), ``payload_bytes`` (the real msgpack length),
    ``acker_sample``, ``flush_batch_size``, ``num_channels`` and ``method``.
    Raises :class:`~ftlayer.errors.ConfigError` for sizes < 1, sample < 1 or
    payload_bytes < 1, and :class:`ScalingBenchError` if counts do not add up.
    """
    sizes = [int(n) for n in sizes]
    if not sizes or min(sizes) < 1:
        msg = f"bench_scaling sizes {sizes!r}: expected one or more sizes >= 1"
        raise ConfigError(msg)
    if sample < 1 or payload_bytes < 1:
        msg = f"bench_scaling sample={sample}, payload_bytes={payload_bytes}: both must be >= 1"
        raise ConfigError(msg)
    value = _payload_value(payload_bytes)
    payload_len = len(pack_payload(value))
    batch = FTConfig().flush_batch_size
    # work units: persist N, acker 2 updates per sampled record, top-up s, drain N
    total = sum(2 * n + 3 * min(sample, n) for n in sizes)
    stream: TextIO = sys.stderr if progress is True else (io.StringIO() if progress is False else progress)
    with TaskProgress("scaling", total=total, stream=stream, plain_interval_s=30) as bar:
        points = []
        for n in sizes:
            namespace = namespace_prefix + uuid.uuid4().hex[:8]
            point = _measure_point(url, namespace, n, value=value, payload_len=payload_len,
                                   sample=min(sample, n), bar=bar)
            bar.log(
                f"N={n:,}: persist {point['persist_per_s']:,.0f}/s, acker {point['acker_updates_per_s']:,.0f}"
                f" updates/s, drain {point['drain_per_s']:,.0f}/s, {point['bytes_per_pending_record']:.1f} B"
                f"/record, used_memory +{point['used_memory_bytes'] / 2**20:.1f} MiB"
            )
            points.append(point)
    return {
        "sizes": sizes,
        "points": points,
        "payload_bytes": payload_len,
        "acker_sample": sample,
        "flush_batch_size": batch,
        "num_channels": NUM_CHANNELS,
        "method": METHOD,
    }


def _payload_value(payload_bytes: int) -> str:
    """A str whose msgpack encoding is ``payload_bytes`` long, or as close as msgpack headers allow."""
    candidates = ["x" * max(0, payload_bytes - header) for header in (1, 2, 3, 5)]
    return min(candidates, key=lambda v: abs(len(pack_payload(v)) - payload_bytes))


def _measure_point(
    url: str, namespace: str, n: int, *, value: str, payload_len: int, sample: int, bar: TaskProgress
) -> dict[str, Any]:
    """All figures at ``n`` pending records, in ``namespace`` (deleted afterwards)."""
    cfg = FTConfig(redis_url=url, namespace=namespace, timeout_s=3600.0)  # no timeouts during the run
    client = redis.Redis.from_url(url)
    layer: FTLayer | None = None
    try:
        layer = FTLayer(cfg, "bench", "scale", num_channels=NUM_CHANNELS).open()
        _purge(client)
        before = _used_memory(client)
        sids: array[int] = array("q")
        cids: array[int] = array("q")
        persist_s = _persist(layer, value, (0, n), (sids, cids), bar=bar, info=f"N={n:,}: persist")
        memory = _memory(client, layer, n, before, payload_len)
        acker_s = _acker_sample(layer, (sids, cids), sample, bar, n)
        # Replace the completed sample so the drain starts again from n pending records.
        _persist(layer, value, (n, sample), (sids, cids), bar=bar, info=f"N={n:,}: top-up",
                 replace=True)
        refilled = layer.pending_count()
        if refilled != n:
            msg = f"scaling bench N={n}: {refilled} records pending after the top-up, expected {n}"
            raise ScalingBenchError(msg)
        drain_s = _drain(layer, (sids, cids), bar, n)
        left = layer.pending_count()
        if left != 0:
            msg = f"scaling bench N={n}: {left} records still pending after acking all {n}"
            raise ScalingBenchError(msg)
    finally:
        if layer is not None:
            layer.disconnect()
        delete_namespace(client, namespace)
        client.close()
    return {
        "pending": n,
        "persist_per_s": n / persist_s,
        "acker_updates_per_s": 2 * sample / acker_s,
        "drain_per_s": n / drain_s,
        **memory,
        "persist_s": persist_s,
        "acker_sample": sample,
        "acker_s": acker_s,
        "drain_s": drain_s,
    }


def _persist(
    layer: FTLayer,
    value: str,
    keys: tuple[int, int],
    ids: Ids,
    *,
    bar: TaskProgress,
    info: str,
    replace: bool = False,
) -> float:
    """Persist ``count`` new records with keys ``first_key..``; seconds spent in persist calls.

    ``keys`` is (first_key, count). Appends their ids to ``ids`` (sids, cids), or with
    ``replace`` overwrites entries 0..count-1 (the acked sample). Chunks of
    flush_batch_size are built one at a time to bound memory.
    """
    first_key, count = keys
    sids, cids = ids
    batch = layer.config.flush_batch_size
    elapsed = 0.0
    for start in range(0, count, batch):
        end = min(count, start + batch)
        # ids drawn in chunks per channel, as ingest files records
        records = make_records(layer, [first_key + i for i in range(start, end)], key=lambda k: k)
        payload = pack_payload(value)
        records = [dataclasses.replace(r, payload=payload) for r in records]
        t0 = time.perf_counter()
        added = layer.persist(records)
        elapsed += time.perf_counter() - t0
        if added != len(records):
            msg = f"scaling bench: persist stored {added} of {len(records)} new records"
            raise ScalingBenchError(msg)
        for i, rec in enumerate(records, start):
            rid = rec.record_id
            if replace:
                sids[i], cids[i] = rid.source_record_id, rid.current_record_id
            else:
                sids.append(rid.source_record_id)
                cids.append(rid.current_record_id)
        bar.update(advance=len(records), info=f"{info} {end:,}/{count:,}")
    return elapsed


def _memory(client: redis.Redis, layer: FTLayer, n: int, before: int, payload_len: int) -> dict[str, float]:
    """Memory figures at n pending records (see the module contract for the method)."""
    for ch in range(layer.num_channels):
        layer.trim_channel(ch)
    # The writer's connections still hold the last persist call's arguments in their
    # query buffers; they would be counted as per-record state.
    layer.disconnect()
    _purge(client)
    growth = _used_memory(client) - before
    key_bytes = 0
    for key in client.scan_iter(match=layer.keys.prefix + "*", count=1000):
        key_bytes += int(client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)  # type: ignore[no-untyped-call]
    return {
        "used_memory_bytes": growth,
        "used_memory_per_record": growth / n,
        "key_bytes": key_bytes,
        "bytes_per_pending_record": key_bytes / n,
        "bytes_per_record_beyond_payload": key_bytes / n - payload_len,
    }


def _acker_sample(layer: FTLayer, ids: Ids, sample: int, bar: TaskProgress, n: int) -> float:
    """Seconds for 2*sample XOR updates on records 0..sample-1 while n are pending."""
    sids, cids = ids
    batch = layer.config.flush_batch_size
    children = [child_id(cids[i], _OPERATOR, 0) for i in range(sample)]
    elapsed = 0.0
    completed = 0
    # all anchors first, then all acks: the table stays at n pending during the first pass
    for phase in ("anchor", "ack"):
        for start in range(0, sample, batch):
            end = min(sample, start + batch)
            if phase == "anchor":
                deltas = {sids[i]: cids[i] ^ children[i] for i in range(start, end)}
            else:
                deltas = {sids[i]: children[i] for i in range(start, end)}
            t0 = time.perf_counter()
            result = layer.xor(deltas, token=f"scale-{phase}-{start}")
            elapsed += time.perf_counter() - t0
            if phase == "anchor" and result.acked:
                msg = f"scaling bench: {len(result.acked)} records completed on a non-completing XOR"
                raise ScalingBenchError(msg)
            completed += len(result.acked)
            bar.update(advance=end - start, info=f"N={n:,}: acker {phase} {end:,}/{sample:,}")
    if completed != sample:
        msg = f"scaling bench: {completed} of {sample} sampled records completed"
        raise ScalingBenchError(msg)
    return elapsed


def _drain(layer: FTLayer, ids: Ids, bar: TaskProgress, n: int) -> float:
    """Seconds to ack every record in ``ids`` (completing XORs) in flush_batch_size chunks."""
    sids, cids = ids
    batch = layer.config.flush_batch_size
    elapsed = 0.0
    completed = 0
    for start in range(0, len(sids), batch):
        end = min(len(sids), start + batch)
        acks = {sids[i]: cids[i] for i in range(start, end)}
        t0 = time.perf_counter()
        result = layer.ack(acks, token=f"scale-drain-{start}")
        elapsed += time.perf_counter() - t0
        completed += len(result.acked)
        bar.update(advance=end - start, info=f"N={n:,}: drain {end:,}/{n:,}")
    if completed != len(sids):
        msg = f"scaling bench: drain completed {completed} of {len(sids)} records"
        raise ScalingBenchError(msg)
    return elapsed


def _used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _purge(client: redis.Redis) -> None:
    client.execute_command("MEMORY", "PURGE")  # type: ignore[no-untyped-call]


def delete_namespace(client: redis.Redis, namespace: str) -> int:
    """Delete every key under ``<namespace>:``; returns how many were deleted."""
    keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
    for i in range(0, len(keys), 500):
        client.delete(*keys[i : i + 500])
    return len(keys)


def main(argv: list[str] | None = None) -> int:
    """CLI: run the scaling bench, print the JSON, write it and the PNG plots into ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m runtime.bench.scaling", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="pending levels")
    parser.add_argument("--payload-bytes", type=int, default=32, help="msgpack payload size per record")
    parser.add_argument("--sample", type=int, default=20_000, help="records per acker sample")
    parser.add_argument("--out", type=Path, default=None, help="directory for scaling.json and the PNG plots")
    args = parser.parse_args(argv)
    from ftlayer.servers.embedded import EmbeddedServer

    url = os.environ.get("FTLAYER_REDIS_URL", "")
    server = None if url else EmbeddedServer().start()
    try:
        result = bench_scaling(url or (server.url if server else ""), args.sizes,
                               payload_bytes=args.payload_bytes, sample=args.sample)
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(result, indent=2))
    if args.out is not None:
        from runtime.bench.plot import plot_scaling

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "scaling.json").write_text(json.dumps(result, indent=2) + "\n")
        for path in plot_scaling(result, args.out):
            print(f"[scaling] wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
