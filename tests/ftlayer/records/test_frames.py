"""The 48-byte frame format, SemiDeserializedRecord and the serializer classes."""

from __future__ import annotations

import pickle
import struct
import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.errors import FailRecord, FrameError, KeyHashError, SerializationError, UnsupportedTypeError
from ftlayer.records.chunks import frame_spans
from ftlayer.records.ids import RecordId
from ftlayer.records.keyhash import key_hash
from serialization import (
    FRAME_VERSION,
    HEADER_SIZE,
    MAX_PAYLOAD_BYTES,
    NO_CHANNEL,
    OFFSET_CHANNEL,
    OFFSET_CRC,
    OFFSET_CURRENT_RECORD_ID,
    OFFSET_FLAGS,
    OFFSET_KEY_HASH,
    OFFSET_ORIGIN_ID,
    OFFSET_PAYLOAD,
    OFFSET_REPLAY_COUNT,
    OFFSET_SOURCE_ID,
    OFFSET_SOURCE_RECORD_ID,
    OFFSET_VERSION,
    AsRecordSerializer,
    AsSemiDeserializedSerializer,
    SemiDeserializedRecord,
    SemiDeserializedSerializer,
    pack_payload,
    unpack_payload,
)
from tests.ftlayer.conftest import chunk_records

SER = SemiDeserializedSerializer()
I64_MIN, I64_MAX = -(2**63), 2**63 - 1

ids = st.integers(I64_MIN, I64_MAX).filter(bool)
u16 = st.integers(0, 0xFFFF)
channels = st.none() | st.integers(0, NO_CHANNEL - 1)
records = st.builds(
    SemiDeserializedRecord,
    source_id=u16,
    record_id=st.builds(RecordId, ids, ids),
    key_hash=st.integers(I64_MIN, I64_MAX),
    origin_id=ids,
    replay_count=u16,
    payload=st.binary(max_size=300),
    channel=channels,
)


def make(**overrides: Any) -> SemiDeserializedRecord:
    fields: dict[str, Any] = {
        "source_id": 7,
        "record_id": RecordId(0x0102030405060708, -2),
        "key_hash": -(2**63),
        "origin_id": 2**63 - 1,
        "replay_count": 3,
        "payload": pack_payload({"v": 1}),
        "channel": 5,
    }
    fields.update(overrides)
    return SemiDeserializedRecord(**fields)


# --- the layout (Lua scripts depend on it) -------------------------------------------


def test_layout_constants() -> None:
    assert (HEADER_SIZE, FRAME_VERSION, NO_CHANNEL, MAX_PAYLOAD_BYTES) == (48, 1, 0xFFFF, 64 * 1024 * 1024)
    assert (OFFSET_VERSION, OFFSET_FLAGS, OFFSET_SOURCE_ID) == (4, 5, 6)
    assert (OFFSET_SOURCE_RECORD_ID, OFFSET_CURRENT_RECORD_ID, OFFSET_KEY_HASH, OFFSET_ORIGIN_ID) == (8, 16, 24, 32)
    assert (OFFSET_REPLAY_COUNT, OFFSET_CHANNEL, OFFSET_CRC, OFFSET_PAYLOAD) == (40, 42, 44, 48)


def test_frame_bytes_match_the_documented_layout() -> None:
    rec = make()
    payload = rec.payload
    covered = (
        bytes([1, 0])
        + (7).to_bytes(2, "big")
        + (0x0102030405060708).to_bytes(8, "big", signed=True)
        + (-2).to_bytes(8, "big", signed=True)
        + (-(2**63)).to_bytes(8, "big", signed=True)
        + (2**63 - 1).to_bytes(8, "big", signed=True)
        + (3).to_bytes(2, "big")
        + (5).to_bytes(2, "big")
    )
    expected = (
        (44 + len(payload)).to_bytes(4, "big")
        + covered
        + zlib.crc32(covered + payload).to_bytes(4, "big")
        + payload
    )
    assert SER.encode(rec) == expected


@given(records)
def test_fields_sit_at_their_offsets(rec: SemiDeserializedRecord) -> None:
    frame = SER.encode(rec)
    assert len(frame) == HEADER_SIZE + len(rec.payload)
    assert struct.unpack_from(">I", frame, 0)[0] == len(frame) - 4
    assert frame[OFFSET_VERSION] == FRAME_VERSION
    assert frame[OFFSET_FLAGS] == 0
    assert struct.unpack_from(">H", frame, OFFSET_SOURCE_ID)[0] == rec.source_id
    assert struct.unpack_from(">q", frame, OFFSET_SOURCE_RECORD_ID)[0] == rec.record_id.source_record_id
    assert struct.unpack_from(">q", frame, OFFSET_CURRENT_RECORD_ID)[0] == rec.record_id.current_record_id
    assert struct.unpack_from(">q", frame, OFFSET_KEY_HASH)[0] == rec.key_hash
    assert struct.unpack_from(">q", frame, OFFSET_ORIGIN_ID)[0] == rec.origin_id
    assert struct.unpack_from(">H", frame, OFFSET_REPLAY_COUNT)[0] == rec.replay_count
    channel = struct.unpack_from(">H", frame, OFFSET_CHANNEL)[0]
    assert channel == (NO_CHANNEL if rec.channel is None else rec.channel)
    crc = zlib.crc32(frame[4:OFFSET_CRC] + frame[OFFSET_PAYLOAD:])
    assert struct.unpack_from(">I", frame, OFFSET_CRC)[0] == crc
    assert frame[OFFSET_PAYLOAD:] == rec.payload


# --- round-trips -------------------------------------------------------------------


@settings(max_examples=300)
@given(records)
def test_frame_roundtrip(rec: SemiDeserializedRecord) -> None:
    frame = SER.encode(rec)
    assert SER.decode(frame) == rec
    assert SER.decode(bytearray(frame)) == rec
    assert SER.decode(memoryview(frame)) == rec
    assert frame_spans(frame, 1) == [(0, len(frame))]


@settings(max_examples=50)
@given(st.lists(records, max_size=30))
def test_a_chunks_frames_give_its_records_in_order(recs: list[SemiDeserializedRecord]) -> None:
    stream = b"".join(SER.encode(r) for r in recs)
    n = len(recs)
    assert list(chunk_records(stream, n)) == recs
    assert list(chunk_records(memoryview(b"xx" + stream)[2:], n)) == recs
    assert list(chunk_records(bytearray(stream), n)) == recs
    assert [stream[a:b] for a, b in frame_spans(stream, n)] == [SER.encode(r) for r in recs]


def test_many_frames_in_order() -> None:
    recs = [make(record_id=RecordId(i + 1, -(i + 1)), payload=pack_payload(i), channel=None) for i in range(2000)]
    decoded = list(chunk_records(b"".join(map(SER.encode, recs)), len(recs)))
    assert decoded == recs
    assert [unpack_payload(r.payload) for r in decoded] == list(range(2000))


def test_multidimensional_and_typed_buffers_are_read_as_bytes() -> None:
    frame = SER.encode(make(payload=b"12345678"))
    assert SER.decode(memoryview(frame).cast("B", (len(frame) // 4, 4))) == make(payload=b"12345678")
    assert SER.decode(memoryview(frame).cast("i")) == make(payload=b"12345678")


def test_empty_stream() -> None:
    assert frame_spans(b"", 0) == []
    assert list(chunk_records(b"", 0)) == []
    with pytest.raises(FrameError, match="needs 48 bytes, has 0"):
        SER.decode(b"")


def test_max_payload_frame_roundtrips() -> None:
    rec = make(payload=b"\xab" * MAX_PAYLOAD_BYTES)
    frame = SER.encode(rec)
    assert struct.unpack_from(">I", frame)[0] == 44 + MAX_PAYLOAD_BYTES
    assert SER.decode(frame) == rec


# --- decode errors -----------------------------------------------------------------


def _with_crc(frame: bytearray) -> bytes:
    crc = zlib.crc32(bytes(frame[4:OFFSET_CRC] + frame[OFFSET_PAYLOAD:]))
    frame[OFFSET_CRC:OFFSET_PAYLOAD] = crc.to_bytes(4, "big")
    return bytes(frame)


def test_decode_error_messages() -> None:
    frame = SER.encode(make())
    n = len(frame)
    with pytest.raises(FrameError, match=f"truncated frame at offset 0: needs {n} bytes, has {n - 1}"):
        SER.decode(frame[:-1])
    with pytest.raises(FrameError, match="truncated frame at offset 0: needs 48 bytes, has 47"):
        SER.decode(frame[:47])
    with pytest.raises(FrameError, match="truncated frame"):  # a chunk's second frame cut to 3 bytes
        list(chunk_records(frame + frame[:3], 2))
    with pytest.raises(FrameError, match="2 trailing bytes"):
        SER.decode(frame + b"\x00\x00")
    with pytest.raises(FrameError, match="checksum mismatch in frame at offset 0"):
        SER.decode(frame[:-1] + bytes([frame[-1] ^ 1]))


@pytest.mark.parametrize("body_len", [0, 43, 44 + MAX_PAYLOAD_BYTES + 1, 0xFFFFFFFF])
def test_body_len_out_of_bounds(body_len: int) -> None:
    frame = bytearray(SER.encode(make()))
    frame[0:4] = body_len.to_bytes(4, "big")
    with pytest.raises(FrameError, match=f"body_len {body_len} is outside"):
        SER.decode(bytes(frame))


def test_version_and_flags_are_checked_even_with_a_valid_crc() -> None:
    frame = bytearray(SER.encode(make()))
    frame[OFFSET_VERSION] = 2
    with pytest.raises(FrameError, match="unsupported frame version 2"):
        SER.decode(_with_crc(frame))
    frame[OFFSET_VERSION] = 1
    frame[OFFSET_FLAGS] = 0x80
    with pytest.raises(FrameError, match="flags 0x80"):
        SER.decode(_with_crc(frame))


@pytest.mark.parametrize("offset", [OFFSET_SOURCE_RECORD_ID, OFFSET_CURRENT_RECORD_ID, OFFSET_ORIGIN_ID])
def test_zero_ids_in_a_checksummed_frame_are_refused(offset: int) -> None:
    frame = bytearray(SER.encode(make()))
    frame[offset : offset + 8] = bytes(8)
    with pytest.raises(FrameError, match="invalid record"):
        SER.decode(_with_crc(frame))


def test_a_chunks_good_frames_are_read_before_a_bad_one() -> None:
    good = [make(record_id=RecordId(i, i)) for i in (1, 2)]
    stream = b"".join(map(SER.encode, good)) + b"\x00" * 50
    it = chunk_records(stream, 3)
    assert [next(it), next(it)] == good
    with pytest.raises(FrameError):
        next(it)


@pytest.mark.parametrize("bad", ["text", 5, None, 1.5, [1, 2], object(), memoryview(bytes(100))[::2]])
def test_wrong_buffer_types_raise_frame_error(bad: Any) -> None:
    with pytest.raises(FrameError, match="cannot read frames"):
        SER.decode(bad)


@pytest.mark.parametrize("bad", [b"frame", None, ("a", "b"), 5])
def test_encode_of_a_non_record_raises_serialization_error(bad: Any) -> None:
    with pytest.raises(SerializationError, match="expected SemiDeserializedRecord"):
        SER.encode(bad)


# --- SemiDeserializedRecord --------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("source_id", -1),
        ("source_id", 0x10000),
        ("source_id", "1"),
        ("source_id", 1.0),
        ("record_id", (1, 2)),
        ("record_id", RecordId(0, 1)),
        ("record_id", RecordId(1, 0)),
        ("record_id", RecordId(2**63, 1)),
        ("record_id", None),
        ("key_hash", 2**63),
        ("key_hash", -(2**63) - 1),
        ("key_hash", None),
        ("origin_id", 0),
        ("origin_id", 2**64),
        ("replay_count", -1),
        ("replay_count", 0x10000),
        ("payload", bytearray(b"x")),
        ("payload", "text"),
        ("payload", None),
        ("channel", NO_CHANNEL),
        ("channel", -1),
        ("channel", "0"),
    ],
)
def test_record_validation_names_field(field: str, value: Any) -> None:
    with pytest.raises(SerializationError, match=f"SemiDeserializedRecord.{field} must be"):
        make(**{field: value})


def test_record_validation_refuses_oversized_payload_without_printing_it() -> None:
    with pytest.raises(SerializationError, match=rf"got {MAX_PAYLOAD_BYTES + 1} bytes") as info:
        make(payload=bytes(MAX_PAYLOAD_BYTES + 1))
    assert len(str(info.value)) < 300


def test_record_is_frozen_hashable_and_picklable() -> None:
    rec = make()
    with pytest.raises(AttributeError):
        rec.source_id = 3  # type: ignore[misc]
    assert hash(rec) == hash(make())
    assert pickle.loads(pickle.dumps(rec)) == rec


def test_replayed() -> None:
    rec = make(replay_count=0, channel=None)
    new_id = RecordId(99, 98)
    again = rec.replayed(new_id, 4)
    assert again.record_id == new_id
    assert again.channel == 4
    assert again.replay_count == 1
    assert (again.payload, again.key_hash, again.origin_id, again.source_id) == (
        rec.payload,
        rec.key_hash,
        rec.origin_id,
        rec.source_id,
    )
    assert again.replayed(RecordId(5, 5), None).replay_count == 2
    with pytest.raises(SerializationError, match="replay_count"):
        make(replay_count=0xFFFF).replayed(new_id, None)


# --- serializer classes ------------------------------------------------------------


def key_of(value: Any) -> Any:
    return value["k"]


def test_as_record_serializer() -> None:
    ser = AsRecordSerializer()
    value = {"a": (1, 2), "b": [None, 2**70]}
    assert ser.encode(value) == pack_payload(value)
    assert ser.decode(ser.encode(value)) == value
    with pytest.raises(UnsupportedTypeError):
        ser.encode({1, 2})
    with pytest.raises(SerializationError):
        ser.decode(b"\xc1")


@settings(max_examples=100)
@given(
    st.one_of(st.text(), st.binary(), st.integers(I64_MIN, I64_MAX), st.floats(), st.booleans(), st.none()),
    st.builds(RecordId, ids, ids),
    channels,
)
def test_as_semi_deserialized_hashes_the_selected_key(key: Any, rid: RecordId, channel: int | None) -> None:
    ser = AsSemiDeserializedSerializer(3, key_of)
    value = {"k": key, "other": [1, 2]}
    rec = ser.serialize(value, rid, channel=channel)
    assert rec.key_hash == key_hash(key_of(value))
    assert (rec.source_id, rec.record_id, rec.channel, rec.replay_count) == (3, rid, channel, 0)
    assert rec.origin_id == rid.source_record_id
    assert rec.payload == pack_payload(value)  # not unpack == value: the key may be NaN


def test_as_semi_deserialized_without_selector_hashes_none() -> None:
    rec = AsSemiDeserializedSerializer(0).serialize("v", RecordId(1, 2))
    assert rec.key_hash == key_hash(None) == 42


def test_as_semi_deserialized_tuple_key_and_origin() -> None:
    ser = AsSemiDeserializedSerializer(65535, lambda v: (v[0], v[1]))
    rec = ser.serialize(("a", 7, "rest"), RecordId(5, 6), origin_id=-9)
    assert rec.key_hash == key_hash(("a", 7))
    assert rec.origin_id == -9
    assert unpack_payload(rec.payload) == ("a", 7, "rest")


def test_key_selector_exception_becomes_key_hash_error() -> None:
    ser = AsSemiDeserializedSerializer(12, key_of)
    with pytest.raises(KeyHashError, match="source 12") as info:
        ser.serialize({"no key": 1}, RecordId(1, 2))
    assert isinstance(info.value.__cause__, KeyError)


def test_unhashable_key_becomes_key_hash_error_naming_the_source() -> None:
    ser = AsSemiDeserializedSerializer(4, lambda v: v)
    with pytest.raises(KeyHashError, match=r"source 4.*'list'") as info:
        ser.serialize([1], RecordId(1, 2))
    assert isinstance(info.value.__cause__, KeyHashError)
    with pytest.raises(KeyHashError, match="source 4"):
        ser.serialize(2**64, RecordId(1, 2))


def test_fail_record_from_key_selector_propagates() -> None:
    def selector(value: Any) -> Any:
        raise FailRecord("bad input")

    with pytest.raises(FailRecord, match="bad input"):
        AsSemiDeserializedSerializer(1, selector).serialize(1, RecordId(1, 2))


def test_as_semi_deserialized_bad_arguments() -> None:
    bad: Any
    for bad in (-1, 0x10000, "1", None):
        with pytest.raises(SerializationError, match="source_id"):
            AsSemiDeserializedSerializer(bad)
    ser = AsSemiDeserializedSerializer(1)
    with pytest.raises(SerializationError, match="record_id must be a RecordId"):
        ser.serialize(1, (1, 2))  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match="channel"):
        ser.serialize(1, RecordId(1, 2), channel=NO_CHANNEL)
    with pytest.raises(SerializationError, match="origin_id"):
        ser.serialize(1, RecordId(1, 2), origin_id=0)
    with pytest.raises(UnsupportedTypeError, match="'set'"):
        ser.serialize({1}, RecordId(1, 2))


def test_serializers_are_picklable() -> None:
    for ser in (SemiDeserializedSerializer(), AsRecordSerializer()):
        assert type(pickle.loads(pickle.dumps(ser))) is type(ser)
    semi = pickle.loads(pickle.dumps(AsSemiDeserializedSerializer(9, key_of)))
    assert (semi.source_id, semi.key_selector) == (9, key_of)
    assert semi.serialize({"k": "x"}, RecordId(1, 2)).key_hash == key_hash("x")


def test_encode_source_frames_matches_the_record_encoder() -> None:
    from ftlayer.records.frames import encode_source_frames
    from ftlayer.records.ids import new_ids

    values = [{"i": i, "user": f"u{i % 7}"} for i in range(50)] + ["", b"\x00", None]
    ids = new_ids(2 * len(values))
    hashes = [key_hash(v if not isinstance(v, dict) else v["user"]) for v in values]
    payloads = [pack_payload(v) for v in values]
    channels = [i % 3 for i in range(len(values))]
    frames = encode_source_frames(4, ids, hashes, payloads, channels)
    serializer = SemiDeserializedSerializer()
    for i, frame in enumerate(frames):
        rec = SemiDeserializedRecord(4, RecordId(ids[2 * i], ids[2 * i + 1]), hashes[i], ids[2 * i], 0,
                                     payloads[i], channels[i])
        assert frame == serializer.encode(rec)
        assert serializer.decode(frame) == rec


def test_encode_source_frames_names_the_record_that_does_not_fit() -> None:
    from ftlayer.records.frames import encode_source_frames

    with pytest.raises(SerializationError, match="source record 1 of a batch of 2"):
        encode_source_frames(0, [1, 2, 3, 2**63], [0, 0], [b"\x01", b"\x02"], [0, 0])


# --- the header layout: one table (HEADER_FIELDS), its struct and numpy forms ------------------


def test_header_dtype_matches_the_struct_layout_field_by_field() -> None:
    from ftlayer.records.frames import _HEADER, HEADER_FIELDS, header_dtype

    dtype = header_dtype()
    assert dtype.itemsize == HEADER_SIZE == _HEADER.size
    assert list(dtype.names) == [name for name, _ in HEADER_FIELDS]
    at = 0
    for name, code in HEADER_FIELDS:
        width = struct.calcsize(">" + code)
        field, offset = dtype.fields[name]
        assert offset == at, name
        assert field.itemsize == width, name
        assert field.kind == ("i" if code == "q" else "u"), name
        assert width == 1 or field.byteorder == ">", name
        at += width
    assert at == HEADER_SIZE
    offsets = {name: dtype.fields[name][1] for name in dtype.names}
    assert [offsets[n] for n in ("version", "flags", "src", "sid", "cid", "khash", "origin", "replay", "channel",
                                 "crc")] == [
        OFFSET_VERSION, OFFSET_FLAGS, OFFSET_SOURCE_ID, OFFSET_SOURCE_RECORD_ID, OFFSET_CURRENT_RECORD_ID,
        OFFSET_KEY_HASH, OFFSET_ORIGIN_ID, OFFSET_REPLAY_COUNT, OFFSET_CHANNEL, OFFSET_CRC,
    ]
    assert offsets["body_len"] == 0 and OFFSET_PAYLOAD == HEADER_SIZE


@settings(max_examples=200, deadline=None)
@given(records)
def test_a_frame_encoded_by_frames_decodes_through_header_dtype(rec: SemiDeserializedRecord) -> None:
    import numpy as np

    from ftlayer.records.frames import header_dtype

    frame = SER.encode(rec)
    head = np.frombuffer(frame[:HEADER_SIZE], dtype=header_dtype())[0]
    assert int(head["body_len"]) == len(frame) - 4
    assert int(head["version"]) == FRAME_VERSION
    assert int(head["flags"]) == 0
    assert int(head["src"]) == rec.source_id
    assert (int(head["sid"]), int(head["cid"])) == tuple(rec.record_id)
    assert int(head["khash"]) == rec.key_hash
    assert int(head["origin"]) == rec.origin_id
    assert int(head["replay"]) == rec.replay_count
    assert int(head["channel"]) == (NO_CHANNEL if rec.channel is None else rec.channel)
    assert int(head["crc"]) == zlib.crc32(frame[HEADER_SIZE:], zlib.crc32(frame[4:OFFSET_CRC]))
    assert frame[HEADER_SIZE:] == rec.payload
