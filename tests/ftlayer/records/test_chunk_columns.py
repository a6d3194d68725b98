"""Columnar chunks (ftlayer.records.chunk_columns): each chunk's section holds its own records' values,
in index order, after a trailer that still vouches; damage costs the section, never the frames."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.records.chunk_columns import attach_columns, columns_section, read_columns, schema_fingerprint
from ftlayer.records.chunk_crc import COLUMNS_FOOTER, section_edges, split_trailer, vouches
from ftlayer.records.chunk_encoding import encode_source_chunks
from ftlayer.records.chunks import frame_spans, pending_spans, rekey_chunk
from ftlayer.records.frames import SemiDeserializedSerializer
from ftlayer.records.span_arrays import chunk_span_arrays
from serialization.payload import pack_payload, unpack_payload
from tests.ftlayer.records.test_chunk_crc import all_pending, entries_end, stored_frames

_SER = SemiDeserializedSerializer()
SCHEMA = pa.schema([pa.field("i", pa.int64()), pa.field("name", pa.string())])


def _batch(values: list[int]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"i": values, "name": [f"n{v}" for v in values]}, schema=SCHEMA)


def _columnar(channels: list[int]) -> tuple[list[bytes], list]:
    payloads = [pack_payload({"i": i, "name": f"n{i}"}) for i in range(len(channels))]
    chunks = encode_source_chunks(3, payloads, list(range(len(channels))), channels)
    return payloads, attach_columns(chunks, channels, _batch(list(range(len(channels)))), list(map(len, payloads)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=300))
def test_each_chunk_holds_the_values_of_its_own_frames_in_index_order(channels: list[int]) -> None:
    # both encoders (the plain one up to 75 records, the array one above) chunk by channel in batch order
    _, chunks = _columnar(channels)
    assert sum(c.records for c in chunks) == len(channels)
    for chunk in chunks:
        frames = stored_frames(chunk)
        end = entries_end(frames, chunk.records)
        vouched, section = split_trailer(frames, end)
        assert vouched and section is not None
        fingerprint, body = section
        assert fingerprint == schema_fingerprint(SCHEMA)
        got = read_columns(body, SCHEMA, chunk.records)
        assert got is not None
        # the section's edges are the walk's, so the read need not walk
        found = section_edges(frames, chunk.records)
        assert found is not None
        walked = frame_spans(frames, chunk.records)
        assert found[0].tolist() == [0, *[hi for _, hi in walked]]
        assert found[1][0] == fingerprint and bytes(found[1][1]) == bytes(body)
        in_frames = [unpack_payload(_SER.decode(frames[lo:hi]).payload)["i"]
                     for lo, hi in frame_spans(frames, chunk.records)]
        assert got.column("i").to_pylist() == in_frames
        assert got.column("name").to_pylist() == [f"n{i}" for i in in_frames]


def test_a_chunk_without_columns_reads_as_before() -> None:
    payloads = [pack_payload({"i": i}) for i in range(10)]
    chunk = encode_source_chunks(3, payloads, list(range(10)), [0] * 10)[0]
    frames = stored_frames(chunk)
    end = entries_end(frames, 10)
    assert split_trailer(frames, end) == (True, None)
    assert vouches(frames, end)
    assert section_edges(frames, 10) is None


def test_older_code_sees_a_columnar_chunk_as_unvouched_and_checks_each_frame() -> None:
    _, chunks = _columnar([0] * 10)
    frames = stored_frames(chunks[0])
    assert not vouches(frames, entries_end(frames, 10))


def test_a_damaged_section_costs_the_columns_not_the_frames() -> None:
    _, chunks = _columnar([0] * 20)
    frames = bytearray(stored_frames(chunks[0]))
    end = entries_end(bytes(frames), 20)
    frames[end + 4 + 10] ^= 0x40  # a byte of the section's body
    assert split_trailer(bytes(frames), end) == (True, None)
    assert section_edges(bytes(frames), 20) is None  # the read walks instead


def test_a_section_whose_edges_disagree_with_the_trailer_is_not_used_for_edges() -> None:
    _, chunks = _columnar([0] * 8)
    frames = stored_frames(chunks[0])
    assert section_edges(frames, 8) is not None
    assert section_edges(frames, 7) is None  # another record count: the edges do not add up


def test_edges_that_disagree_with_the_length_prefixes_are_not_used() -> None:
    """Edges whose CRC is sound but which do not land on the entries (a writer that got the payload sizes
    wrong): the reader walks, so every frame keeps its own span and stays readable."""
    values = [{"i": i, "name": "x" * (10 * (i % 3))} for i in range(6)]
    payloads = [pack_payload(v) for v in values]
    chunk = encode_source_chunks(3, payloads, list(range(6)), [0] * 6)[0]
    sizes = list(map(len, payloads))
    sizes[0], sizes[1] = sizes[1], sizes[0]  # the same total, other boundaries
    frames = stored_frames(attach_columns([chunk], [0] * 6, pa.RecordBatch.from_pylist(values, schema=SCHEMA),
                                          sizes)[0])
    assert section_edges(frames, 6) is None
    spans = chunk_span_arrays(chunk.key, all_pending(6), frames)
    assert list(zip(spans.sids.tolist(), spans.starts.tolist(), spans.ends.tolist(), strict=True)) == list(
        pending_spans(chunk.key, all_pending(6), frames))
    assert [unpack_payload(_SER.decode(frames[a:b]).payload) for a, b in frame_spans(frames, 6)] == values


def test_a_chunk_whose_columns_would_dwarf_its_frames_keeps_none() -> None:
    """Arrays of small ints: 1 byte each in msgpack, 8 in Arrow. Such a chunk is filed as it is (its
    trailer vouches, no section: read from its payloads); one of small scalar records keeps its columns."""
    wide = pa.schema([pa.field("l", pa.list_(pa.int64()))])
    values = [{"l": [k % 100] * 200} for k in range(30)]
    payloads = [pack_payload(v) for v in values]
    chunk = encode_source_chunks(3, payloads, list(range(30)), [0] * 30)[0]
    kept = attach_columns([chunk], [0] * 30, pa.RecordBatch.from_pylist(values, schema=wide), list(map(len, payloads)))
    assert kept[0].blob == chunk.blob
    frames = stored_frames(kept[0])
    assert vouches(frames, entries_end(frames, 30)) and section_edges(frames, 30) is None
    _, small = _columnar([0] * 30)
    assert split_trailer(stored_frames(small[0]), entries_end(stored_frames(small[0]), 30))[1] is not None


@pytest.mark.parametrize("where", ["entry", "magic", "length"])
def test_damage_outside_the_body_unvouches_the_chunk(where: str) -> None:
    _, chunks = _columnar([0] * 20)
    frames = bytearray(stored_frames(chunks[0]))
    end = entries_end(bytes(frames), 20)
    at = {"entry": 60, "magic": len(frames) - 1, "length": len(frames) - 9}[where]
    frames[at] ^= 0x01
    vouched, section = split_trailer(bytes(frames), end)
    assert not vouched
    assert section is None
    assert section_edges(bytes(frames), 20) is None


def test_a_value_too_short_for_a_footer_is_not_vouched() -> None:
    _, chunks = _columnar([0] * 5)
    frames = stored_frames(chunks[0])
    end = entries_end(frames, 5)
    assert split_trailer(frames[: end + 4 + COLUMNS_FOOTER.size - 1], end) == (False, None)


def test_a_rekeyed_chunk_keeps_its_section_and_its_vouching() -> None:
    _, chunks = _columnar([1] * 12)
    again = rekey_chunk(chunks[0])
    assert again.key != chunks[0].key
    frames = stored_frames(again)
    vouched, section = split_trailer(frames, entries_end(frames, 12))
    assert vouched and section is not None
    assert read_columns(section[1], SCHEMA, 12).column("i").to_pylist() == list(range(12))


def test_a_section_read_with_another_row_count_or_garbage_is_refused() -> None:
    section = columns_section(_batch([1, 2, 3]), [0, 50, 100, 150], schema_fingerprint(SCHEMA))
    body = section[: -COLUMNS_FOOTER.size - 16]
    assert read_columns(body, SCHEMA, 3) is not None
    assert read_columns(body, SCHEMA, 4) is None
    assert read_columns(b"\x00" * 40, SCHEMA, 3) is None


def test_fingerprints_tell_schemas_apart() -> None:
    other = pa.schema([pa.field("i", pa.int32()), pa.field("name", pa.string())])
    not_null = pa.schema([pa.field("i", pa.int64(), nullable=False), pa.field("name", pa.string())])
    prints = {schema_fingerprint(s) for s in (SCHEMA, other, not_null)}
    assert len(prints) == 3
    assert schema_fingerprint(pa.schema(list(SCHEMA))) == schema_fingerprint(SCHEMA)


def test_columns_that_do_not_match_the_batch_are_refused() -> None:
    payloads = [pack_payload({"i": i}) for i in range(4)]
    chunks = encode_source_chunks(3, payloads, list(range(4)), [0] * 4)
    with pytest.raises(ValueError, match="3 rows of columns and 4 payload sizes for a batch of 4 records"):
        attach_columns(chunks, [0] * 4, _batch([0, 1, 2]), list(map(len, payloads)))
