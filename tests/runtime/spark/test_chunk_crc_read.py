"""The FT source's read with one CRC per chunk (ftlayer.records.chunk_crc): a damaged byte anywhere in a
chunk's frames is still found and its record dead-lettered, and chunks without the CRC (written by
older code) still read. The property over the codec runs without a server; the rest reads from a
real one through the FT source's reader (no Spark job)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftlayer.acker.persistence import ChannelBatch
from ftlayer.config import FTConfig
from ftlayer.errors import FrameError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.chunk_crc import CHUNK_CRC_BYTES
from ftlayer.records.chunk_encoding import encode_chunks_arrays, encode_chunks_plain
from ftlayer.records.chunks import (
    CHUNK_IN_HEADER,
    STATE_HEADER,
    PackedChunk,
    bitmap_bytes,
    chunk_key,
    frame_spans,
    index_of,
)
from ftlayer.records.frames import SemiDeserializedSerializer
from ftlayer.records.keyhash import key_hash, pmod
from runtime.spark.arrow_codec import spans_to_record_batch
from runtime.spark.ft_data_sources import FTSource
from runtime.spark.ft_source import FTStreamReader, source_schema
from serialization.payload import pack_payload, unpack_payload

TOPO, SRC, CHANNELS = "topo", "crc", 2
_SER = SemiDeserializedSerializer()


def stored(chunk: PackedChunk) -> tuple[bytes, int]:
    """The chunk's frames value as PERSIST stores it, and its record count."""
    _, n, _, _, flen = CHUNK_IN_HEADER.unpack_from(chunk.blob)
    return chunk.blob[len(chunk.blob) - flen :], n


def expected_rows(chunks: list[tuple[bytes, bytes, bytes]]) -> list[dict[str, Any]]:
    """The pending records of sound chunks, decoded one by one by the serializer (the reference)."""
    out = []
    for sid, frame in zip(*ChannelBatch(0, "1-0", chunks).pending(), strict=True):
        rec = _SER.decode(frame)
        assert rec.record_id.source_record_id == sid
        out.append({"sid": sid, "cid": rec.record_id.current_record_id, "key_hash": rec.key_hash,
                    "origin": rec.origin_id, "replay": rec.replay_count, "channel": rec.channel,
                    "payload": rec.payload})
    return out


def read(chunks: list[tuple[bytes, bytes, bytes]]) -> tuple[list[dict[str, Any]], list[bool]]:
    """The read step of the FT source: spans (with the chunk CRCs checked), then the Arrow batch."""
    spans = ChannelBatch(0, "1-0", chunks).spans()
    blob, starts, lengths, vouched = spans.blob, spans.starts, spans.lengths, spans.vouched
    return spans_to_record_batch(blob, starts, lengths, vouched).to_pylist(), vouched.tolist()


@st.composite
def damaged_reads(draw: st.DrawFn) -> tuple[list[tuple[bytes, bytes, bytes]], int, int, int, bool]:
    """Chunks as ingest writes them (payloads short and long, so both CRC paths of the codec run),
    some records settled, all or none stripped of their chunk CRC (chunks of older code), and
    one byte of one chunk's frames to damage: ``(chunks, which chunk, byte, xor mask, stripped)``."""
    payloads = draw(st.lists(st.binary(max_size=100), min_size=1, max_size=60))
    channels = draw(st.lists(st.integers(0, 2), min_size=len(payloads), max_size=len(payloads)))
    encode = encode_chunks_arrays if draw(st.booleans()) else encode_chunks_plain
    strip = draw(st.booleans())
    chunks = []
    for chunk in encode(1, payloads, list(range(len(payloads))), channels):
        frames, n = stored(chunk)
        if strip:
            frames = frames[:-CHUNK_CRC_BYTES]
        settled = bytes(draw(st.lists(st.integers(0, 255), min_size=bitmap_bytes(n), max_size=bitmap_bytes(n))))
        settled = bytes(b & draw(st.sampled_from([0, 0, 0x55, 0xFF])) for b in settled)  # mostly pending
        chunks.append((chunk.key, STATE_HEADER.pack(1, 1, 0, n, n, 0, 0) + settled, frames))
    which = draw(st.integers(0, len(chunks) - 1))
    at = draw(st.integers(0, len(chunks[which][2]) - 1))
    return chunks, which, at, draw(st.integers(1, 255)), strip


def _in_pending_frame(chunk: tuple[bytes, bytes, bytes], at: int) -> bool:
    _key, state, frames = chunk
    n = STATE_HEADER.unpack_from(state)[3]
    settled = state[STATE_HEADER.size :]
    return any(a <= at < b for i, (a, b) in enumerate(frame_spans(frames, n)) if not settled[i >> 3] >> (i & 7) & 1)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_reads())
def test_a_damaged_byte_anywhere_in_a_chunk_is_found_or_harmless(
        case: tuple[list[tuple[bytes, bytes, bytes]], int, int, int, bool]) -> None:
    chunks, which, at, mask, stripped = case
    want = expected_rows(chunks)
    rows, vouched = read(chunks)
    assert rows == want
    assert vouched == [not stripped] * len(want)  # one CRC per chunk, unless it has none
    key, state, frames = chunks[which]
    bad = bytearray(frames)
    bad[at] ^= mask
    damaged = [*chunks[:which], (key, state, bytes(bad)), *chunks[which + 1 :]]
    if _in_pending_frame(chunks[which], at):  # a record the read hands on: its frame's checks must catch it
        with pytest.raises(FrameError):
            read(damaged)
        return
    try:  # a settled record's bytes, a hole or the CRC itself: the records read are still exactly right
        got, _ = read(damaged)
    except FrameError:
        return  # a length prefix changed: later frames moved, and their checks refuse them
    assert got == want


# --- on a real server, through the FT source's reader -------------------------------------------------


@pytest.fixture
def layer(ft_config: FTConfig, redis_client: redis.Redis) -> FTLayer:
    # redis_client is requested for its clean-up of the test's namespace
    return FTLayer(ft_config, TOPO, SRC, num_channels=CHANNELS).open()


def ingest(layer: FTLayer, n: int, pad: int) -> dict[int, int]:
    """n records filed as ingest files them (FTLayer.new_chunks: chunks with their CRC); {sid: i}."""
    keys = [f"k{i}" for i in range(n)]
    hashes = [key_hash(k) for k in keys]
    chunks = layer.new_chunks([pack_payload({"i": i, "s": "p" * pad}) for i in range(n)], hashes,
                              [pmod(h, CHANNELS) for h in hashes])
    assert layer.persist_chunks(chunks) == n
    return {sid: int(unpack_payload(_SER.decode(f).payload)["i"]) for sid, f in layer.persistence.iter_pending()}


def read_all(ft_config: FTConfig) -> list[dict[str, Any]]:
    options = {"redis_url": ft_config.redis_url, "namespace": ft_config.namespace, "topology": TOPO,
               "source": SRC, "num_channels": str(CHANNELS)}
    reader = FTSource(options).streamReader(source_schema())
    assert isinstance(reader, FTStreamReader)
    start = reader.initialOffset()
    end = reader.latestOffset(start, reader.getDefaultReadLimit())
    return [row for p in reader.partitions(start, end) for batch in reader.read(p) for row in batch.to_pylist()]


def rewrite(client: redis.Redis, layer: FTLayer, sid: int, change: Callable[[bytes, int, int], bytes]) -> None:
    """Replace the stored frames of ``sid``'s chunk by ``change(frames, start, end)`` (its frame's span)."""
    key = chunk_key(sid)
    raw = client.hget(layer.store.keys.chunk_frames, key)
    assert isinstance(raw, bytes)
    start, end = frame_spans(raw, index_of(sid) + 1)[index_of(sid)]
    client.hset(layer.store.keys.chunk_frames, key, change(raw, start, end))


def flip(at: int) -> Callable[[bytes, int, int], bytes]:
    """Flip a byte ``at`` bytes into the record's frame (negative: from its end)."""
    def change(raw: bytes, start: int, end: int) -> bytes:
        pos = start + at if at >= 0 else end + at
        return raw[:pos] + bytes([raw[pos] ^ 0x24]) + raw[pos + 1 :]
    return change


def strip_chunk_crcs(client: redis.Redis, layer: FTLayer) -> int:
    """Every chunk's frames without its CRC, as older code stored them; returns chunks changed."""
    k = layer.store.keys
    changed = 0
    for key, frames in client.hscan_iter(k.chunk_frames):
        n = STATE_HEADER.unpack_from(client.hget(k.chunks, key) or b"", 0)[3]
        end = frame_spans(frames, n)[-1][1]
        assert len(frames) == end + CHUNK_CRC_BYTES
        client.hset(k.chunk_frames, key, frames[:end])
        changed += 1
    return changed


@pytest.mark.parametrize("old_format", [False, True])
@pytest.mark.parametrize(("where", "at"), [("payload, last byte", -1), ("payload, first byte", 48),
                                           ("header, key hash", 27), ("header, frame CRC", 45)])
def test_a_damaged_stored_frame_is_dead_lettered_alone(layer: FTLayer, ft_config: FTConfig,
                                                       redis_client: redis.Redis, where: str, at: int,
                                                       old_format: bool) -> None:
    expected = ingest(layer, 300, pad=30)  # 300 records in two chunks, one per channel
    if old_format:
        assert strip_chunk_crcs(redis_client, layer) == 2
    bad = sorted(expected)[7]
    rewrite(redis_client, layer, bad, flip(at))
    rows = read_all(ft_config)
    assert sorted(r["sid"] for r in rows) == sorted(set(expected) - {bad}), where
    assert all(unpack_payload(r["payload"])["i"] == expected[r["sid"]] for r in rows)
    assert layer.replay_due().dead_lettered == 1  # failed without replays by the read
    (letter,) = layer.dead_letters.list()
    assert letter.source_record_id == bad and letter.record is None
    assert "unreadable frame" in letter.reason and "checksum mismatch" in letter.reason
    assert layer.pending_count() == len(expected) - 1


def test_a_damaged_chunk_crc_costs_nothing_but_the_fallback(layer: FTLayer, ft_config: FTConfig,
                                                             redis_client: redis.Redis) -> None:
    expected = ingest(layer, 200, pad=80)
    k = layer.store.keys
    for key, frames in list(redis_client.hscan_iter(k.chunk_frames)):  # a bit of every chunk's CRC
        redis_client.hset(k.chunk_frames, key, frames[:-1] + bytes([frames[-1] ^ 1]))
    rows = read_all(ft_config)
    assert {r["sid"]: unpack_payload(r["payload"])["i"] for r in rows} == expected
    assert layer.replay_due().dead_lettered == 0 and layer.dead_letters.list() == []


def test_chunks_without_their_crc_read_as_those_with_it(layer: FTLayer, ft_config: FTConfig,
                                                         redis_client: redis.Redis) -> None:
    expected = ingest(layer, 500, pad=5)
    sealed = read_all(ft_config)
    assert all(layer.persistence.read_channel(c).spans().vouched.all() for c in range(CHANNELS))  # one CRC a chunk
    assert strip_chunk_crcs(redis_client, layer) == 2
    assert not any(layer.persistence.read_channel(c).spans().vouched.any() for c in range(CHANNELS))
    old = read_all(ft_config)
    assert sorted(old, key=lambda r: r["sid"]) == sorted(sealed, key=lambda r: r["sid"])
    assert {r["sid"]: unpack_payload(r["payload"])["i"] for r in old} == expected
    # and they settle as before: ack every record, nothing is left
    assert sorted(layer.ack({r["sid"]: r["cid"] for r in old}).acked) == sorted(expected)
    assert layer.pending_count() == 0
    assert redis_client.hlen(layer.store.keys.chunk_frames) == 0  # every chunk deleted with its last record


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_payload_column_holds_each_span_of_the_buffer(data: st.DataObject) -> None:
    """_payload_column (binary views cast to binary) against slicing: values inline (<= 12 bytes) and
    not, empty ones, and short ones that end the buffer (their 12-byte window would run past it)."""
    import numpy as np
    import pyarrow as pa

    from runtime.spark.arrow_codec import _payload_column, payload_views

    blob = data.draw(st.binary(min_size=1, max_size=300))
    spans = data.draw(st.lists(st.integers(0, len(blob)).flatmap(
        lambda a: st.tuples(st.just(a), st.integers(0, len(blob) - a))), max_size=40))
    if data.draw(st.booleans()):
        spans.append((len(blob) - min(3, len(blob)), min(3, len(blob))))  # the last bytes of the buffer
    starts = np.asarray([a for a, _ in spans], dtype=np.int64)
    sizes = np.asarray([k for _, k in spans], dtype=np.int64)
    column = _payload_column(blob, starts, sizes, pa.binary())
    assert column.type == pa.binary()
    column.validate(full=True)
    assert column.to_pylist() == [blob[a : a + k] for a, k in spans]
    views = payload_views(blob, starts, sizes)  # the Arrow format's layout, field by field
    raw = views.tobytes()
    for (a, k), view in zip(spans, [raw[i : i + 16] for i in range(0, 16 * len(spans), 16)], strict=True):
        assert int.from_bytes(view[:4], "little") == k
        if k <= 12:
            assert view[4:] == blob[a : a + k] + bytes(12 - k)
        else:
            assert view[4:8] == blob[a : a + 4] and view[8:12] == bytes(4)
            assert int.from_bytes(view[12:], "little") == a
