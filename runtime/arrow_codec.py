"""Frames to Arrow: the columnar form in which the FT source hands records to Spark.

One row per source record, columns :data:`SOURCE_COLUMNS` (the Spark schema is
:data:`SOURCE_SCHEMA_DDL`). Payloads stay msgpack bytes; operators unpack them
later (``serialization.payload.unpack_payload``).

:func:`frames_to_record_batch` is the hot path of the FT source's ``read()``. It
checks every frame exactly as :class:`~serialization.frames.SemiDeserializedSerializer`
does (length, version, reserved flags, CRC-32) but reads the header with one
``struct`` call instead of building a validated record object, which is about
4x faster. A frame that fails any check is handed to the serializer's
``decode``, so the ``FrameError`` raised names the problem exactly as
everywhere else in ftlayer.

``pyarrow`` is imported on first use, so importing this module is cheap.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Any

from ftlayer.errors import FrameError
from serialization.frames import (
    BODY_FIXED_SIZE,
    FRAME_VERSION,
    HEADER_SIZE,
    MAX_PAYLOAD_BYTES,
    OFFSET_CRC,
    SemiDeserializedSerializer,
)

__all__ = [
    "SOURCE_COLUMNS",
    "SOURCE_SCHEMA_DDL",
    "arrow_schema",
    "frames_to_record_batch",
]

#: (name, Spark SQL type, Arrow type name) of every column the FT source emits.
SOURCE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("sid", "long", "int64"),  # source_record_id: the acker entry (tree) of the record
    ("cid", "long", "int64"),  # current_record_id: this record inside the tree
    ("key_hash", "long", "int64"),  # ftlayer.keyhash.key_hash of the key (xxhash64 seed 42)
    ("origin", "long", "int64"),  # source_record_id of the first attempt (kept on replay)
    ("replay", "int", "int32"),  # replay count: 0 for a first attempt
    ("channel", "int", "int32"),  # channel the record was appended to (= Spark partition)
    ("payload", "binary", "binary"),  # msgpack bytes
)
SOURCE_SCHEMA_DDL = ", ".join(f"{name} {sql}" for name, sql, _ in SOURCE_COLUMNS)

_HEADER = struct.Struct(">IBBHqqqqHHI")  # bytes [0:48) of a frame, see serialization.frames
_MAX_BODY = BODY_FIXED_SIZE + MAX_PAYLOAD_BYTES
_SERIALIZER = SemiDeserializedSerializer()
_schema_cache: list[Any] = []


def arrow_schema() -> Any:
    """The ``pyarrow.Schema`` of the FT source (equal to Spark's own conversion of its schema)."""
    if not _schema_cache:
        import pyarrow as pa

        _schema_cache.append(pa.schema([pa.field(n, getattr(pa, t)()) for n, _, t in SOURCE_COLUMNS]))
    return _schema_cache[0]


def _bad_frame(frame: bytes, index: int) -> FrameError:
    """The serializer's own error for a frame the fast path refused."""
    try:
        _SERIALIZER.decode(frame)
    except FrameError as exc:
        msg = f"frame {index} of the batch: {exc}"
        return FrameError(msg)
    msg = f"frame {index} of the batch ({len(frame)} bytes) is malformed"  # pragma: no cover
    return FrameError(msg)  # pragma: no cover


def frames_to_record_batch(frames: Sequence[bytes]) -> Any:
    """One ``pyarrow.RecordBatch`` (schema :func:`arrow_schema`) with a row per frame, in order.

    Raises ``FrameError`` (naming the frame's index in ``frames``) if any frame is
    truncated, has a wrong length, version, flags or checksum.
    """
    import pyarrow as pa

    n = len(frames)
    sids: list[int] = [0] * n
    cids: list[int] = [0] * n
    hashes: list[int] = [0] * n
    origins: list[int] = [0] * n
    replays: list[int] = [0] * n
    channels: list[int] = [0] * n
    payloads: list[bytes] = [b""] * n
    unpack = _HEADER.unpack_from
    crc32 = zlib.crc32
    for i, frame in enumerate(frames):
        size = len(frame)
        if size < HEADER_SIZE:
            raise _bad_frame(frame, i)
        body_len, version, flags, _src, sid, cid, khash, origin, replay, channel, crc = unpack(frame)
        if body_len + 4 != size or body_len > _MAX_BODY or version != FRAME_VERSION or flags != 0:
            raise _bad_frame(frame, i)
        view = memoryview(frame)
        if crc32(view[HEADER_SIZE:], crc32(view[4:OFFSET_CRC])) != crc:
            raise _bad_frame(frame, i)
        sids[i] = sid
        cids[i] = cid
        hashes[i] = khash
        origins[i] = origin
        replays[i] = replay
        channels[i] = channel
        payloads[i] = frame[HEADER_SIZE:]
    i64, i32 = pa.int64(), pa.int32()
    return pa.RecordBatch.from_arrays(
        [
            pa.array(sids, i64),
            pa.array(cids, i64),
            pa.array(hashes, i64),
            pa.array(origins, i64),
            pa.array(replays, i32),
            pa.array(channels, i32),
            pa.array(payloads, pa.binary()),
        ],
        schema=arrow_schema(),
    )
