"""Frames to Arrow: the columnar form in which the FT source hands records to Spark.

One row per source record, the columns of :data:`runtime.spark.row_contract.SOURCE_ROW` (the
Spark schema is :data:`SOURCE_SCHEMA_DDL`). Payloads stay msgpack bytes; operators unpack them
later (``serialization.payload.unpack_payload``).

:func:`frames_to_record_batch` is the hot path of the FT source's ``read()``. It
checks every frame exactly as :class:`~ftlayer.records.frames.SemiDeserializedSerializer`
does (length, version, reserved flags, CRC-32) but parses all headers at once
with numpy instead of building a validated record object per frame, and takes a matching
chunk CRC (``ftlayer.records.chunk_crc``) for its frames' own CRC-32s. A frame
that fails any check is handed to the serializer's ``decode``, so the ``FrameError`` raised names the problem exactly as
everywhere else in ftlayer.

``pyarrow`` and ``numpy`` are imported on first use, so importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ftlayer.errors import FrameError
from ftlayer.records.crc_arrays import crc32_ragged, crc32_rows
from ftlayer.records.frames import (
    BODY_FIXED_SIZE,
    FRAME_VERSION,
    HEADER_SIZE,
    MAX_PAYLOAD_BYTES,
    OFFSET_CRC,
    OFFSET_VERSION,
    SemiDeserializedSerializer,
    header_dtype,
)
from runtime.spark.row_contract import SOURCE_ROW

__all__ = [
    "SOURCE_SCHEMA_DDL",
    "arrow_schema",
    "frames_to_record_batch",
    "payload_run",
    "payload_views",
    "spans_to_record_batch",
    "split_bad_frames",
]

#: The Spark schema of the FT source, generated from its row contract (runtime.spark.row_contract).
SOURCE_SCHEMA_DDL = SOURCE_ROW.ddl

#: Each fixed-width source column and the frame header field (ftlayer.records.frames.HEADER_FIELDS) it is.
_FROM_HEADER = {"sid": "sid", "cid": "cid", "key_hash": "khash", "origin": "origin", "replay": "replay",
                "channel": "channel"}
_MAX_BODY = BODY_FIXED_SIZE + MAX_PAYLOAD_BYTES
_SERIALIZER = SemiDeserializedSerializer()


def arrow_schema() -> Any:
    """The ``pyarrow.Schema`` of the FT source: :data:`SOURCE_ROW`'s (equal to Spark's own conversion)."""
    return SOURCE_ROW.arrow_schema()


def _bad_frame(frame: bytes, index: int) -> FrameError:
    """The serializer's own error for a frame the fast path refused."""
    try:
        _SERIALIZER.decode(frame)
    except FrameError as exc:
        msg = f"frame {index} of the batch: {exc}"
        return FrameError(msg)
    msg = f"frame {index} of the batch ({len(frame)} bytes) is malformed"  # pragma: no cover
    return FrameError(msg)  # pragma: no cover


def split_bad_frames(frames: Sequence[bytes], *, prefix: int = 0) -> tuple[list[bytes], list[tuple[int, str]]]:
    """``frames`` (each after ``prefix`` bytes, as for :func:`frames_to_record_batch`) split into
    those that pass every check and ``(index in frames, FrameError text)`` for those that fail one.

    The slow path, one decode per frame: for a batch that
    :func:`frames_to_record_batch` refused, so the good frames can still go on.
    """
    good: list[bytes] = []
    bad: list[tuple[int, str]] = []
    for i, item in enumerate(frames):
        try:
            _SERIALIZER.decode(item[prefix:])
        except FrameError as exc:
            bad.append((i, str(exc)))
        else:
            good.append(item)
    return good, bad


def frames_to_record_batch(frames: Sequence[bytes], *, prefix: int = 0) -> Any:
    """One ``pyarrow.RecordBatch`` (schema :func:`arrow_schema`) with a row per frame, in order.

    With ``prefix``, each item is ``prefix`` bytes of something else followed by
    a frame.

    Raises ``FrameError`` (naming the frame's index in ``frames``; the first
    bad one if several are) if any frame is truncated, has a wrong length,
    version, flags or checksum.
    """
    import numpy as np

    n = len(frames)
    sizes = np.fromiter(map(len, frames), dtype=np.int64, count=n)
    starts = np.zeros(n, dtype=np.int64)
    if n:
        np.cumsum(sizes[:-1], out=starts[1:])
    return spans_to_record_batch(b"".join(frames), starts + prefix, sizes - prefix)


def spans_to_record_batch(blob: bytes, starts: Any, lengths: Any, vouched: Any = None) -> Any:
    """One ``pyarrow.RecordBatch`` with a row per frame ``blob[starts[i] : starts[i] + lengths[i]]``.

    The FT source hands it a chunk's frames as Redis returned them, with the spans of its
    pending records (``runtime.spark.ft_source``): no frame is copied out on its own.
    Every frame is checked as :class:`~ftlayer.records.frames.SemiDeserializedSerializer` checks it
    (length, version, reserved flags, CRC-32); ``FrameError`` names the first bad one's
    index in the spans. ``vouched`` (a bool per frame; None: none) marks the frames whose
    chunk's CRC matched (``ftlayer.records.chunk_crc``, ``ChannelBatch.spans``): their bytes are
    as their writer encoded them, so their own CRC-32 is not computed again (their length,
    version and flags still are checked).

    Cost: the headers are parsed as one numpy array and the CRC-32s of the frames not vouched
    for computed over arrays (:func:`~ftlayer.records.crc_arrays.crc32_ragged`; a payload over
    64 bytes takes one ``zlib.crc32`` call); the payload column is made with no Python object
    per frame (:func:`_payload_column`: binary views over ``blob``, each payload copied once by Arrow).
    """
    import numpy as np
    import pyarrow as pa

    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = int(starts.size)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=arrow_schema())

    def frame(i: int) -> bytes:
        return blob[int(starts[i]) : int(starts[i] + lengths[i])]

    short = np.flatnonzero(lengths < HEADER_SIZE)
    if short.size:
        raise _bad_frame(frame(int(short[0])), int(short[0]))
    buf = np.frombuffer(blob, dtype=np.uint8)
    # every frame's 48 header bytes, gathered as rows of a sliding window over the buffer (no index per byte)
    rows = np.lib.stride_tricks.sliding_window_view(buf, HEADER_SIZE)[starts]
    head = rows.view(header_dtype()).reshape(n)
    body = head["body_len"].astype(np.int64)
    bad = (body + 4 != lengths) | (body > _MAX_BODY) | (head["version"] != FRAME_VERSION) | (head["flags"] != 0)
    payload_starts, sizes = starts + HEADER_SIZE, lengths - HEADER_SIZE
    # each frame's CRC-32 unless its chunk's CRC vouched for it: its covered header bytes for all
    # such frames at once, continued over the payloads (the short ones as arrays too, crc32_ragged)
    check = None if vouched is None else np.flatnonzero(~np.asarray(vouched, dtype=bool))
    if check is None:
        covered = crc32_rows(rows[:, OFFSET_VERSION:OFFSET_CRC])
        bad |= crc32_ragged(blob, payload_starts, sizes, covered) != head["crc"]
    elif check.size:
        covered = crc32_rows(rows[check, OFFSET_VERSION:OFFSET_CRC])
        bad[check] |= crc32_ragged(blob, payload_starts[check], sizes[check], covered) != head["crc"][check]
    wrong = np.flatnonzero(bad)
    if wrong.size:
        raise _bad_frame(frame(int(wrong[0])), int(wrong[0]))
    schema = arrow_schema()
    payloads = _payload_column(blob, payload_starts, sizes, schema.field("payload").type)
    columns = {name: pa.array(head[field].astype(SOURCE_ROW.numpy_dtype(name)), schema.field(name).type)
               for name, field in _FROM_HEADER.items()}
    columns["payload"] = payloads
    return pa.RecordBatch.from_arrays([columns[name] for name in SOURCE_ROW.names], schema=schema)


#: Bytes an Arrow binary view holds inline (a longer value points into a data buffer instead).
_VIEW_INLINE = 12


def _payload_column(blob: bytes, starts: Any, sizes: Any, typ: Any) -> Any:
    """The payloads ``blob[starts[i] : starts[i] + sizes[i]]`` as one Arrow column of type ``typ``.

    Built as an Arrow *binary view* array over ``blob`` (16 bytes per value, made over numpy arrays:
    the value's length and either its bytes inline, up to 12, or its first 4 bytes and its offset in
    ``blob``), then cast to ``typ`` by Arrow, which copies each payload once in C. The profile of the
    read (issue 30, py-spy over warm pages) had the join of one memoryview slice per payload that
    this replaces at 29 % of the read step: two Python objects per record.
    """
    import numpy as np
    import pyarrow as pa

    n = int(starts.size)
    if len(blob) >= 1 << 31:  # a view's offset is 32 bits: join the slices instead
        view = memoryview(blob)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        data = b"".join(map(view.__getitem__, map(slice, starts.tolist(), (starts + sizes).tolist())))
        return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]).cast(typ)
    column = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(payload_views(blob, starts, sizes)),
                                                         pa.py_buffer(blob)])
    return column.cast(typ)


def payload_views(blob: bytes, starts: Any, sizes: Any) -> Any:
    """The views buffer (``n x 16`` bytes) of an Arrow ``binary_view`` array of the spans ``blob[starts[i] :
    starts[i] + sizes[i]]`` over data buffer 0 = ``blob``, as the Arrow format lays it out: length
    (i32), then up to 12 bytes inline (zero-padded) or the first 4 bytes, the buffer index (0) and
    the offset (i32). ``blob`` must be shorter than 2 GiB."""
    import numpy as np

    n = int(starts.size)
    buf = np.frombuffer(blob, dtype=np.uint8)
    views = np.zeros((n, 16), dtype=np.uint8)
    words = views.view("<i4")  # per value: length, then 12 inline bytes or (prefix, buffer 0, offset)
    words[:, 0] = sizes
    short = np.flatnonzero(sizes <= _VIEW_INLINE)
    if short.size:
        # bytes past a value's end are zero in its view (an index past the blob's end is clipped, then zeroed)
        at = np.minimum(starts[short, None] + np.arange(_VIEW_INLINE), len(blob) - 1)
        views[short, 4:] = np.where(np.arange(_VIEW_INLINE) < sizes[short, None], buf[at], 0)
    long_ = np.flatnonzero(sizes > _VIEW_INLINE)
    if long_.size:
        views[long_, 4:8] = np.lib.stride_tricks.sliding_window_view(buf, 4)[starts[long_]]
        words[long_, 3] = starts[long_]
    return views


def payload_run(column: Any) -> memoryview | None:
    """The payloads of a ``binary`` or ``large_binary`` column without nulls, back to back as Arrow
    holds them (its data buffer between the first and the last offset; a sliced column starts inside
    it), for ``unpack_run``; None for another type."""
    import numpy as np
    import pyarrow as pa

    if pa.types.is_binary(column.type):
        width = np.int32
    elif pa.types.is_large_binary(column.type):
        width = np.int64
    else:
        return None
    _, offsets_buf, data_buf = column.buffers()
    at = np.dtype(width).itemsize * column.offset  # a sliced column starts inside its buffers
    offsets = np.frombuffer(offsets_buf, dtype=width, count=len(column) + 1, offset=at)
    return memoryview(data_buf)[int(offsets[0]) : int(offsets[-1])]
