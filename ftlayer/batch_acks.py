"""Batch acks: complete a micro-batch's source records without carrying XOR deltas.

The DataFrame path lets records flow through Spark operators that ftlayer does
not wrap (filter, explode, joins, aggregations), so no per-edge XOR can be
kept. Instead:

- each read task files the source record ids it emitted for micro-batch ``b``
  of streaming query ``q`` with :meth:`BatchAcks.record` (one ``RPUSH`` per page
  of a task into ``dfb:<q>:<b>`` of the source, as one bitmap of emitted records
  per chunk (``ftlayer.chunks``), elements of at most :data:`CHUNKS_PER_ELEMENT`
  chunks; plus the source's name in the query's ``dfq:<q>`` set, same round trip);
- the acking point, once the batch's write succeeded, calls :meth:`settle`
  with ``mode="ack"``: every listed record still pending completes (its rows
  were written, or all filtered out); one whose write failed calls it with
  ``mode="fail"``: every listed record still pending fails (replayed with
  backoff, then dead-lettered).

Contract: settling is idempotent (records no longer pending are skipped, and
the key empties as it is settled), so a record failed earlier by a row function
or a timeout is never acked by its batch, and an id filed twice (a retried
task) settles once. Work per server call is bounded (:data:`ELEMENTS_PER_CALL`
list elements). A key never settled (the query stopped mid-batch) expires after
:data:`BATCH_KEY_TTL_S`; its records time out and are replayed as usual.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Literal

import redis

from ftlayer.chunks import chunk_key, index_of
from ftlayer.keys import query_sources_key
from ftlayer.store import SourceStore

__all__ = ["BATCH_KEY_TTL_S", "CHUNKS_PER_ELEMENT", "ELEMENTS_PER_CALL", "BatchAcks", "chunk_bitmaps",
           "query_sources"]

CHUNKS_PER_ELEMENT = 16  # chunk bitmaps per list element: bounds one element's work in the script
ELEMENTS_PER_CALL = 16  # list elements per BATCH_SETTLE call: at most 256 chunks per call
BATCH_KEY_TTL_S = 7 * 24 * 3600  # an unsettled batch key is garbage after this (its records timed out long ago)


def chunk_bitmaps(sids: Sequence[int]) -> list[bytes]:
    """``[chunk id 6][bitmap length u16][bitmap]`` for each chunk the ids fall in, in first-seen
    order (bit ``i``: record ``i`` of the chunk is listed). An id listed twice sets its bit once."""
    groups: dict[bytes, bytearray] = {}
    for sid in sids:
        key, i = chunk_key(sid), index_of(sid)
        bits = groups.get(key)
        if bits is None:
            bits = groups[key] = bytearray()
        need = (i >> 3) + 1
        if len(bits) < need:
            bits.extend(bytes(need - len(bits)))
        bits[i >> 3] |= 1 << (i & 7)
    return [key + struct.pack(">H", len(bits)) + bytes(bits) for key, bits in groups.items()]


class BatchAcks:
    """Files and settles the record ids of micro-batches for one source."""

    def __init__(self, store: SourceStore) -> None:
        self.store = store

    @property
    def source_name(self) -> str:
        k = self.store.keys
        return f"{k.topology}/{k.source}"

    def record(self, query_id: str, batch_id: int, sids: Sequence[int]) -> None:
        """File ``sids`` as emitted by a read task of ``batch_id`` of ``query_id`` (one round trip).

        Must return before the rows are handed to Spark, so a written row's
        record is always listed when its batch settles.
        """
        if not sids:
            return
        key = self.store.keys.batch_reads(query_id, batch_id)
        ttl_ms = BATCH_KEY_TTL_S * 1000
        qkey = query_sources_key(self.store.config.namespace, query_id)
        pieces = chunk_bitmaps(sids)
        elements = [b"".join(pieces[i : i + CHUNKS_PER_ELEMENT]) for i in range(0, len(pieces), CHUNKS_PER_ELEMENT)]
        pipe = self.store.client.pipeline(transaction=False)
        pipe.rpush(key, *elements)
        pipe.pexpire(key, ttl_ms)
        pipe.sadd(qkey, self.source_name)
        pipe.pexpire(qkey, ttl_ms)
        pipe.execute()

    def settle(self, query_id: str, batch_id: int, mode: Literal["ack", "fail"], reason: str = "") -> int:
        """Ack or fail every still-pending record filed for the batch; returns how many.

        Loops over bounded script calls until the batch key is empty (and so deleted).
        """
        s = self.store
        keys = [*s.state_keys, s.keys.batch_reads(query_id, batch_id)]
        total = 0
        while True:
            settled, left = s.run(
                "BATCH_SETTLE", keys,
                [s.keys.prefix, mode, ELEMENTS_PER_CALL, reason or f"batch {batch_id} failed", s.now_ms(),
                 *s.backoff_args()],
            )
            total += int(settled)
            if int(left) == 0:
                return total


def query_sources(client: redis.Redis, namespace: str, query_id: str) -> list[str]:
    """``topology/source`` names the DataFrame path's read tasks of ``query_id`` filed ids for."""
    members: Iterable[bytes | str] = client.smembers(query_sources_key(namespace, query_id))
    return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
