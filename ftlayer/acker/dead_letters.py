"""DeadLetters: records set aside after ``max_replays`` failures, with their reason.

Entries live in the source's ``dlq`` stream and are never deleted implicitly:
only :meth:`DeadLetters.purge` and :meth:`DeadLetters.requeue` remove them, and
only the ids they are given.
Each entry carries the old source record id, the time of the last failure and
of dead-lettering, the last reason (a traceback for exceptions) and the frame
(payload, key hash, origin id, replay count).
"""

from __future__ import annotations

import logging
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from ftlayer.errors import FrameError, FTLayerError
from ftlayer.records.chunks import MAX_DRAWS, assign_sids, pack_record_chunks
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.records.ids import RecordId
from ftlayer.records.keyhash import NO_KEY_HASH, pmod
from ftlayer.scripting.lua_script import STATE_KEYS, LuaScript
from ftlayer.scripting.script_bounds import CALL_MAX_RECORDS
from ftlayer.store.source_store import SourceStore, in_use_error

log = logging.getLogger(__name__)
_SERIALIZER = SemiDeserializedSerializer()
_ENTRY_ID_RE = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}(@[0-9]{1,2})?$")

# The scripts this module runs (ftlayer.scripting.lua_script: their KEYS and ARGV, checked at each call)
REQUEUE = LuaScript("REQUEUE", keys=(*STATE_KEYS, "dlq", "ch:*[num_channels]"),
                    argv=("prefix", "num_channels", "chunks", "entry_ids"))
DEAD_LETTER = LuaScript("DEAD_LETTER", keys=("dlq", "stats", "tok:*"),
                        argv=("sid", "now_ms", "reason", "frame", "guard_ttl_ms"))


class DeadLetterError(FTLayerError):
    """A dead-letter operation got a malformed entry id or could not be carried out."""


def check_entry_ids(entry_ids: Sequence[str]) -> list[str]:
    """The ids as a list; :class:`DeadLetterError` naming the first that is no stream id (``<ms>-<seq>``,
    or ``<ms>-<seq>@<shard>`` for a source with several shards)."""
    for eid in entry_ids:
        if not isinstance(eid, str) or not _ENTRY_ID_RE.match(eid):
            msg = f"invalid dead-letter entry id {eid!r}: expected a stream id like 1700000000000-0"
            raise DeadLetterError(msg)
    return list(entry_ids)


# Entry ids of a source with several shards name their shard: ``<stream id>@<shard>`` (each shard
# keeps its own dlq stream, and two shards may hand out the same stream id).


def qualify(entry_id: str, shard: int, num_shards: int) -> str:
    """``entry_id`` of shard ``shard`` as the source's callers see it."""
    return entry_id if num_shards == 1 else f"{entry_id}@{shard}"


def unqualify(entry_id: str, num_shards: int) -> tuple[int, str]:
    """``(shard, stream id)`` of an entry id as callers see it; :class:`DeadLetterError` if it names no shard
    of the source."""
    plain, at, shard = check_entry_ids([entry_id])[0].partition("@")
    if num_shards == 1:
        if at and shard != "0":
            msg = f"dead-letter entry id {entry_id!r} names shard {shard}, but the source has one shard"
            raise DeadLetterError(msg)
        return 0, plain
    if not at or not int(shard) < num_shards:
        msg = (f"dead-letter entry id {entry_id!r} must name its shard (<stream id>@<shard>, shard below "
               f"{num_shards}): this source keeps its dead letters in {num_shards} shards")
        raise DeadLetterError(msg)
    return int(shard), plain


def by_entry_shard(entry_ids: Sequence[str], num_shards: int) -> dict[int, list[str]]:
    """Entry ids grouped by shard, as stream ids (order kept)."""
    out: dict[int, list[str]] = {}
    for eid in entry_ids:
        shard, plain = unqualify(eid, num_shards)
        out.setdefault(shard, []).append(plain)
    return out


def entry_order(entry_id: str) -> tuple[int, int, int]:
    """Sort key of an entry id as callers see it: stream id, then shard."""
    plain, _, shard = entry_id.partition("@")
    ms, _, seq = plain.partition("-")
    return int(ms), int(seq), int(shard or 0)


def shard_cursor(after: str, shard: int) -> tuple[str, bool]:
    """Where shard ``shard``'s listing starts for the merged cursor ``after``: ``(stream id, inclusive)``.
    Entries are ordered by stream id, then shard, so a shard after the cursor's includes its id."""
    if after == "-":
        return "-", True
    plain, _, at = after.partition("@")
    return plain, shard > int(at or 0)


@dataclass(frozen=True)
class RequeueResult:
    """Outcome of :meth:`DeadLetters.requeue`.

    ``requeued`` entries are pending again; ``missing`` ids were not in the
    dlq when read; ``undecodable`` entries have a frame that cannot be decoded
    and stay in the dlq untouched. The three add up to the ids given unless a
    concurrent purge or requeue took some entries between the read and the
    server-side move (those are counted nowhere).
    """

    requeued: int = 0
    missing: list[str] = field(default_factory=list)
    undecodable: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered record. ``record`` is None if its frame could not be decoded."""

    entry_id: str
    source_record_id: int
    failed_ms: int
    dead_ms: int
    reason: str
    record: SemiDeserializedRecord | None
    frame: bytes

    @property
    def origin_id(self) -> int | None:
        return self.record.origin_id if self.record else None

    @property
    def replay_count(self) -> int | None:
        return self.record.replay_count if self.record else None


def _parse(entry_id: bytes, fields: dict[bytes, bytes]) -> DeadLetter:
    frame = fields.get(b"frame", b"")
    try:
        record: SemiDeserializedRecord | None = _SERIALIZER.decode(frame)
    except FrameError:
        record = None
    return DeadLetter(
        entry_id=entry_id.decode(),
        source_record_id=struct.unpack(">q", fields[b"sid"])[0],
        failed_ms=int(fields.get(b"failed_ms", b"0")),
        dead_ms=int(fields.get(b"dead_ms", b"0")),
        reason=fields.get(b"reason", b"").decode("utf-8", "replace"),
        record=record,
        frame=frame,
    )


def _requeue_chunk(store: SourceStore, ids: list[str], num_channels: int) -> RequeueResult:
    """Read the given dead letters, build their new frames and move them in one REQUEUE call."""
    pipe = store.client.pipeline(transaction=False)
    for eid in ids:
        pipe.xrange(store.keys.dlq, min=eid, max=eid, count=1)
    found: list[list[tuple[bytes, dict[bytes, bytes]]]] = pipe.execute()
    todo: list[tuple[bytes, SemiDeserializedRecord, int]] = []  # (entry id, record, channel)
    missing: list[str] = []
    undecodable: list[str] = []
    for eid, raw in zip(ids, found, strict=True):
        if not raw:
            missing.append(eid)
            continue
        rec = _parse(*raw[0]).record
        if rec is None:
            log.error("dead letter %s has an undecodable frame; it stays in the dlq", eid)
            undecodable.append(eid)
            continue
        old_ch = rec.channel
        if rec.key_hash != NO_KEY_HASH or old_ch is None or old_ch >= num_channels:
            # keyed: where live records of the key go now (the count may have changed after a drain)
            channel = pmod(rec.key_hash, num_channels)
        else:
            channel = old_ch
        todo.append((eid.encode(), rec, channel))
    if not todo:
        return RequeueResult(0, missing, undecodable)
    k = store.keys
    for _ in range(MAX_DRAWS):
        chunks, entry_ids = _requeue_input(todo, k.shard, k.num_shards)
        (count,) = store.run_durable([(
            REQUEUE,
            [*store.state_keys, k.dlq, *store.channel_keys(num_channels)],
            [k.prefix, num_channels, chunks, entry_ids],
        )])
        if not isinstance(count, list):
            return RequeueResult(int(count), missing, undecodable)
    raise in_use_error(k, bytes(count[1]), "requeue")




def _requeue_input(todo: list[tuple[bytes, SemiDeserializedRecord, int]], shard: int = 0,
                   num_shards: int = 1) -> tuple[bytes, bytes]:
    """New chunks for the requeued records (fresh source record ids in the dlq's shard, replay
    count 0, origin and root current id kept) and, aligned with their records, the dead letters' entry ids."""
    channels = [ch for _, _, ch in todo]
    sids = assign_sids(channels, shard=shard, num_shards=num_shards)
    cids = [rec.record_id.current_record_id for _, rec, _ in todo]  # kept: lineage ids stay (ftlayer.records.lineage)
    frames = [
        _SERIALIZER.encode(SemiDeserializedRecord(
            rec.source_id, RecordId(sid, cid), rec.key_hash, rec.origin_id, 0, rec.payload, ch,
        ))
        for (_, rec, ch), sid, cid in zip(todo, sids, cids, strict=True)
    ]
    packed = pack_record_chunks(frames, sids, cids, channels)
    eid_of = {sid: eid for sid, (eid, _, _) in zip(sids, todo, strict=True)}
    entry_ids = b"".join(struct.pack(">H", len(eid_of[s])) + eid_of[s] for c in packed for s in c.sids)
    return b"".join(c.blob for c in packed), entry_ids


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
        return [_parse(eid, fields) for eid, fields in raw]

    def get(self, entry_id: str) -> DeadLetter | None:
        """One dead letter by entry id, or None."""
        raw: list[tuple[bytes, dict[bytes, bytes]]] = self.store.client.xrange(  # type: ignore[assignment]
            self.store.keys.dlq, min=entry_id, max=entry_id, count=1
        )
        return _parse(*raw[0]) if raw else None

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
            step = _requeue_chunk(self.store, ids[i : i + size], num_channels)
            result = RequeueResult(
                result.requeued + step.requeued,
                result.missing + step.missing,
                result.undecodable + step.undecodable,
            )
        return result
