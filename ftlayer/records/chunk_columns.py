"""Columnar chunks: a chunk's records as Arrow columns, kept after its frames (issue 30).

A source ingested with a schema (``ftlayer.ingest(..., schema=...)``) has every record's value
decoded into typed columns at ingest anyway: that is how the schema is checked. The chunk then
keeps those columns beside its frames, so the DataFrame path's read hands Spark the stored
columns instead of unpacking each payload again. The frames stay exactly as they are: the Lua
copies a failed record's frame out of its chunk for replay and dead letters as before, and a
replayed record is filed under a new id in a chunk of its own, without columns (read from its
frame).

**Layout.** A chunk's frames value (``cf``) is ``entries | crc`` (:mod:`ftlayer.records.chunk_crc`);
a columnar chunk appends one *columns section*::

    ipc | edges | fingerprint (8 bytes) | crc u32 | ipc length u32 | edges length u32 | "FTc1"

``ipc`` is one Arrow IPC record-batch message (``RecordBatch.serialize``: no schema) of the
chunk's ``n`` records in index order; ``edges`` the ``n + 1`` boundaries of the entries (u32
big-endian), so a reader finds each frame without walking the length prefixes; ``fingerprint``
names the Arrow schema the values were written with (:func:`schema_fingerprint`: 8 bytes of
BLAKE2b over the serialized schema: names, types, nullability and field metadata, such as a
Spark ``COMMENT`` or a ``char``/``varchar`` length); ``crc`` is ``zlib.crc32(ipc | edges)``; all
big-endian. The section is found from the end of the value (``chunk_crc.section_edges``, ``chunk_crc.split_trailer``),
so every walker of the ``n`` entries (the Lua, ``frame_spans``) is unchanged.

**Contract.**

- *Only where the frames are vouched for.* :func:`attach_columns` takes chunks as
  ``encode_source_chunks`` makes them, whose frames end with their CRC (it does not check that);
  ``split_trailer`` finds a section only after a matching CRC trailer. Older code
  sees a value whose trailer no longer lies 4 bytes before the end and checks every frame's own CRC:
  slower, never wrong. A chunk re-keyed because its id was in use keeps its section (the section
  holds values only: ids are the chunk's base plus the row).
- *Used only when it is exactly what the read would decode.* The reader passes the fingerprint of
  the schema it reads with; a section written with another schema, with a CRC that does not match,
  a length that does not add up, or a row count other than the chunk's is ignored and the frames are
  decoded instead (the result is the same; only the cost differs).
- *Cost.* In Redis, the columns' bytes beside the payloads' (for small records about three
  quarters as much again) and 4 bytes of edges per record. A chunk whose section would take more
  than :data:`SECTION_MAX_FACTOR` times its entries' bytes, plus 4 KiB, keeps none and is read from
  its payloads: Arrow's values are fixed-width where msgpack's small ints take a byte, so an array of
  small ints takes about 8 times. At ingest, a ``take`` and one ``serialize`` per chunk (about 0.1 to
  0.3 µs a record); at read, one ``read_record_batch`` per chunk in place of a length-prefix walk and
  a msgpack unpack per record.
- *Never a substitute for the frames' checks.* The frames' CRC trailer still vouches for ids, key
  hashes and every byte Lua copies out.
- pure: no Redis; pyarrow is imported by the functions that use it.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from typing import Any

from ftlayer.records.chunk_crc import COLUMNS_FOOTER, COLUMNS_MAGIC
from ftlayer.records.chunks import CHUNK_IN_HEADER, PackedChunk
from ftlayer.records.frames import BODY_FIXED_SIZE

__all__ = ["SECTION_MAX_FACTOR", "SECTION_SLACK_BYTES", "attach_columns", "columns_section", "read_columns",
           "schema_fingerprint"]

#: A chunk keeps its columns section only while the section takes at most this many times its entries'
#: bytes, plus :data:`SECTION_SLACK_BYTES` (an IPC message's own few hundred bytes, which a chunk of a
#: few records would otherwise exceed).
SECTION_MAX_FACTOR = 2
SECTION_SLACK_BYTES = 4096


def schema_fingerprint(schema: Any) -> bytes:
    """8 bytes naming a ``pyarrow.Schema`` (names, types, nullability, metadata): equal schemas give
    equal fingerprints; two different ones collide with probability about 2**-64."""
    serialized: bytes = schema.serialize().to_pybytes()
    return hashlib.blake2b(serialized, digest_size=8).digest()


def columns_section(batch: Any, edges: Any, fingerprint: bytes) -> bytes:
    """The columns section of a chunk whose records are ``batch``'s rows, in index order, and whose
    entries' boundaries are ``edges`` (``n + 1`` integers: 0, then each entry's end)."""
    import numpy as np

    body: bytes = batch.serialize().to_pybytes()
    bounds = np.asarray(edges, dtype=">u4").tobytes()
    crc = zlib.crc32(bounds, zlib.crc32(body))
    return b"".join((body, bounds, COLUMNS_FOOTER.pack(fingerprint, crc, len(body), len(bounds), COLUMNS_MAGIC)))


def attach_columns(chunks: Sequence[PackedChunk], channels: Sequence[int], columns: Any,
                   payload_sizes: Sequence[int]) -> list[PackedChunk]:
    """``chunks`` (new source records, as :func:`ftlayer.records.chunk_encoding.encode_source_chunks`
    made them from a batch whose record ``i`` is in channel ``channels[i]`` and has a payload of
    ``payload_sizes[i]`` bytes) each with the columns section of its records: row ``i`` of the
    record batch ``columns`` is record ``i``'s value.

    The chunking rule places a channel's records in batch order, chunk after chunk, channels in
    ascending order; so chunk ``k`` holds the records of the stable sort by channel between the
    counts of the chunks before it and its own. Each entry is its length prefix, the fixed part of
    its frame and its payload, so the edges follow from the payloads' sizes."""
    import numpy as np
    import pyarrow as pa

    n = len(channels)
    if columns.num_rows != n or len(payload_sizes) != n or sum(c.records for c in chunks) != n:
        msg = (f"{columns.num_rows} rows of columns and {len(payload_sizes)} payload sizes for a batch of "
               f"{n} records in {sum(c.records for c in chunks)} chunks")
        raise ValueError(msg)
    order = np.argsort(np.asarray(channels, dtype=np.int64), kind="stable")
    entry_sizes = np.asarray(payload_sizes, dtype=np.int64)[order] + (4 + BODY_FIXED_SIZE)
    fingerprint = schema_fingerprint(columns.schema)
    out = []
    start = 0
    for chunk in chunks:
        end = start + chunk.records
        if end - start == n:
            rows = columns if bool((order == np.arange(n)).all()) else columns.take(pa.array(order))
        else:
            rows = columns.take(pa.array(order[start:end]))
        edges = np.zeros(end - start + 1, dtype=np.int64)
        np.cumsum(entry_sizes[start:end], out=edges[1:])
        section = columns_section(rows, edges, fingerprint)
        # a chunk's frames are bounded (CHUNK_MAX_BYTES), its columns only by its values: fixed-width
        # Arrow values can take 8 times the msgpack bytes (an array of small ints), so past this a chunk
        # is kept without columns, read from its payloads
        out.append(_with_section(chunk, section)
                   if len(section) <= SECTION_MAX_FACTOR * int(edges[-1]) + SECTION_SLACK_BYTES else chunk)
        start = end
    return out


def _with_section(chunk: PackedChunk, section: bytes) -> PackedChunk:
    key, n, channel, pending, flen = CHUNK_IN_HEADER.unpack_from(chunk.blob)
    header = CHUNK_IN_HEADER.pack(key, n, channel, pending, flen + len(section))
    return PackedChunk(chunk.key, header + chunk.blob[CHUNK_IN_HEADER.size :] + section, chunk.sids)


def read_columns(body: bytes | memoryview, schema: Any, rows: int) -> Any:
    """The record batch of a columns section's ``body`` read as ``schema`` (whose fingerprint the
    section carries), or None if it does not hold exactly ``rows`` rows or does not parse."""
    import pyarrow as pa

    try:
        batch = pa.ipc.read_record_batch(pa.py_buffer(body), schema)
        batch.validate()
    except (pa.ArrowException, ValueError, EOFError, OSError):  # a section this code cannot read: decode instead
        return None
    return batch if batch.num_rows == rows else None
