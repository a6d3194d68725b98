"""Fuzzing the decoders: corrupted, truncated, random and mistyped input.

The contract under test: frame decoding either returns exactly the record that
was encoded or raises FrameError; payload decoding returns a value of the
supported types or raises SerializationError; neither raises anything else,
allocates far beyond its input, or hangs.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ftlayer.errors import FrameError, SerializationError
from ftlayer.records.ids import RecordId
from serialization import (
    HEADER_SIZE,
    SemiDeserializedRecord,
    SemiDeserializedSerializer,
    pack_payload,
    unpack_payload,
)
from serialization.payload import EXT_AWARE_DATETIME, EXT_BIGINT, EXT_DECIMAL, EXT_TUPLE
from tests.ftlayer.conftest import chunk_records

SER = SemiDeserializedSerializer()
I64 = st.integers(-(2**63), 2**63 - 1)
ids = I64.filter(bool)
records = st.builds(
    SemiDeserializedRecord,
    source_id=st.integers(0, 0xFFFF),
    record_id=st.builds(RecordId, ids, ids),
    key_hash=I64,
    origin_id=ids,
    replay_count=st.integers(0, 0xFFFF),
    payload=st.binary(max_size=64),
    channel=st.none() | st.integers(0, 0xFFFE),
)
FIXED = SemiDeserializedRecord(3, RecordId(11, -12), 13, 14, 2, pack_payload(["payload", 1]), 9)


def decode_or_frame_error(data: Any) -> SemiDeserializedRecord | None:
    """Decode; a FrameError gives None. Any other exception fails the test."""
    try:
        return SER.decode(data)
    except FrameError:
        return None


# --- truncation --------------------------------------------------------------------


def test_every_truncation_of_a_frame_fails() -> None:
    frame = SER.encode(FIXED)
    for n in range(len(frame)):
        with pytest.raises(FrameError, match="truncated"):
            SER.decode(frame[:n])


@settings(max_examples=60)
@given(records)
def test_every_truncation_of_random_frames_fails(rec: SemiDeserializedRecord) -> None:
    frame = SER.encode(rec)
    for n in range(len(frame)):
        assert decode_or_frame_error(frame[:n]) is None
    assert SER.decode(frame) == rec


@settings(max_examples=60)
@given(st.lists(records, min_size=1, max_size=5), st.data())
def test_a_truncated_chunk_yields_a_prefix_then_fails(recs: list[SemiDeserializedRecord], data: st.DataObject) -> None:
    stream = b"".join(map(SER.encode, recs))
    ends = list(itertools.accumulate(len(SER.encode(r)) for r in recs))
    cut = data.draw(st.integers(1, len(stream) - 1))
    whole = ends.index(cut) + 1 if cut in ends else None  # a cut between frames: the rest is missing
    got: list[SemiDeserializedRecord] = []
    with pytest.raises(FrameError, match="truncated"):
        got.extend(chunk_records(stream[:cut], len(recs)))
    assert got == recs[: len(got)] and (whole is None or len(got) == whole)


# --- corruption --------------------------------------------------------------------


def test_every_single_byte_change_of_a_frame_fails() -> None:
    frame = SER.encode(FIXED)
    for i in range(len(frame)):
        for mask in range(1, 256):
            corrupted = bytearray(frame)
            corrupted[i] ^= mask
            assert decode_or_frame_error(bytes(corrupted)) is None, (i, mask)


@settings(max_examples=300)
@given(records, st.data())
def test_single_byte_flip_fails(rec: SemiDeserializedRecord, data: st.DataObject) -> None:
    frame = bytearray(SER.encode(rec))
    i = data.draw(st.integers(0, len(frame) - 1), label="index")
    frame[i] ^= data.draw(st.integers(1, 255), label="mask")
    with pytest.raises(FrameError):
        SER.decode(bytes(frame))


@settings(max_examples=100)
@given(st.lists(records, min_size=2, max_size=5), st.data())
def test_corruption_inside_a_stream_never_yields_a_wrong_record(
    recs: list[SemiDeserializedRecord], data: st.DataObject
) -> None:
    stream = bytearray(b"".join(map(SER.encode, recs)))
    i = data.draw(st.integers(0, len(stream) - 1), label="index")
    stream[i] ^= data.draw(st.integers(1, 255), label="mask")
    got: list[SemiDeserializedRecord] = []
    with pytest.raises(FrameError):
        got.extend(chunk_records(bytes(stream), len(recs)))
    assert got == recs[: len(got)]


# --- random and mistyped input -----------------------------------------------------


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_random_bytes_do_not_decode(data: bytes) -> None:
    rec = decode_or_frame_error(data)
    # Only a genuinely valid frame may decode, and then it must re-encode to itself.
    assert rec is None or SER.encode(rec) == data


@settings(max_examples=300)
@given(st.binary(min_size=HEADER_SIZE - 6, max_size=120))
def test_random_bytes_behind_a_plausible_header_do_not_decode(rest: bytes) -> None:
    # body_len, version and flags right, so only the checksum stands in the way.
    body = b"\x01\x00" + rest
    data = len(body).to_bytes(4, "big") + body
    assert decode_or_frame_error(data) is None or SER.encode(SER.decode(data)) == data


@pytest.mark.parametrize("bad", ["x" * 60, 60, None, 1.5, [0] * 60, {"a": 1}, object(), RecordId(1, 2)])
def test_wrong_types_raise_frame_or_serialization_errors(bad: Any) -> None:
    with pytest.raises(FrameError):
        SER.decode(bad)
    with pytest.raises(SerializationError):
        SER.encode(bad)
    with pytest.raises(SerializationError):
        unpack_payload(bad)


# --- payload decoding --------------------------------------------------------------


def _check_unpack(data: bytes) -> None:
    """unpack_payload gives a value or SerializationError; a value packs and round-trips."""
    try:
        value = unpack_payload(data)
    except SerializationError:
        return
    try:
        packed = pack_payload(value)
    except SerializationError:  # e.g. deeper nesting than packing allows
        return
    assert pack_payload(unpack_payload(packed)) == packed


@settings(max_examples=500)
@given(st.binary(max_size=100))
def test_unpack_random_bytes(data: bytes) -> None:
    _check_unpack(data)


# Byte strings that start msgpack tokens, ext headers of our codes among them, so
# the fuzzer reaches the ext decoders and container paths more often than chance.
_TOKENS = [
    b"\x91", b"\x92", b"\x81", b"\xdc\x00\x03", b"\xde\x00\x01", b"\xc0", b"\xc3", b"\x05",
    b"\xa3abc", b"\xc4\x02", b"\xcb", b"\xcf", b"\xd3", b"\xd9\x05",
    b"\xd4", b"\xd5", b"\xd6", b"\xd7", b"\xd8", b"\xc7\x0c", b"\xc7\x14", b"\xc8\x00\x10",
    bytes([0xD5, EXT_TUPLE]), bytes([0xC7, 3, EXT_TUPLE]), bytes([0xC7, 4, EXT_DECIMAL]),
    bytes([0xC7, 2, EXT_BIGINT]), bytes([0xC7, 20, EXT_AWARE_DATETIME]), b"\xd6\xff", b"\xd7\xff",
]
token_streams = st.lists(st.sampled_from(_TOKENS) | st.binary(max_size=4), max_size=25).map(b"".join)


@settings(max_examples=500)
@given(token_streams)
def test_unpack_msgpack_shaped_garbage(data: bytes) -> None:
    _check_unpack(data)


@settings(max_examples=100)
@given(st.integers(-2, 12), st.binary(max_size=30))
def test_unpack_any_ext_code_with_random_data(code: int, ext_data: bytes) -> None:
    header = b"\xc7" + len(ext_data).to_bytes(1, "big") + code.to_bytes(1, "big", signed=True)
    _check_unpack(header + ext_data)
    _check_unpack(b"\x92\x01" + header + ext_data)


@pytest.mark.parametrize(
    "data",
    [
        b"\xdd\xff\xff\xff\xff" + b"\x00" * 100,  # array of 2**32 - 1 items
        b"\xdf\xff\xff\xff\xff" + b"\x00" * 100,  # map of 2**32 - 1 pairs
        b"\xdb\xff\xff\xff\xff",  # str of 4 GiB
        b"\xc6\xff\xff\xff\xff",  # bin of 4 GiB
        b"\xc9\xff\xff\xff\xff\x02",  # ext of 4 GiB
        b"\x91" * 100_000,  # nesting without end
        b"\xc7\x06\x01" + b"9" * 6,  # a small big-int ext is fine, a huge one is refused below
        b"\xc9\x00\x01\x00\x00\x01" + b"9" * 65536,
    ],
    ids=lambda d: d[:6].hex(),
)
def test_small_hostile_inputs_fail_fast(data: bytes) -> None:
    start = time.perf_counter()
    _check_unpack(data)
    assert time.perf_counter() - start < 1.0
