"""The frame format: one semi-deserialized record as self-delimiting bytes.

A frame is a fixed 48-byte big-endian header followed by the msgpack payload.
The layout is fixed: Lua scripts inside Redis read fields at these offsets.

======  ====  ==================  ==================================================
offset  size  field               meaning
======  ====  ==================  ==================================================
0       4     body_len u32        bytes after this field: ``44 + len(payload)``
4       1     version u8          ``FRAME_VERSION`` (1)
5       1     flags u8            reserved, written as 0, a frame with others is refused
6       2     source_id u16       index of the source in its topology
8       8     source_record_id    i64, names the tree (the acker entry)
16      8     current_record_id   i64, names this record within the tree
24      8     key_hash i64        ``ftlayer.records.keyhash.key_hash`` of the record's key
32      8     origin_id i64       source_record_id of the first attempt (kept on replay)
40      2     replay_count u16    0 for a first attempt, +1 per replay
42      2     channel u16         ``NO_CHANNEL`` (0xFFFF) when none was recorded
44      4     crc32 u32           ``zlib.crc32`` of bytes ``[4:44)`` then the payload
48      ..    payload             msgpack bytes (``serialization.payload``)
======  ====  ==================  ==================================================

For Lua: ``string.sub`` is 1-based, so field ``OFFSET_X`` of width ``w`` is
``string.sub(frame, OFFSET_X + 1, OFFSET_X + w)``. Redis' Lua 5.1 numbers are
doubles, so compare and XOR the i64 fields as 8-byte strings (or 32-bit
halves), never as Lua numbers.

Decoding never returns a wrong record silently: every frame is checked for
length, version, flags and checksum, and any failure raises ``FrameError``
naming the offset. CRC-32 catches every single-byte (indeed every burst of up
to 32 bits) corruption of the covered bytes; a corrupted ``body_len`` either
fails the bounds check or moves the checksummed region, which the checksum
then rejects except with probability 2**-32.
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Sequence
from typing import Any

from ftlayer.errors import FrameError, SerializationError
from ftlayer.records.ids import RecordId
from ftlayer.records.record import MAX_PAYLOAD_BYTES, NO_CHANNEL, SemiDeserializedRecord

__all__ = [
    "BODY_FIXED_SIZE",
    "FAILED_PREFIX",
    "FRAME_VERSION",
    "HEADER_FIELDS",
    "HEADER_SIZE",
    "MAX_PAYLOAD_BYTES",
    "NO_CHANNEL",
    "OFFSET_BODY_LEN",
    "OFFSET_CHANNEL",
    "OFFSET_CRC",
    "OFFSET_CURRENT_RECORD_ID",
    "OFFSET_FLAGS",
    "OFFSET_KEY_HASH",
    "OFFSET_ORIGIN_ID",
    "OFFSET_PAYLOAD",
    "OFFSET_REPLAY_COUNT",
    "OFFSET_SOURCE_ID",
    "OFFSET_SOURCE_RECORD_ID",
    "OFFSET_VERSION",
    "SemiDeserializedRecord",
    "SemiDeserializedSerializer",
    "encode_frame",
    "encode_source_frames",
    "header_dtype",
]

FRAME_VERSION = 1
HEADER_SIZE = 48
BODY_FIXED_SIZE = 44  # body_len of a frame with an empty payload

OFFSET_BODY_LEN = 0
OFFSET_VERSION = 4
OFFSET_FLAGS = 5
OFFSET_SOURCE_ID = 6
OFFSET_SOURCE_RECORD_ID = 8
OFFSET_CURRENT_RECORD_ID = 16
OFFSET_KEY_HASH = 24
OFFSET_ORIGIN_ID = 32
OFFSET_REPLAY_COUNT = 40
OFFSET_CHANNEL = 42
OFFSET_CRC = 44
OFFSET_PAYLOAD = 48

# The Lua under ftlayer/lua/ reads frames through names generated from these constants (ftlayer.scripting.lua_layout).
# A ``failed`` value is ``failed at, ms f64 (8) | reason length u16 (2) | reason | frame``.
FAILED_PREFIX = 10

#: The header, field by field: (short name, ``struct`` code), big-endian, in offset order. The
#: one source of the header's layout: the structs below and :func:`header_dtype` (numpy) are built
#: from it (tests/ftlayer/records/test_frames.py checks the ``OFFSET_*`` constants, which the Lua
#: reads, against it).
HEADER_FIELDS: tuple[tuple[str, str], ...] = (
    ("body_len", "I"), ("version", "B"), ("flags", "B"), ("src", "H"), ("sid", "q"), ("cid", "q"),
    ("khash", "q"), ("origin", "q"), ("replay", "H"), ("channel", "H"), ("crc", "I"),
)
_CODES = "".join(code for _, code in HEADER_FIELDS)
_U32 = struct.Struct(">I")
_CRC_COVERED = struct.Struct(">" + _CODES[1:-1])  # bytes [4:44): all but body_len and crc
_HEADER = struct.Struct(">" + _CODES)  # bytes [0:48)
_NUMPY_CODES = {"B": "u1", "H": ">u2", "I": ">u4", "q": ">i8"}


@functools.cache
def header_dtype() -> Any:
    """The frame header as a numpy structured dtype (``HEADER_SIZE`` bytes, fields named as in
    :data:`HEADER_FIELDS`), for parsing or writing the headers of many frames as one array.
    numpy is imported on first use."""
    import numpy as np

    return np.dtype([(name, _NUMPY_CODES[code]) for name, code in HEADER_FIELDS])


_MAX_BODY = BODY_FIXED_SIZE + MAX_PAYLOAD_BYTES
_crc32 = zlib.crc32


def encode_frame(rec: SemiDeserializedRecord) -> bytes:
    """One self-delimiting frame for ``rec``; ``SerializationError`` if it is no record."""
    if not isinstance(rec, SemiDeserializedRecord):
        msg = f"cannot encode a {type(rec).__name__!r} as a frame: expected SemiDeserializedRecord"
        raise SerializationError(msg)
    payload = rec.payload
    rid = rec.record_id
    covered = _CRC_COVERED.pack(
        FRAME_VERSION, 0, rec.source_id, rid[0], rid[1], rec.key_hash, rec.origin_id,
        rec.replay_count, NO_CHANNEL if rec.channel is None else rec.channel,
    )
    crc = _crc32(payload, _crc32(covered))
    return b"".join((_U32.pack(BODY_FIXED_SIZE + len(payload)), covered, _U32.pack(crc), payload))


def encode_source_frames(
    source_id: int,
    ids: Sequence[int],
    key_hashes: Sequence[int],
    payloads: Sequence[bytes],
    channels: Sequence[int],
) -> list[bytes]:
    """Frames of fresh source records, for ingest's hot path (no record objects built).

    Record ``i`` has source record id ``ids[2i]``, current id ``ids[2i + 1]``,
    origin = its source record id, replay count 0. The bytes are exactly those
    :meth:`SemiDeserializedSerializer.encode` gives for the same record. The
    caller vouches for what the record constructor would check (ids from
    ``ftlayer.records.ids``, hashes from ``key_hash``, payloads from ``pack_payload``);
    a value that does not fit its field raises ``SerializationError`` naming
    the record's index.
    """
    covered_pack, u32, crc32 = _CRC_COVERED.pack, _U32.pack, _crc32
    out: list[bytes] = []
    try:
        for i, payload in enumerate(payloads):
            sid = ids[2 * i]
            covered = covered_pack(FRAME_VERSION, 0, source_id, sid, ids[2 * i + 1], key_hashes[i], sid, 0,
                                   channels[i])
            out.append(b"".join((u32(BODY_FIXED_SIZE + len(payload)), covered,
                                 u32(crc32(payload, crc32(covered))), payload)))
    except (struct.error, TypeError) as exc:
        msg = f"cannot encode source record {len(out)} of a batch of {len(payloads)} as a frame: {exc}"
        raise SerializationError(msg) from exc
    return out


_Buffer = bytes | memoryview


def _as_buffer(buf: object) -> _Buffer:
    if type(buf) is bytes:
        return buf
    try:
        view = memoryview(buf)  # type: ignore[arg-type]  # non-buffers are refused below
        if view.format != "B" or view.ndim != 1 or not view.c_contiguous:
            view = view.cast("B")  # TypeError for a non-contiguous view
    except TypeError as exc:
        msg = f"cannot read frames from a {type(buf).__name__!r}: expected a contiguous bytes-like"
        raise FrameError(msg) from exc
    return view


# (header fields as _HEADER unpacks them, end offset, payload slice of the buffer)
_Checked = tuple[tuple[Any, ...], int, _Buffer]


def _check_at(buf: _Buffer, offset: int, size: int) -> _Checked:
    available = size - offset
    if available < HEADER_SIZE:
        msg = f"truncated frame at offset {offset}: needs {HEADER_SIZE} bytes, has {available}"
        raise FrameError(msg)
    fields = _HEADER.unpack_from(buf, offset)
    body_len, version, flags = fields[0], fields[1], fields[2]
    if not BODY_FIXED_SIZE <= body_len <= _MAX_BODY:
        msg = (
            f"bad frame length at offset {offset}: body_len {body_len} is outside "
            f"[{BODY_FIXED_SIZE}, {_MAX_BODY}]"
        )
        raise FrameError(msg)
    end = offset + 4 + body_len
    if end > size:
        msg = f"truncated frame at offset {offset}: needs {4 + body_len} bytes, has {available}"
        raise FrameError(msg)
    if version != FRAME_VERSION:
        msg = f"unsupported frame version {version} at offset {offset}: expected {FRAME_VERSION}"
        raise FrameError(msg)
    if flags != 0:
        msg = f"frame at offset {offset} has flags {flags:#04x}: reserved flags must be 0"
        raise FrameError(msg)
    payload = buf[offset + HEADER_SIZE : end]
    crc = _crc32(payload, _crc32(buf[offset + 4 : offset + OFFSET_CRC]))
    if crc != fields[10]:
        msg = (
            f"checksum mismatch in frame at offset {offset} ({4 + body_len} bytes): "
            f"stored {fields[10]:#010x}, computed {crc:#010x}"
        )
        raise FrameError(msg)
    return fields, end, payload


def _decode_at(buf: _Buffer, offset: int, size: int) -> tuple[SemiDeserializedRecord, int]:
    fields, end, payload = _check_at(buf, offset, size)
    _, _, _, source_id, sid, cid, khash, origin, replays, channel, _ = fields
    try:
        rec = SemiDeserializedRecord(
            source_id, RecordId(sid, cid), khash, origin, replays,
            bytes(payload), None if channel == NO_CHANNEL else channel,
        )
    except SerializationError as exc:
        msg = f"frame at offset {offset} holds an invalid record: {exc}"
        raise FrameError(msg) from exc
    return rec, end


class SemiDeserializedSerializer:
    """Frames <-> :class:`SemiDeserializedRecord`; stateless and picklable.

    Readers accept ``bytes``, ``bytearray`` or a ``memoryview``; anything else
    raises ``FrameError``. Every frame is fully checked (see the module notes).
    """

    __slots__ = ()

    def encode(self, rec: SemiDeserializedRecord) -> bytes:
        """One self-delimiting frame for ``rec``; ``SerializationError`` if it is no record."""
        return encode_frame(rec)

    def decode(self, buf: bytes | bytearray | memoryview) -> SemiDeserializedRecord:
        """The record of a buffer holding exactly one frame.

        ``FrameError`` if the frame is bad or bytes follow it.
        """
        view = _as_buffer(buf)
        size = len(view)
        rec, end = _decode_at(view, 0, size)
        if end != size:
            msg = f"{size - end} trailing bytes after the frame ending at offset {end}"
            raise FrameError(msg)
        return rec
