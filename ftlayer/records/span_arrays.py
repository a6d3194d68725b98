"""Where a chunk's pending records lie in its frames, as numpy arrays (the FT source's read path).

:func:`ftlayer.records.chunks.pending_spans` yields ``(sid, start, end)`` per pending record, a
Python step (and a generator step) per record. The DataFrame path's read tasks need the same
spans for every record of a micro-batch, so :func:`pending_span_arrays` gives them as three
arrays: the length-prefix walk is still one loop step per entry (each frame's place depends on
the one before), but the pending test, the cut and the ids are array operations.

Contract: for any chunk as read (``ck`` state, ``cf`` frames) and any cut, the arrays hold
exactly what ``pending_spans`` yields, filtered by the cut, in the same (index) order, damaged
frames included (a length running past the end gives the empty spans ``frame_spans`` gives, so
the reader's checks name the record). A state whose settled bitmap is shorter than its record
count raises ``IndexError``, as ``pending_spans`` does.

:func:`checked_span_arrays` gives the same arrays and whether the chunk's CRC trailer
(:mod:`ftlayer.records.chunk_crc`) vouches for its frames: one ``zlib.crc32`` over the chunk, after
the walk that finds where its entries end; :func:`chunk_span_arrays` adds the chunk's columns
section (``ftlayer.records.chunk_columns``) and the pending records' indexes, for a columnar read.
"""

from __future__ import annotations

import struct
from typing import Any, NamedTuple

from ftlayer.records.chunk_crc import section_edges, split_trailer
from ftlayer.records.chunks import ChunkState, frame_spans, sid_at

__all__ = ["ChunkSpans", "checked_span_arrays", "chunk_span_arrays", "pending_span_arrays"]

_U32 = struct.Struct(">I")


def _bounds(frames: bytes | memoryview, n: int) -> list[int] | None:
    """``n + 1`` entry boundaries of a sound chunk (entry ``i`` is ``[b[i], b[i+1])``), or ``None``
    if a length prefix is cut short or runs past the end (then ``frame_spans`` says what is left)."""
    unpack = _U32.unpack_from
    out = [0] * (n + 1)
    pos = 0
    try:
        for i in range(1, n + 1):
            pos += 4 + unpack(frames, pos)[0]
            out[i] = pos
    except struct.error:
        return None
    return out if pos <= len(frames) else None


def pending_span_arrays(key: bytes, state: bytes, frames: bytes | memoryview,
                        cut: tuple[int, int] | None = None) -> tuple[Any, Any, Any]:
    """``(sids, starts, ends)`` (``int64`` arrays) of the pending records of a chunk whose index
    ``i`` lies in ``cut = (lo, hi]`` (every index without a cut); see the module contract."""
    return _span_arrays(key, state, frames, cut, check=False)[:3]


def checked_span_arrays(key: bytes, state: bytes, frames: bytes | memoryview,
                        cut: tuple[int, int] | None = None) -> tuple[Any, Any, Any, bool]:
    """:func:`pending_span_arrays` and whether the chunk's CRC trailer vouches for every frame of
    the chunk (``ftlayer.records.chunk_crc.split_trailer``: False for a chunk without one, or a damaged one)."""
    return _span_arrays(key, state, frames, cut, check=True)[:4]


class ChunkSpans(NamedTuple):
    """:func:`checked_span_arrays` of one chunk, and what a columnar read needs: ``section``, the
    chunk's sound columns section ``(fingerprint, body)`` (``ftlayer.records.chunk_columns``) or
    None (also when no record of the chunk is returned); ``rows``, the index in the chunk of each
    pending record returned (``int64``); ``n``, the chunk's record count."""

    sids: Any
    starts: Any
    ends: Any
    vouched: bool
    section: tuple[bytes, memoryview] | None
    rows: Any
    n: int


def chunk_span_arrays(key: bytes, state: bytes, frames: bytes | memoryview,
                      cut: tuple[int, int] | None = None) -> ChunkSpans:
    """:func:`checked_span_arrays` with the chunk's columns section (see :class:`ChunkSpans`)."""
    return ChunkSpans(*_span_arrays(key, state, frames, cut, check=True))


def _span_arrays(key: bytes, state: bytes, frames: bytes | memoryview, cut: tuple[int, int] | None, *,
                 check: bool) -> tuple[Any, Any, Any, bool, tuple[bytes, memoryview] | None, Any, int]:
    import numpy as np

    st = ChunkState.parse(state)
    n = st.n
    if len(st.settled) * 8 < n:
        msg = f"chunk {key.hex()}: a settled bitmap of {len(st.settled)} bytes for {n} records"
        raise IndexError(msg)
    # a columnar chunk whose CRCs match carries its entries' edges: no walk (ftlayer.records.chunk_crc)
    found = section_edges(frames, n) if check and n else None
    bounds = None if found is not None else _bounds(frames, n)
    if found is not None:
        edges = found[0]
        starts, ends = edges[:-1], edges[1:]
    elif bounds is None:  # a damaged length: the frames' own checks name the records it hides
        pairs = np.asarray(frame_spans(frames, n), dtype=np.int64).reshape(n, 2)
        starts, ends = pairs[:, 0], pairs[:, 1]
    else:
        edges = np.asarray(bounds, dtype=np.int64)
        starts, ends = edges[:-1], edges[1:]
    keep = np.unpackbits(np.frombuffer(st.settled, dtype=np.uint8), count=n, bitorder="little") == 0
    index = np.arange(n, dtype=np.int64)
    if cut is not None:
        keep &= (index > cut[0]) & (index <= cut[1])
    at = np.flatnonzero(keep)
    # the CRC only for a chunk with records to read (the walk must have ended where the entries end)
    if found is not None:
        sound, section = at.size > 0, (found[1] if at.size > 0 else None)
    else:
        sound, section = (split_trailer(frames, bounds[n]) if check and bounds is not None and at.size > 0
                          else (False, None))
    return np.int64(sid_at(key, 0)) | index[at], starts[at], ends[at], sound, section, at, n
