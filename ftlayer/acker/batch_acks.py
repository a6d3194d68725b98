"""Batch acks: complete a micro-batch's source records without carrying XOR deltas.

The DataFrame path lets records flow through Spark operators that ftlayer does
not wrap (filter, explode, joins, aggregations), so no per-edge XOR can be
kept. Instead:

- each read task files the source record ids it emitted for the micro-batch
  ``tag`` (:func:`batch_tag` of the batch's end offset, which the FT source's
  driver-side reader also knows) with :meth:`BatchAcks.record`: one ``RPUSH``
  per page into ``dfb:<tag>`` of the source, as one bitmap of emitted records
  per chunk (``ftlayer.records.chunks``), elements of at most :data:`CHUNKS_PER_ELEMENT`
  chunks; plus ``"topology/source tag"`` in the batch's index
  ``dfq:<query id>:<batch id>`` (same round trip), so a driver that knows
  Spark's query and batch ids finds the tags (:func:`batch_tags`). A read task
  that Spark gave no query id (Spark Connect runs a ``foreachBatch`` function's
  jobs outside the query's thread) lists it under the batch token its job
  carries instead, ``dfk:<token>`` (:func:`token_tags`; ``runtime.spark.connect``);
- once Spark has **committed** the batch (its commit log entry is written), the
  records are settled with ``mode="ack"``: every listed record still pending
  completes (its rows were written, folded into committed state, or all
  filtered out). Spark calls the reader's ``latestOffset(start)`` with the
  committed end as ``start``, and its listener reports the batch; both settle
  (``runtime.spark.ft_source``, ``runtime.dataframe.commits``). An acking point
  whose write failed settles with ``mode="fail"``: every listed record still
  pending fails (replayed with backoff, then dead-lettered).

Contract: settling is idempotent (records no longer pending are skipped, and
the key empties as it is settled), so a record failed earlier by a row function
or a timeout is never acked by its batch, and an id filed twice (a retried
task, or the re-run of an uncommitted batch, which has the same end offset and
so the same tag) settles once. Work per server call is bounded
(:data:`ELEMENTS_PER_CALL` list elements). A key never settled (the query
stopped mid-batch) expires after :data:`BATCH_KEY_TTL_S`; its records time out
and are replayed as usual.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

import redis

from ftlayer.keyspace.keys import query_batch_key, token_batch_key
from ftlayer.records.chunks import CHUNK_KEY_BYTES, INDEX_BITS
from ftlayer.scripting.lua_script import STATE_KEYS, LuaScript
from ftlayer.store.source_store import SourceStore

__all__ = ["BATCH_KEY_TTL_S", "CHUNKS_PER_ELEMENT", "ELEMENTS_PER_CALL", "BatchAcks", "batch_tag", "batch_tags",
           "chunk_bitmaps", "token_tags"]

CHUNKS_PER_ELEMENT = 16  # chunk bitmaps per list element: bounds one element's work in the script
ELEMENTS_PER_CALL = 16  # list elements per BATCH_SETTLE call: at most 256 chunks per call
BATCH_KEY_TTL_S = 7 * 24 * 3600  # an unsettled batch key is garbage after this (its records timed out long ago)

# The script this module runs (ftlayer.scripting.lua_script: its KEYS and ARGV, checked at each call)
BATCH_SETTLE = LuaScript(
    "BATCH_SETTLE", keys=(*STATE_KEYS, "dfb:*", "rpl?", "dfs:*?"),
    argv=("prefix", "mode", "max_elements", "reason", "now_ms", "backoff_initial_ms", "backoff_multiplier",
          "backoff_max_ms"),
)


def batch_tag(end_offset: Mapping[str, str]) -> str:
    """The name of the micro-batch that ends at ``end_offset`` (an FT source offset): 16 hex digits.

    Pure: the driver-side reader (which sees offsets, not Spark's batch ids), every read task
    and a re-run of the same uncommitted batch after a restart all compute the same tag.
    """
    canonical = json.dumps({str(k): str(v) for k, v in end_offset.items()}, sort_keys=True)
    return hashlib.sha1(canonical.encode(), usedforsecurity=False).hexdigest()[:16]


DENSE_IDS_PER_CHUNK = 16  # below this many ids a chunk on average, chunk_bitmaps loops over the ids


def _bitmaps_by_id(keys: list[int], index: list[int]) -> list[bytes]:
    """:func:`chunk_bitmaps` one id at a time (``keys``: the ids' chunk ids, ``index``: their indexes)."""
    groups: dict[int, bytearray] = {}
    for key, i in zip(keys, index, strict=True):
        bits = groups.get(key)
        if bits is None:
            bits = groups[key] = bytearray()
        need = (i >> 3) + 1
        if len(bits) < need:
            bits.extend(bytes(need - len(bits)))
        bits[i >> 3] |= 1 << (i & 7)
    return [key.to_bytes(CHUNK_KEY_BYTES, "big") + struct.pack(">H", len(bits)) + bytes(bits)
            for key, bits in groups.items()]


def chunk_bitmaps(sids: Sequence[int]) -> list[bytes]:
    """``[chunk id 6][bitmap length u16][bitmap]`` for each chunk the ids fall in, in first-seen
    order (bit ``i``: record ``i`` of the chunk is listed). An id listed twice sets its bit once.

    A read task files every id it emitted, most of them many to a chunk: over numpy arrays the
    ids are grouped by chunk with one stable sort and each chunk's bitmap is set and packed in one
    step (0.1 µs an id for chunks of 1,000, against 1 µs one id at a time). Ids spread thin over
    many chunks (fewer than :data:`DENSE_IDS_PER_CHUNK` a chunk on average) take the loop over
    the ids instead, where the per-chunk steps would cost more."""
    import numpy as np

    ids = np.asarray(sids, dtype=np.int64).view(np.uint64)
    if ids.size == 0:
        return []
    keys = ids >> np.uint64(INDEX_BITS)
    index = (ids & np.uint64((1 << INDEX_BITS) - 1)).astype(np.int64)
    by_key = np.argsort(keys, kind="stable")
    sorted_keys = keys[by_key]
    starts = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1])))
    if starts.size * DENSE_IDS_PER_CHUNK > ids.size:
        return _bitmaps_by_id(keys.tolist(), index.tolist())
    groups = np.split(index[by_key], starts[1:])
    # first-seen order: a chunk's first id in the batch (the stable sort keeps it first in its group)
    out: list[bytes] = []
    for g in np.argsort(by_key[starts], kind="stable").tolist():
        members = groups[g]
        bits = np.zeros(((int(members.max()) >> 3) + 1) * 8, dtype=bool)
        bits[members] = True
        bitmap = np.packbits(bits, bitorder="little").tobytes()
        key = int(sorted_keys[starts[g]]).to_bytes(CHUNK_KEY_BYTES, "big")
        out.append(key + struct.pack(">H", len(bitmap)) + bitmap)
    return out


class BatchAcks:
    """Files and settles the record ids of micro-batches for one source."""

    def __init__(self, store: SourceStore) -> None:
        self.store = store

    @property
    def source_name(self) -> str:
        k = self.store.keys
        return f"{k.topology}/{k.source}"

    def record(self, tag: str, sids: Sequence[int], batch: tuple[str, int] | None = None,
               token: str | None = None) -> None:
        """File ``sids`` as emitted by a read task of the batch ``tag`` (one round trip); with
        ``batch`` = (Spark's query id, batch id), also list the tag in that batch's index, and
        with ``token`` (a batch token: Spark Connect, ``runtime.spark.connect``) in the token's.

        Must return before the rows are handed to Spark, so a written row's
        record is always listed when its batch settles.
        """
        if not sids:
            return
        key = self.store.keys.batch_reads(tag)
        ttl_ms = BATCH_KEY_TTL_S * 1000
        pieces = chunk_bitmaps(sids)
        elements = [b"".join(pieces[i : i + CHUNKS_PER_ELEMENT]) for i in range(0, len(pieces), CHUNKS_PER_ELEMENT)]
        pipe = self.store.client.pipeline(transaction=False)
        pipe.rpush(key, *elements)
        pipe.pexpire(key, ttl_ms)
        if batch is not None:
            qkey = query_batch_key(self.store.config.namespace, batch[0], batch[1])
            pipe.sadd(qkey, f"{self.source_name} {tag}")
            pipe.pexpire(qkey, ttl_ms)
        if token is not None:
            tkey = token_batch_key(self.store.config.namespace, token)
            pipe.sadd(tkey, f"{self.source_name} {tag}")
            pipe.pexpire(tkey, ttl_ms)
        pipe.execute()

    def settle(self, tag: str, mode: Literal["ack", "fail"], reason: str = "") -> int:
        """Ack or fail every still-pending record filed for the batch ``tag``; returns how many.

        Loops over bounded script calls until the batch key is empty (and so deleted). With
        ``mode="ack"`` a listed record that timed out meanwhile completes late: its replay is
        cancelled, or its copy settled before any later batch reads it (``BATCH_SETTLE``);
        those count in the return value and in the ``late_completions`` counter.
        """
        s = self.store
        keys = [*s.state_keys, s.keys.batch_reads(tag), s.keys.replaced, s.keys.batch_skips(tag)]
        total = 0
        while True:
            settled, left, late = s.run(
                BATCH_SETTLE, keys,
                [s.keys.prefix, mode, ELEMENTS_PER_CALL, reason or f"batch {tag} failed", s.now_ms(),
                 *s.backoff_args()],
            )
            total += int(settled) + int(late)
            if int(left) == 0:
                return total


def batch_tags(client: redis.Redis, namespace: str, query_id: str, batch_id: int) -> list[tuple[str, str]]:
    """``(topology/source, tag)`` of every source the read tasks of that micro-batch filed ids for."""
    return _members(client, query_batch_key(namespace, query_id, batch_id))


def token_tags(client: redis.Redis, namespace: str, token: str) -> list[tuple[str, str]]:
    """``(topology/source, tag)`` of every source the read tasks under batch token ``token`` filed ids for."""
    return _members(client, token_batch_key(namespace, token))


def _members(client: redis.Redis, key: str) -> list[tuple[str, str]]:
    members: Iterable[bytes | str] = client.smembers(key)
    out = []
    for m in members:
        name, _, tag = (m.decode() if isinstance(m, bytes) else str(m)).partition(" ")
        if tag:
            out.append((name, tag))
    return sorted(out)
