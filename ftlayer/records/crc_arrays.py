"""``zlib.crc32`` of many byte rows at once, over numpy arrays: rows of one length
(:func:`crc32_rows`) and rows of many (:func:`crc32_ragged`, the reader's payloads).

Every frame carries ``zlib.crc32(payload, zlib.crc32(header[4:44]))``
(:mod:`ftlayer.records.frames`). The reader (``runtime.spark.arrow_codec``) checks the frames of a
page that no chunk CRC vouched for (``ftlayer.records.chunk_crc``: chunks of older code, or damaged
ones) at once: the 40 covered header bytes have the same length in every frame, so their CRC-32 is
:func:`crc32_rows` (slicing-by-4: one table step per 4 bytes, two lookups in 16-bit tables, for all
rows at once), and :func:`crc32_ragged` continues it over the payloads of different lengths. Ingest
writes small batches, where two ``zlib.crc32`` calls a frame cost less than the arrays' set-up
(``ftlayer.records.chunk_encoding``). The values are exactly ``zlib.crc32``'s (the same
polynomial, 0xEDB88320 reflected, initial and final XOR 0xFFFFFFFF); property-tested against it.
"""

from __future__ import annotations

import functools
import zlib
from typing import Any

__all__ = ["RAGGED_MAX_BYTES", "crc32_ragged", "crc32_rows"]

#: :func:`crc32_ragged` steps rows up to this long as arrays; a longer row takes one ``zlib.crc32`` call,
#: which beats an array step per 4 bytes from about here on (20-byte to 1 KiB payloads, 2026-11-26)
RAGGED_MAX_BYTES = 64
_POLY = 0xEDB88320
_ALL_ONES = 0xFFFFFFFF


@functools.cache
def _tables() -> tuple[Any, Any, Any]:
    """The byte table ``t0`` (``t0[b]``: the register after byte ``b``) and the two 16-bit tables of a
    4-byte step: after XOR-ing a little-endian word into the register ``c``, the next register is
    ``lo[c & 0xFFFF] ^ hi[c >> 16]`` (slicing-by-4 with two lookups instead of four)."""
    import numpy as np

    t = np.zeros((4, 256), dtype=np.uint32)  # t[k][b]: byte b, then k zero bytes
    for b in range(256):
        c = b
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        t[0, b] = c
    for k in range(1, 4):
        t[k] = (t[k - 1] >> 8) ^ t[0][t[k - 1] & 0xFF]
    x = np.arange(1 << 16, dtype=np.uint32)
    lo = t[3][x & 0xFF] ^ t[2][x >> 8]  # bytes 0 and 1 of the word
    hi = t[1][x & 0xFF] ^ t[0][x >> 8]  # bytes 2 and 3
    for table in (t, lo, hi):
        table.setflags(write=False)
    return t[0], lo, hi


def crc32_rows(rows: Any) -> Any:
    """``zlib.crc32(bytes(row))`` of every row of a 2-D ``uint8`` array, as a ``uint32`` array.

    Any row length works; a length that is a multiple of 4 takes one step per 4 bytes, the
    rest one step per byte.
    """
    import numpy as np

    data = np.ascontiguousarray(rows, dtype=np.uint8)
    if data.ndim != 2:
        msg = f"crc32_rows needs a 2-D array of rows, got {data.ndim} dimensions"
        raise ValueError(msg)
    n, width = data.shape
    t0, lo, hi = _tables()
    crc = np.full(n, _ALL_ONES, dtype=np.uint32)
    words = width // 4
    if words and n:
        block = data if 4 * words == width else np.ascontiguousarray(data[:, : 4 * words])
        view = block.view("<u4")  # little-endian words: the first byte in the low bits, as the register takes it
        for j in range(words):
            c = crc ^ view[:, j]
            crc = np.take(lo, c & 0xFFFF) ^ np.take(hi, c >> 16)
    for j in range(4 * words, width):
        crc = np.take(t0, (crc ^ data[:, j]) & 0xFF) ^ (crc >> 8)
    return crc ^ np.uint32(_ALL_ONES)


def crc32_ragged(blob: bytes | memoryview, starts: Any, lengths: Any, init: Any) -> Any:
    """``zlib.crc32(blob[s : s + n], i)`` of every row ``(s, n, i)`` of ``starts``, ``lengths`` and
    ``init`` (the CRC so far: a frame's payload continues its header's), as a ``uint32`` array.

    The reader's frame check (``runtime.spark.arrow_codec``): the payloads differ in length, so
    the rows are taken longest first and step ``j`` (bytes ``4j .. 4j+3``) runs over the rows that
    are that long, one array step for all of them; the last 0 to 3 bytes of each row take a byte
    step each. Rows over :data:`RAGGED_MAX_BYTES` take one ``zlib.crc32`` call each. Every row
    must lie inside ``blob`` (``IndexError`` otherwise); the values are exactly ``zlib.crc32``'s.
    """
    import numpy as np

    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    init = np.asarray(init, dtype=np.uint32)
    n = int(starts.size)
    out = np.empty(n, dtype=np.uint32)
    if n == 0:
        return out
    if int(starts.min()) < 0 or int(lengths.min()) < 0 or int((starts + lengths).max()) > len(blob):
        msg = f"crc32_ragged: a row outside the {len(blob)}-byte buffer"
        raise IndexError(msg)
    long_rows = np.flatnonzero(lengths > RAGGED_MAX_BYTES)
    if long_rows.size:
        view = memoryview(blob)
        spans = map(slice, starts[long_rows].tolist(), (starts + lengths)[long_rows].tolist())
        out[long_rows] = np.fromiter(map(zlib.crc32, map(view.__getitem__, spans), init[long_rows].tolist()),
                                     dtype=np.uint32, count=int(long_rows.size))
    rows = np.flatnonzero(lengths <= RAGGED_MAX_BYTES)
    rows = rows[np.argsort(-lengths[rows], kind="stable")]  # longest first: step j runs over a prefix
    at, size = starts[rows], lengths[rows]
    crc = init[rows] ^ np.uint32(_ALL_ONES)
    t0, lo, hi = _tables()
    words = size // 4
    if rows.size and int(words[0]):
        # every 4 bytes from any offset as a little-endian word (numpy reads the unaligned ones)
        word_at = np.ndarray(shape=(len(blob) - 3,), dtype="<u4", buffer=blob, strides=(1,))
        longer = np.searchsorted(-words, -np.arange(1, int(words[0]) + 1), side="right")  # rows with > j words
        for j, k in enumerate(longer.tolist()):
            c = crc[:k] ^ word_at[at[:k] + 4 * j]
            crc[:k] = np.take(lo, c & 0xFFFF) ^ np.take(hi, c >> 16)
    data = np.frombuffer(blob, dtype=np.uint8)
    rest = size - 4 * words
    for b in range(3):
        left = np.flatnonzero(rest > b)
        if not left.size:
            break
        c = crc[left]
        crc[left] = np.take(t0, (c ^ data[at[left] + 4 * words[left] + b]) & 0xFF) ^ (c >> 8)
    out[rows] = crc ^ np.uint32(_ALL_ONES)
    return out
