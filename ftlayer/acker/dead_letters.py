"""DeadLetters: records set aside after ``max_replays`` failures, with their reason.

Entries live in the source's ``dlq`` stream and are never deleted implicitly:
only :meth:`DeadLetters.purge` and :meth:`DeadLetters.requeue` remove them, and
only the ids they are given.
The entry ids are :mod:`ftlayer.acker.dead_letter_ids`, an entry as read
:mod:`ftlayer.acker.dead_letter_entry`, the move back into the channels
:mod:`ftlayer.acker.dead_letter_requeue`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from ftlayer.acker.dead_letter_entry import DeadLetter, parse_entry
from ftlayer.acker.dead_letter_ids import check_entry_ids
from ftlayer.acker.dead_letter_requeue import RequeueResult, requeue_chunk
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.scripting.lua_script import LuaScript
from ftlayer.scripting.script_bounds import CALL_MAX_RECORDS
from ftlayer.store.source_store import SourceStore

__all__ = ["DEAD_LETTER", "DeadLetters"]

_SERIALIZER = SemiDeserializedSerializer()

# The script this module runs (ftlayer.scripting.lua_script: its KEYS and ARGV, checked at each call)
DEAD_LETTER = LuaScript("DEAD_LETTER", keys=("dlq", "stats", "tok:*"),
                        argv=("sid", "now_ms", "reason", "frame", "guard_ttl_ms"))



class DeadLetters:
    """Read and manage one source's dead-letter stream."""

    def __init__(self, store: SourceStore) -> None:
        self.store = store

    def count(self) -> int:
        """Dead letters currently kept."""
        return int(self.store.client.xlen(self.store.keys.dlq))

    def list(self, count: int = 100, after: str = "-", *, inclusive: bool = False) -> list[DeadLetter]:
        """Up to ``count`` dead letters, oldest first, with entry ids greater than ``after`` (or equal,
        with ``inclusive``)."""
        start = after if after == "-" or inclusive else f"({after}"
        raw: list[tuple[bytes, dict[bytes, bytes]]] = self.store.client.xrange(  # type: ignore[assignment]
            self.store.keys.dlq, min=start, max="+", count=count
        )
        return [parse_entry(eid, fields) for eid, fields in raw]

    def get(self, entry_id: str) -> DeadLetter | None:
        """One dead letter by entry id, or None."""
        raw: list[tuple[bytes, dict[bytes, bytes]]] = self.store.client.xrange(  # type: ignore[assignment]
            self.store.keys.dlq, min=entry_id, max=entry_id, count=1
        )
        return parse_entry(*raw[0]) if raw else None

    def add(self, record: SemiDeserializedRecord, reason: str) -> str:
        """Set aside a record that could never be persisted for processing (e.g. its key
        selector raised), so it is not silently dropped. Returns the entry id.

        Idempotent per ``record.record_id.source_record_id`` (for the token TTL,
        at least an hour): a retried call, after a lost reply, appends nothing and
        returns the first call's entry id. A retry must therefore pass the same
        record, not a new one built from the same value.
        """
        k = self.store.keys
        sid = struct.pack(">q", record.record_id.source_record_id)
        entry = self.store.run(
            DEAD_LETTER,
            [k.dlq, k.stats, k.token(f"dl:{record.record_id.source_record_id}")],
            [sid, self.store.now_ms(), reason.encode("utf-8", "replace")[:8192], _SERIALIZER.encode(record),
             self.store.token_ttl_ms()],
        )
        return entry.decode() if isinstance(entry, bytes) else str(entry)

    def purge(self, entry_ids: Sequence[str]) -> int:
        """Delete exactly the given entries; returns how many existed."""
        if not entry_ids:
            return 0
        return int(self.store.client.xdel(self.store.keys.dlq, *check_entry_ids(entry_ids)))

    def requeue(self, entry_ids: Sequence[str], num_channels: int) -> RequeueResult:
        """Move dead letters back into the stream as fresh source records.

        Each requeued record gets a new RecordId and replay count 0 and keeps
        its origin id, payload, key hash and source id. A keyed record goes to
        ``pmod(key_hash, num_channels)``, where live records of its key go (the
        count may have changed since, after a drain); a keyless one to the
        channel it was dead-lettered with if that is below ``num_channels``,
        else ``pmod(key_hash, num_channels)``. Per server-side call (at most
        ``flush_batch_size`` and ``script_bounds.CALL_MAX_RECORDS`` entries) removing the dead letter and persisting
        the record are one atomic step, so a record is never in both places
        nor in neither; an entry purged or requeued concurrently is skipped.
        In 'waitaof' mode this returns after the AOF fsync. A client retry
        after a lost reply reports the already-moved entries as not requeued.
        """
        ids = check_entry_ids(entry_ids)
        result = RequeueResult()
        size = min(self.store.config.flush_batch_size, CALL_MAX_RECORDS)  # bounded REQUEUE calls
        for i in range(0, len(ids), size):
            step = requeue_chunk(self.store, ids[i : i + size], num_channels)
            result = RequeueResult(
                result.requeued + step.requeued,
                result.missing + step.missing,
                result.undecodable + step.undecodable,
            )
        return result
