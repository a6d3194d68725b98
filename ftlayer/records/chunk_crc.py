"""One CRC-32 per chunk: a 4-byte trailer after a chunk's frames that vouches for all of them at once.

A chunk's frames value (``cf``, :mod:`ftlayer.records.chunks`) is its ``n`` entries back to back.
A writer that encoded every frame itself (ingest, replay, requeue, ``persist(records)``) appends

    ``crc u32`` (big-endian) = ``zlib.crc32`` of the ``n`` entries' bytes

so the value is ``entries | crc``. The reader (``runtime.spark.arrow_codec``) then checks one
``zlib.crc32`` over the chunk instead of one CRC-32 per frame; only if the trailer is missing or does
not match does it check every frame's own CRC, as before. Each frame keeps its own CRC: the
replayer, dead letters and requeue copy single frames out of a chunk and check them alone.

Why a trailer, not a prefix or a field of the chunk's state: every walker of a chunk's frames (the
Lua's ``chunk_frame``, :func:`ftlayer.records.chunks.frame_spans`, older readers) walks exactly ``n``
length prefixes from byte 0 and never looks past the ``n``-th entry, so a trailer changes nothing
for them: no Lua changes, chunks written before it still read (they have no trailer), and chunks
written with it read under older code. The state (``ck``) is rewritten by every flush that settles
records; the frames are written once, so the checksum lives beside the bytes it covers.

**When the trailer vouches:** the walk of the ``n`` entries ends exactly 4 bytes before the end of
the value and those 4 bytes equal the CRC-32 of everything before them. A chunk without a trailer
(written by older code, or by ``persist_frames`` from frames ftlayer did not encode: a trailer over
frames that fail their own checks would let the fast path pass them) ends its walk at the end of the
value: no vouching, per-frame checks. A damaged byte anywhere (an entry, a length prefix, the
trailer) either moves the walk's end, which then no longer lies 4 bytes before the end except by
chance, or leaves it and changes the covered bytes or the stored CRC: either way the CRC disagrees
(CRC-32 catches every burst of up to 32 bits; anything else passes with probability 2**-32, the
same bound a frame's own CRC gives), so the reader falls back to the per-frame checks, which find
the damaged frame (or none, if only the trailer was hit).
"""

from __future__ import annotations

import struct
import zlib

__all__ = ["CHUNK_CRC_BYTES", "trailer", "vouches"]

#: Bytes of the trailer after a chunk's entries.
CHUNK_CRC_BYTES = 4
_U32 = struct.Struct(">I")


def trailer(entries: bytes | memoryview) -> bytes:
    """The trailer to append to ``entries`` (a chunk's ``n`` entries back to back, every frame
    encoded by the caller itself; see the module notes): their CRC-32, 4 bytes big-endian."""
    return _U32.pack(zlib.crc32(entries))


def vouches(frames: bytes | memoryview, end: int) -> bool:
    """Whether a chunk's frames value, whose ``n`` entries' walk ended at byte ``end``, carries
    a trailer that matches them: if so every entry is exactly as its writer encoded it."""
    if len(frames) != end + CHUNK_CRC_BYTES:
        return False
    view = memoryview(frames)
    stored: int = _U32.unpack_from(view, end)[0]
    return zlib.crc32(view[:end]) == stored
