"""No script holds the server long, whatever the backlog (issue 13, item 7), on a real server.

A backlog is built with raw PERSIST calls of 20,000 records (the default
``flush_batch_size``: one bucket blob and one big stream entry per call), as
older clients wrote it, so the scans below must split blobs and entries.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis

from ftlayer.acker.persistence import PERSIST, call_groups, persist_token
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.service import FTService
from ftlayer.records.chunks import (
    CHUNK_MAX_BYTES,
    CHUNK_TARGET_RECORDS,
    PackedChunk,
    assign_sids,
    chunk_key,
    pack_chunks,
)
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.records.ids import RecordId
from ftlayer.scripting.script_bounds import CALL_MAX_CHUNKS, SCRIPT_MAX_BYTES
from ftlayer.servers.embedded import EmbeddedServer
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, commit_all, hand_out
from tests.ftlayer.script_latency import PingProbe, ScriptTimes, latency_events, prioritised_server
from tests.machine_lock import Alone

_SER = SemiDeserializedSerializer()
BIG = 200_000
PING_LIMIT_MS = 100.0


def persist_raw(layer: FTLayer, n: int, *, per_call: int = 20_000, channel: int | None = None,
                value: object = None, num_channels: int = 4) -> list[int]:
    """Persist ``n`` records in raw PERSIST calls of ``per_call`` records (chunks of up to
    CHUNK_TARGET_RECORDS per channel, as ingest draws them); returns their sids in order.

    ``channel`` None spreads the records round robin over ``num_channels``.
    """
    sids: list[int] = []
    for lo in range(0, n, per_call):
        recs = _rechunk([
            make_record(layer, i if value is None else value, channel=i % num_channels if channel is None else channel)
            for i in range(lo, min(n, lo + per_call))
        ])
        blob = b"".join(c.blob for c in pack_chunks([_SER.encode(r) for r in recs]))
        args = [layer.store.keys.prefix, num_channels, blob, 60_000]
        token = persist_token(layer.store, blob)
        keys = [*layer.store.state_keys, token, *layer.store.channel_keys(num_channels)]
        count, _ = layer.store.run(PERSIST, keys, args)
        assert int(count) == len(recs)
        sids.extend(r.record_id.source_record_id for r in recs)
    return sids


def _rechunk(recs: list[SemiDeserializedRecord]) -> list[SemiDeserializedRecord]:
    """The same records under ids drawn in chunks per channel (batch order kept)."""
    sids = assign_sids([r.channel or 0 for r in recs], [48 + len(r.payload) for r in recs])
    return [dataclasses.replace(r, record_id=RecordId(sid, r.record_id.current_record_id), origin_id=sid)
            for r, sid in zip(recs, sids, strict=True)]


@pytest.fixture
def quiet_server() -> Iterator[EmbeddedServer]:
    server = prioritised_server()
    yield server
    server.stop()


@pytest.mark.slow
def test_200k_records_timing_out_at_once_never_block_the_server(
    ft_config: FTConfig, clock: FakeClock, quiet_server: EmbeddedServer, alone: Alone
) -> None:
    client = redis.Redis.from_url(quiet_server.url)
    cfg = ft_config.replace(redis_url=quiet_server.url, num_buckets=2, timeout_s=10.0)
    layer = FTLayer(cfg, "topo", "src", num_channels=4, clock=clock).open()
    expired: list[int] = []
    layer.buckets.on_expired = expired.extend
    service = FTService([layer], clock=clock)
    service.tick()  # lease, first rotation scheduled
    sids = persist_raw(layer, BIG)
    assert hand_out(layer) == BIG  # read (in bounded calls), as tasks would: only records read time out
    clock.advance(service.interval_s)
    service.tick()  # rotation 1: nothing expires yet
    assert expired == []
    with alone():  # timed: the machine to this section only (tests/machine_lock.py)
        times = ScriptTimes(client).start()
        try:
            clock.advance(service.interval_s)
            with PingProbe(quiet_server.url) as probe:
                service.tick()  # rotation 2: all 200k expire, then the tick replays a batch of them
            slow = times.max_ms()
        finally:
            times.stop()
    print(f"\n200k timeouts: {len(probe.samples_ms)} PINGs, max {probe.max_ms:.1f} ms; "
          f"slowest script calls (ms): {slow}; latency monitor (ms): {latency_events(client)}")
    counts = Counter(expired)
    assert len(expired) == BIG and set(counts) == set(sids) and max(counts.values()) == 1
    assert layer.stats()["failed_timeout"] == BIG
    assert len(probe.samples_ms) >= 10
    assert probe.max_ms < PING_LIMIT_MS, sorted(probe.samples_ms)[-10:]
    assert max(slow.values(), default=0.0) < PING_LIMIT_MS, slow


@pytest.mark.slow
def test_expiry_chunks_skip_nothing_when_records_complete_between_chunks(
    make_layer: Callable[..., FTLayer]
) -> None:
    """Tiny chunks, and acks landing between them: each pending record fails once, acked ones never."""
    layer = make_layer(num_buckets=2)
    sids = persist_raw(layer, 3_000, per_call=1_000)
    hand_out(layer)
    layer.buckets.scan_max_records = 7
    acked: set[int] = set()
    expired: list[int] = []

    def ack_some(ids: list[int]) -> None:
        expired.extend(ids)
        # ack a few records the scan has not reached yet (they complete between two chunks)
        ahead = [s for s in sids if s not in acked and s not in set(expired)][:3]
        for sid in ahead:
            cur = layer.acker.value(sid)
            assert cur is not None
            layer.ack({sid: cur})
            acked.add(sid)

    layer.buckets.on_expired = ack_some
    layer.on_timeout()
    layer.on_timeout()
    assert Counter(expired).most_common(1)[0][1] == 1
    assert set(expired) | acked == set(sids) and not set(expired) & acked
    commit_all(layer)
    assert layer.pending_count() == 0 and layer.leftovers() == ["due", "failed"]


def test_channel_reads_are_chunked_by_records_and_resume_inside_an_entry(layer: FTLayer) -> None:
    sids = persist_raw(layer, 5_000, per_call=2_500, channel=1)  # two entries of 2,500 ids
    done = set(sids[10:4_000:3])
    layer.fail(done, "done")  # no longer pending: skipped by the reads
    batches = list(layer.persistence.iter_channel(1, max_records=333))
    read = [sid for b in batches for sid in b.sids]
    assert read == [s for s in sids if s not in done]
    assert [_SER.decode(f).record_id.source_record_id for b in batches for f in b.frames] == read
    # a call reads whole chunks (each of up to CHUNK_TARGET_RECORDS): one chunk per call here
    chunks = len({chunk_key(s) for s in sids})
    assert chunks == 2 * -(-2_500 // CHUNK_TARGET_RECORDS)
    assert len(batches) >= chunks and max(len(b.chunks) for b in batches) == 1
    assert any(b.skip for b in batches)  # some calls stopped inside an entry


def test_channel_reads_are_chunked_by_bytes(layer: FTLayer) -> None:
    payload = "x" * 100_000
    sids = persist_raw(layer, 120, per_call=120, channel=2, value=payload)  # one 12 MB entry
    batches = list(layer.persistence.iter_channel(2))
    read = [_SER.decode(f).record_id.source_record_id for b in batches for f in b.frames]
    assert read == sids
    sizes = [sum(len(f) for f in b.frames) for b in batches]
    # whole chunks (of at most CHUNK_MAX_BYTES, or one larger frame) per call
    assert len(batches) >= 3 and max(sizes) < SCRIPT_MAX_BYTES + CHUNK_MAX_BYTES + 110_000, sizes


@pytest.mark.slow
def test_trim_done_is_bounded_and_still_trims_everything(
    layer: FTLayer, redis_client: redis.Redis, alone: Alone
) -> None:
    persist_raw(layer, BIG)
    k = layer.store.keys
    redis_client.delete(k.chunks, k.chunk_acks, k.chunk_frames)  # every record done (completed or failed)
    with alone():  # timed (tests/machine_lock.py)
        times = ScriptTimes(redis_client).start()
        try:
            removed = layer.persistence.trim_done()
            slow = times.max_ms()
        finally:
            times.stop()
    print(f"\ntrim_done of {BIG} done records: slowest script calls (ms): {slow}")
    assert removed == 40  # 10 persist calls x 4 channels
    assert all(redis_client.xlen(layer.store.keys.channel(c)) == 0 for c in range(4))
    assert slow.get("TRIM_DONE", 0.0) < PING_LIMIT_MS, slow


@pytest.mark.slow
def test_persist_is_split_into_bounded_calls(layer: FTLayer, redis_client: redis.Redis, alone: Alone) -> None:
    recs = [make_record(layer, i) for i in range(BIG // 4)]  # one persist() of 50k: many calls
    with alone():  # timed (tests/machine_lock.py)
        times = ScriptTimes(redis_client).start()
        try:
            assert layer.persist(recs) == len(recs)
            slow = times.max_ms()
        finally:
            times.stop()
    print(f"\npersist of {len(recs)}: slowest script calls (ms): {slow}")
    assert layer.pending_count() == len(recs)
    assert slow.get("PERSIST", 0.0) < PING_LIMIT_MS, slow


def test_persist_calls_keep_order_and_bounds() -> None:
    """persist's split of whole chunks into calls (``call_groups``): in order, each chunk in one
    call, at most max_records records, max_bytes bytes and CALL_MAX_CHUNKS chunks a call (a chunk
    larger than a bound goes alone), and the same calls again for the same chunks."""
    sizes = [(1, 1), (2, 5), (1, 3), (4, 10), (1, 2), (1, 2), (2, 2), (1, 30), (1, 1)]  # (records, bytes)
    chunks = [PackedChunk(bytes(6), b"a" * size, tuple(range(n))) for n, size in sizes]
    calls = call_groups(chunks, max_records=3, max_bytes=8)
    assert [i for start, end in calls for i in range(start, end)] == list(range(len(chunks)))
    for start, end in calls:
        group = chunks[start:end]
        assert end - start == 1 or (sum(c.records for c in group) <= 3 and sum(len(c.blob) for c in group) <= 8)
    assert call_groups(chunks, max_records=3, max_bytes=8) == calls
    assert call_groups([], max_records=3) == []
    ones = [PackedChunk(bytes(6), b"a", (0,))] * (CALL_MAX_CHUNKS + 1)
    n = CALL_MAX_CHUNKS
    assert call_groups(ones, max_records=10 * n) == [(0, n), (n, n + 1)]


def test_a_large_flush_is_split_into_bounded_calls(make_layer: Callable[..., FTLayer]) -> None:
    """20k deltas in one xor(): several FLUSH calls of at most FLUSH_MAX_RECORDS, every record acked."""
    from ftlayer.scripting.script_bounds import FLUSH_MAX_RECORDS

    layer = make_layer()
    recs = [make_record(layer, i) for i in range(20_000)]
    layer.persist(recs)
    client = layer.store.client
    before = client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    result = layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in recs}, token="big")
    calls = client.info("commandstats")["cmdstat_evalsha"]["calls"] - before
    assert len(result.acked) == 20_000 and layer.pending_count() == 0
    assert calls >= 20_000 // FLUSH_MAX_RECORDS, calls
