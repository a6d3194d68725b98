"""Requeue: dead letters moved back into a source's channels as fresh source records, one atomic REQUEUE call a step.

Contract (see :meth:`ftlayer.acker.dead_letters.DeadLetters.requeue`): per call, removing the
dead letter and persisting its record are one atomic step, so a record is never in both places
nor in neither; an id missing from the dlq, or whose frame cannot be decoded, is reported in
:class:`RequeueResult` and left where it is.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field

from ftlayer.acker.dead_letter_entry import parse_entry
from ftlayer.records.chunks import MAX_DRAWS, assign_sids, pack_record_chunks
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.records.ids import RecordId
from ftlayer.records.keyhash import NO_KEY_HASH, pmod
from ftlayer.scripting.lua_script import STATE_KEYS, LuaScript
from ftlayer.store.source_store import SourceStore, in_use_error

__all__ = ["REQUEUE", "RequeueResult", "requeue_chunk"]

log = logging.getLogger("ftlayer.acker.dead_letters")  # the name its lines have always had
_SERIALIZER = SemiDeserializedSerializer()

# The script this module runs (ftlayer.scripting.lua_script: its KEYS and ARGV, checked at each call)
REQUEUE = LuaScript("REQUEUE", keys=(*STATE_KEYS, "dlq", "ch:*[num_channels]"),
                    argv=("prefix", "num_channels", "chunks", "entry_ids"))


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


def requeue_chunk(store: SourceStore, ids: list[str], num_channels: int) -> RequeueResult:
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
        rec = parse_entry(*raw[0]).record
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
