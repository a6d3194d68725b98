"""Replayer: re-emit failed source records under new ids, or set them aside.

Both kinds of failure (explicit ``FailRecord`` and timeout) leave the record in
the source's ``failed`` set with a due time (the replay backoff). For each due
record, :meth:`Replayer.replay_due`:

- keeps its payload, key hash, origin id and root current id (so each output of its
  tree keeps its lineage id, ``ftlayer.records.lineage``), gives it a new source record id
  (so late acks or XORs for the old attempt do nothing), increments its replay count, and
  re-persists it on the channel its replay partitioner picks, which for
  key-based routing is the channel of the original;
- or, once its replay count has reached ``max_replays`` (at once if it was
  failed with ``FailRecord(..., replay=False)``, or if its frame cannot be
  decoded), appends it to the dead-letter stream with origin id, replay
  count, last reason and time.

Each failure is replayed at most once even with two replayers running: the
server-side call removes the failed entry and persists the replay atomically.
A replay is persisted (and, in 'waitaof' mode, fsynced) before it is visible.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ftlayer.acker.acker_table import NO_REPLAY_FLAG, REPLACED_LINK_TTL_S
from ftlayer.errors import FrameError, PartitioningError
from ftlayer.records.chunks import MAX_DRAWS, assign_sids, pack_record_chunks
from ftlayer.records.frames import FAILED_PREFIX, SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.records.ids import RecordId
from ftlayer.records.keyhash import pmod
from ftlayer.scripting.lua_script import STATE_KEYS, LuaScript
from ftlayer.scripting.script_bounds import CALL_MAX_BYTES, CALL_MAX_RECORDS
from ftlayer.store.source_store import SourceStore, in_use_error

log = logging.getLogger(__name__)
_SERIALIZER = SemiDeserializedSerializer()
# REPLAY keeps the link from a timed-out record to its copy (keys.replaced) REPLACED_LINK_TTL_S
# (ftlayer.acker.acker_table): a DataFrame batch committed later than this (a driver down for a day)
# counts the copy again
TIMEOUT_REASON = "timeout"  # the reason EXPIRE gives a record that timed out (ftlayer/lua/expire.lua)
_FAILED_HEADER = struct.Struct(">dH")  # FAILED_PREFIX bytes (ftlayer.records.frames), read by the Lua too

# The script this module runs (ftlayer.scripting.lua_script: its KEYS and ARGV, checked at each call)
REPLAY = LuaScript(
    "REPLAY", keys=(*STATE_KEYS, "dlq", "ch:*[num_channels]", "rpl?"),
    argv=("prefix", "num_channels", "replays", "olds", "dead", "now_ms", "link_ttl_ms?", "timed_out?"),
)
assert _FAILED_HEADER.size == FAILED_PREFIX




def _replay_chunks(replays: list[tuple[int, SemiDeserializedRecord, int]], shard: int = 0,
                   num_shards: int = 1) -> tuple[bytes, bytes]:
    """The REPLAY input for ``replays``: new chunks (fresh source record ids in the shard of the
    failures, each record's root current id kept, grouped per channel) and, aligned with their
    records, the old ids."""
    if not replays:
        return b"", b""
    channels = [ch for _, _, ch in replays]
    sids = assign_sids(channels, shard=shard, num_shards=num_shards)
    # the root current id is kept: every id derived below it (child_id is pure) is then the same on
    # every attempt, which is what makes an output's lineage id stable (ftlayer.records.lineage). The new
    # source record id alone names the new tree, so late acks of the old attempt still do nothing.
    cids = [rec.record_id.current_record_id for _, rec, _ in replays]
    frames = [
        _SERIALIZER.encode(rec.replayed(RecordId(sid, cid), ch))
        for (_, rec, ch), sid, cid in zip(replays, sids, cids, strict=True)
    ]
    packed = pack_record_chunks(frames, sids, cids, channels)
    old_of = {sid: old for sid, (old, _, _) in zip(sids, replays, strict=True)}
    olds = b"".join(struct.pack(f">{c.records}q", *(old_of[s] for s in c.sids)) for c in packed)
    return b"".join(c.blob for c in packed), olds


class ReplayRouter(Protocol):
    """The replay form of a partitioner: channels for a record rebuilt from its frame."""

    def select_replay(self, record: SemiDeserializedRecord) -> list[int]: ...


class KeyHashRouter:
    """The default replay routing: ``[pmod(key_hash, n)]``, the channel key routing chose live.

    The compiler injects the replay form of the source's own partitioner
    (``partitioners``) instead where the source routes otherwise; the core
    needs no partitioner of its own.
    """

    __slots__ = ("num_channels",)

    def __init__(self, num_channels: int) -> None:
        self.num_channels = num_channels

    def select_replay(self, record: SemiDeserializedRecord) -> list[int]:
        return [pmod(record.key_hash, self.num_channels)]


@dataclass(frozen=True)
class FailedRecord:
    """A failed record waiting for replay, as stored in Redis."""

    source_record_id: int
    failed_ms: float
    reason: str
    record: SemiDeserializedRecord | None
    frame: bytes
    replay: bool = True  # False: dead-letter without replays (FailRecord(replay=False), corrupt frames)


def parse_failed(sid: int, raw: bytes) -> FailedRecord:
    """Decode a ``failed`` hash value: fail time, reason, frame (record None if undecodable).

    The reason length's top bit (``NO_REPLAY_FLAG``) marks a failure to dead-letter at once.
    """
    failed_ms, rlen = _FAILED_HEADER.unpack_from(raw)
    replay = not rlen & NO_REPLAY_FLAG
    rlen &= ~NO_REPLAY_FLAG
    start = _FAILED_HEADER.size
    reason = raw[start : start + rlen].decode("utf-8", "replace")
    frame = raw[start + rlen :]
    try:
        record: SemiDeserializedRecord | None = _SERIALIZER.decode(frame)
    except FrameError:
        record = None
    return FailedRecord(sid, failed_ms, reason, record, frame, replay)


@dataclass(frozen=True)
class ReplayResult:
    """Counts of one replay pass."""

    replayed: int = 0
    dead_lettered: int = 0

    def plus(self, other: ReplayResult) -> ReplayResult:
        return ReplayResult(self.replayed + other.replayed, self.dead_lettered + other.dead_lettered)


class Replayer:
    """Replays one source's due failures (see module contract)."""

    def __init__(self, store: SourceStore, num_channels: int, router: ReplayRouter | None = None) -> None:
        self.store = store
        self.num_channels = num_channels
        # default: the fields strategy, channel = pmod(key_hash, n), as the original design
        self.router: ReplayRouter = router or KeyHashRouter(num_channels)

    def due(self, limit: int) -> list[FailedRecord]:
        """Failed records whose backoff has passed, oldest due first."""
        k = self.store.keys
        client = self.store.client
        sids: list[bytes] = client.zrangebyscore(k.due, "-inf", self.store.now_ms(), start=0, num=limit)  # type: ignore[assignment]
        if not sids:
            return []
        raws: list[bytes | None] = client.hmget(k.failed, sids)  # type: ignore[assignment]
        return [
            parse_failed(struct.unpack(">q", sid)[0], raw)
            for sid, raw in zip(sids, raws, strict=True)
            if raw is not None
        ]

    def replay_due(self, limit: int | None = None) -> ReplayResult:
        """Replay or dead-letter up to ``limit`` due failures (default flush_batch_size)."""
        cfg = self.store.config
        todo = self.due(limit or cfg.flush_batch_size)
        if not todo:
            return ReplayResult()
        total = ReplayResult()
        replays: list[tuple[int, SemiDeserializedRecord, int]] = []  # (old sid, record, channel)
        dead: list[bytes] = []
        timed_out: list[bytes] = []  # old sids of replays that failed by timeout: REPLAY links them
        size = 0
        # one call per chunk of work; in the waiting durability modes each waits before it returns
        for item in todo:
            old = struct.pack(">q", item.source_record_id)
            rec = item.record
            if rec is None:
                log.error("failed record %d has an undecodable frame; dead-lettering it", item.source_record_id)
                dead.append(old)
            elif rec.replay_count >= cfg.max_replays or not item.replay:
                dead.append(old)
            else:
                channels = self.router.select_replay(rec)
                if len(channels) != 1 or not 0 <= channels[0] < self.num_channels:
                    msg = (
                        f"replay partitioner gave channels {channels} for origin record {rec.origin_id}; "
                        f"a persisted source record is replayed to exactly one channel in "
                        f"0..{self.num_channels - 1}"
                    )
                    raise PartitioningError(msg)
                replays.append((item.source_record_id, rec, channels[0]))
                if item.reason == TIMEOUT_REASON:
                    timed_out.append(old)
                size += len(item.frame)
            # bounded calls (ftlayer.scripting.script_bounds): a replay storm never holds the server long
            if len(replays) + len(dead) >= CALL_MAX_RECORDS or size >= CALL_MAX_BYTES:
                total = total.plus(self._replay_call(replays, dead, timed_out))
                replays, dead, timed_out, size = [], [], [], 0
        if replays or dead:
            total = total.plus(self._replay_call(replays, dead, timed_out))
        return total

    def _replay_call(self, replays: list[tuple[int, SemiDeserializedRecord, int]], dead: list[bytes],
                     timed_out: Sequence[bytes] = ()) -> ReplayResult:
        """One REPLAY call: re-persist ``replays`` under new ids (new chunks) and dead-letter ``dead``.

        New ids are drawn per call; if a drawn chunk id is in use (nothing was written) they are
        drawn again.
        """
        k = self.store.keys
        for _ in range(MAX_DRAWS):
            chunks, olds = _replay_chunks(replays, k.shard, k.num_shards)
            ((replayed, second),) = self.store.run_durable([(
                REPLAY,
                [*self.store.state_keys, k.dlq, *self.store.channel_keys(self.num_channels), k.replaced],
                [k.prefix, self.num_channels, chunks, olds, b"".join(dead), self.store.now_ms(),
                 REPLACED_LINK_TTL_S * 1000, b"".join(timed_out)],
            )])
            if int(replayed) >= 0:
                return ReplayResult(int(replayed), int(second))  # second: dead-lettered
        raise in_use_error(k, bytes(second), "replay")  # second: the chunk id in use

    def replay_all_due(self) -> ReplayResult:
        """Call :meth:`replay_due` until nothing is due."""
        total = ReplayResult()
        while True:
            step = self.replay_due()
            if not step.replayed and not step.dead_lettered:
                return total
            total = ReplayResult(total.replayed + step.replayed, total.dead_lettered + step.dead_lettered)
