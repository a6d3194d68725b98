"""The chunk CRC (ftlayer.records.chunk_crc): who writes it, when it vouches, and that no walk sees it."""

from __future__ import annotations

import struct
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.records.chunk_crc import CHUNK_CRC_BYTES, trailer, vouches
from ftlayer.records.chunk_encoding import encode_chunks_arrays, encode_chunks_plain
from ftlayer.records.chunks import (
    CHUNK_IN_HEADER,
    STATE_HEADER,
    PackedChunk,
    bitmap_bytes,
    frame_spans,
    pack_chunks,
    pack_record_chunks,
    rekey_chunk,
)
from ftlayer.records.frames import SemiDeserializedSerializer, encode_source_frames
from ftlayer.records.span_arrays import checked_span_arrays, pending_span_arrays
from serialization.payload import pack_payload

_SER = SemiDeserializedSerializer()


def stored_frames(chunk: PackedChunk) -> bytes:
    """The chunk's frames value as PERSIST stores it (``cf``)."""
    _, n, _, _, flen = CHUNK_IN_HEADER.unpack_from(chunk.blob)
    start = CHUNK_IN_HEADER.size + bitmap_bytes(n) + 8 * n
    assert start + flen == len(chunk.blob)
    return chunk.blob[start:]


def all_pending(n: int) -> bytes:
    return STATE_HEADER.pack(1, 1, 0, n, n, 0, 0) + bytes(bitmap_bytes(n))


def entries_end(frames: bytes, n: int) -> int:
    return frame_spans(frames, n)[-1][1]


batches = st.lists(st.tuples(st.binary(max_size=90), st.integers(0, 3)), min_size=1, max_size=120)


@settings(max_examples=60, deadline=None)
@given(batches, st.booleans())
def test_ingest_ends_every_chunk_with_the_crc_of_its_entries(items: list[tuple[bytes, int]], arrays: bool) -> None:
    encode = encode_chunks_arrays if arrays else encode_chunks_plain
    chunks = encode(5, [p for p, _ in items], list(range(len(items))), [c for _, c in items])
    assert sum(c.records for c in chunks) == len(items)
    for chunk in chunks:
        frames = stored_frames(chunk)
        end = entries_end(frames, chunk.records)
        assert len(frames) == end + CHUNK_CRC_BYTES
        assert frames[end:] == struct.pack(">I", zlib.crc32(frames[:end])) == trailer(frames[:end])
        assert vouches(frames, end)
        # every walk sees the n entries only, and each frame still carries its own valid CRC
        sids, starts, ends = pending_span_arrays(chunk.key, all_pending(chunk.records), frames)
        assert sids.tolist() == list(chunk.sids)
        assert [_SER.decode(frames[a:b]).record_id.source_record_id for a, b in
                zip(starts.tolist(), ends.tolist(), strict=True)] == list(chunk.sids)
        assert checked_span_arrays(chunk.key, all_pending(chunk.records), frames)[3] is True


def test_replays_and_persist_records_seal_their_chunks_but_foreign_frames_do_not() -> None:
    sids = [(7 << 16) | i for i in range(3)]
    frames = encode_source_frames(1, [x for s in sids for x in (s, s + 99)], [1, 2, 3],
                                  [pack_payload(i) for i in range(3)], [0, 0, 0])
    (replayed,) = pack_record_chunks(frames, sids, [s + 99 for s in sids], [0, 0, 0])
    (own,) = pack_chunks(frames, crc=True)
    (foreign,) = pack_chunks(frames)
    assert stored_frames(replayed) == stored_frames(own) == b"".join(frames) + trailer(b"".join(frames))
    assert stored_frames(foreign) == b"".join(frames)  # as before: the reader checks each frame
    assert not vouches(stored_frames(foreign), len(b"".join(frames)))


def test_a_chunk_with_holes_is_sealed_over_its_holes_too() -> None:
    sid = 9 << 16
    frames = encode_source_frames(1, [sid | 2, 5, sid | 4, 6], [1, 2], [b"\x01", b"\x02"], [0, 0])
    (chunk,) = pack_chunks(frames, crc=True)
    stored = stored_frames(chunk)
    assert chunk.records == 2 and frame_spans(stored, 5)[0] == (0, 4)  # index 0 is a hole
    end = entries_end(stored, 5)
    assert vouches(stored, end) and len(stored) == end + 4


def test_vouching_needs_the_entries_to_end_exactly_before_a_matching_crc() -> None:
    entries = b"\x00\x00\x00\x02ab\x00\x00\x00\x00"
    sealed = entries + trailer(entries)
    assert vouches(sealed, len(entries))
    assert not vouches(entries, len(entries))  # no trailer: a chunk written before it
    assert not vouches(sealed + b"\x00", len(entries))  # bytes after the trailer
    assert not vouches(sealed, len(entries) - 1)  # the walk ended elsewhere
    for at in range(len(sealed)):  # any byte changed: entries or trailer
        damaged = bytearray(sealed)
        damaged[at] ^= 0x41
        assert not vouches(bytes(damaged), len(entries))


def test_rekeying_seals_the_new_frames_and_leaves_an_unsealed_chunk_unsealed() -> None:
    (chunk,) = encode_chunks_plain(3, [pack_payload(i) for i in range(4)], [1] * 4, [0] * 4)
    again = rekey_chunk(chunk)
    frames = stored_frames(again)
    end = entries_end(frames, 4)
    assert again.key != chunk.key and vouches(frames, end)
    old = stored_frames(chunk)
    assert frames[:end] != old[:end]  # new ids in every frame: the CRC was computed again
    (foreign,) = pack_chunks([old[a:b] for a, b in frame_spans(old, 4)])
    moved_chunk = rekey_chunk(foreign)
    moved = stored_frames(moved_chunk)
    assert len(moved) == entries_end(moved, 4)  # still no trailer
    assert [_SER.decode(moved[a:b]).record_id.source_record_id
            for a, b in frame_spans(moved, 4)] == list(moved_chunk.sids)
