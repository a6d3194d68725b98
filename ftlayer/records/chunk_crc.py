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

**A columns section may follow the trailer** (:mod:`ftlayer.records.chunk_columns`: the chunk's records
as Arrow columns, written at ingest for a source with a schema): ``ipc | edges | footer``, where
``edges`` are the ``n + 1`` entry boundaries (u32 big-endian: 0, the end of entry 0, ..., ``end``)
and the footer ``fingerprint (8) | crc u32 | ipc length u32 | edges length u32 | "FTc1"``, the CRC
being ``zlib.crc32(ipc | edges)``. It is found from the value's end. :func:`split_trailer` (after a
walk) accepts it only whole (magic and lengths adding up exactly to the value's end) and after a
matching trailer, and checks the section's own CRC apart: damage inside the section's IPC body or
edges costs the columns only (the frames are decoded instead); damage to its footer's magic or
lengths makes the value one ftlayer did not write, and the frames lose their vouching too (every
frame is checked on its own: slower, never wrong). The footer's fingerprint is covered by no CRC: a
damaged one turns the section off (a match with another schema's is a 2**-64 chance).
:func:`section_edges` reads a sound section's edges instead of walking the ``n`` length prefixes,
which is what lets a columnar read skip the one Python step per record left; it takes them only
where every edge lands on the length prefix of an entry that ends at the next edge (one array step),
so edges that disagree with the frames cost the walk, never a frame. :func:`vouches` (the exact
trailer alone) is what code before columnar chunks checked: it sees a columnar chunk as unvouched
and checks every frame.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

__all__ = ["CHUNK_CRC_BYTES", "COLUMNS_FOOTER", "COLUMNS_MAGIC", "section_edges", "split_trailer", "trailer", "vouches"]

#: Bytes of the trailer after a chunk's entries.
CHUNK_CRC_BYTES = 4
#: The last 4 bytes of a chunk's frames value that ends with a columns section.
COLUMNS_MAGIC = b"FTc1"
#: A columns section's fixed end: its schema's fingerprint, the CRC-32 of its IPC body and edges, their
#: lengths, the magic.
COLUMNS_FOOTER = struct.Struct(">8sIII4s")
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


def _section(view: memoryview, n: int | None) -> tuple[bytes, int, int, int] | None:
    """``(fingerprint, section start, ipc length, edges length)`` of a value's columns section whose
    footer adds up (magic, lengths within the value, edges for ``n`` entries if given) and whose CRC
    matches; None otherwise. The entries' trailer is the 4 bytes before the section's start."""
    size = len(view)
    if size < COLUMNS_FOOTER.size + CHUNK_CRC_BYTES:
        return None
    fingerprint, crc, ipc_len, edges_len, magic = COLUMNS_FOOTER.unpack_from(view, size - COLUMNS_FOOTER.size)
    start = size - COLUMNS_FOOTER.size - ipc_len - edges_len
    if magic != COLUMNS_MAGIC or start < CHUNK_CRC_BYTES or edges_len % 4:
        return None
    if n is not None and edges_len != 4 * (n + 1):
        return None
    if zlib.crc32(view[start : size - COLUMNS_FOOTER.size]) != crc:
        return None
    return fingerprint, start, ipc_len, edges_len


def split_trailer(frames: bytes | memoryview, end: int) -> tuple[bool, tuple[bytes, memoryview] | None]:
    """For a chunk's frames value whose ``n`` entries' walk ended at byte ``end``: whether its CRC
    trailer vouches for the entries (as :func:`vouches`, a columns section after it allowed), and
    that section as ``(fingerprint, ipc body)`` if it is sound (None: no section, or a damaged one)."""
    view = memoryview(frames)
    rest = len(view) - end - CHUNK_CRC_BYTES
    if rest < 0 or 0 < rest < COLUMNS_FOOTER.size:
        return False, None
    section = None
    if rest:
        _, _, ipc_len, edges_len, magic = COLUMNS_FOOTER.unpack_from(view, len(view) - COLUMNS_FOOTER.size)
        if magic != COLUMNS_MAGIC or ipc_len + edges_len != rest - COLUMNS_FOOTER.size:
            return False, None  # not a section ftlayer wrote: every frame is checked on its own
        found = _section(view, None)
        if found is not None:
            section = (found[0], view[found[1] : found[1] + found[2]])
    stored: int = _U32.unpack_from(view, end)[0]
    if zlib.crc32(view[:end]) != stored:
        return False, None
    return True, section


def section_edges(frames: bytes | memoryview, n: int) -> tuple[Any, tuple[bytes, memoryview]] | None:
    """For a chunk of ``n`` records with a sound columns section and a matching CRC trailer before
    it: the entries' ``n + 1`` boundaries (an ``int64`` array, read from the section, no walk, each
    checked against the length prefix found there) and the section as ``(fingerprint, ipc body)``.
    None if any of that does not hold (the caller walks)."""
    import numpy as np

    view = memoryview(frames)
    found = _section(view, n)
    if found is None:
        return None
    fingerprint, start, ipc_len, edges_len = found
    end = start - CHUNK_CRC_BYTES
    edges = np.frombuffer(view[start + ipc_len : start + ipc_len + edges_len], dtype=">u4").astype(np.int64)
    if edges[0] != 0 or edges[-1] != end or (n and int(np.diff(edges).min()) < 4):
        return None
    if n:  # each edge must be where the walk would put it: the entry there is its length prefix and body
        entries = np.frombuffer(view[:end], dtype=np.uint8)
        prefix = entries[edges[:-1, None] + np.arange(4)].astype(np.int64)
        lengths = (prefix[:, 0] << 24) | (prefix[:, 1] << 16) | (prefix[:, 2] << 8) | prefix[:, 3]
        if not np.array_equal(lengths, np.diff(edges) - 4):
            return None
    stored: int = _U32.unpack_from(view, end)[0]
    if zlib.crc32(view[:end]) != stored:
        return None
    return edges, (fingerprint, view[start : start + ipc_len])
