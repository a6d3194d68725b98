"""The version of a source's Redis layout, and the migration from older ones.

``meta.format`` names the layout a source's keys were written with (see
:mod:`ftlayer.keys`):

- **1**: one list per timeout bucket generation, ``bkt:<gen>``. Scripts built
  those names inside Lua, which a Redis Cluster refuses (a script may touch
  only the keys it declares).
- **2**: one list ``bkt`` for every generation, each element headed by its
  generation (u32), in generation order; one ``pend`` hash entry per record
  (ack value | bucket gen | frame).
- **3** (current): records in chunks (``ftlayer.chunks``): one ``ck``/``ci``/``cf``
  entry per chunk, ids that name their chunk, bucket and stream entries that
  list chunk ids.

Contract of :func:`ensure_layout`:
- A source at the current format, or not registered yet, costs one HGET and
  is left as it is.
- A format-1 source is migrated in place: each ``bkt:<gen>`` list, oldest
  generation first, is appended to ``bkt`` with its generation in front of each
  element and deleted in the same MULTI (same hash tag, so one slot). A crash
  part-way leaves the rest for the next call, still in generation order:
  nothing pending is lost or filed twice. Then ``format`` becomes 2.
- A format-2 source is migrated in place (:func:`migrate_2_to_3`): its bucket
  list, bucket counts, expiry queue and channel entries (which name ``pend``
  ids) are dropped once, then every ``pend`` record is filed again under a new
  id in chunks of its channel, in bounded atomic calls (``MIGRATE``: the old
  entry is deleted in the same call that files the new one, so a crash part-way
  leaves each record in exactly one place and the next call goes on). Records
  keep their payload, key hash, origin and replay count; their timeout starts
  anew. Records that a running query had in flight get new ids, so their acks
  come late and they are processed again (at least once). ``failed``, ``due``
  and the dead letters keep their format. Then ``format`` becomes 3.
- Stop every process of the older ftlayer first: one that still writes the
  older layout after the migration would file records no timeout sees.
- A format newer than this code knows raises :class:`ConfigError` and changes
  nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
from typing import TYPE_CHECKING, Any

from ftlayer.chunks import assign_sids, pack_record_chunks
from ftlayer.errors import ConfigError, FrameError
from ftlayer.frames import OFFSET_CHANNEL, SemiDeserializedRecord, SemiDeserializedSerializer
from ftlayer.ids import RecordId, new_ids
from ftlayer.keys import FORMAT_VERSION
from ftlayer.lua_script import STATE_KEYS, LuaScript

if TYPE_CHECKING:
    from ftlayer.store import SourceStore

log = logging.getLogger(__name__)

# The script this module runs (ftlayer.lua_script: its KEYS and ARGV, checked at each call)
MIGRATE = LuaScript("MIGRATE", keys=(*STATE_KEYS, "pend", "ch:*[num_channels]"),
                    argv=("prefix", "num_channels", "chunks", "olds"))



_PEND_PREFIX = 12  # format 2: a pend value is ack value (8) | bucket gen (4) | frame
_MIGRATE_BATCH = 1000  # pend entries per MIGRATE call
_SERIALIZER = SemiDeserializedSerializer()


def ensure_layout(store: SourceStore) -> int:
    """Migrate ``store``'s source to :data:`FORMAT_VERSION`; returns the format it had (0: none)."""
    k = store.keys
    client = store.client
    raw = client.hget(k.meta, "format")
    if raw is None:
        return 0
    found = int(raw)
    if found == FORMAT_VERSION:
        return found
    if found > FORMAT_VERSION:
        msg = (
            f"source {k.topology}/{k.source} was written with layout format {found}; this ftlayer "
            f"knows formats up to {FORMAT_VERSION}: upgrade ftlayer (nothing was changed)"
        )
        raise ConfigError(msg)
    if found == 1:
        _migrate_1_to_2(store)
    migrate_2_to_3(store)
    return found


def _migrate_1_to_2(store: SourceStore) -> None:
    k = store.keys
    client = store.client
    old_prefix = k.key("bkt:")
    gens = sorted(
        int(name[len(old_prefix) :])
        for name in (raw_name.decode() for raw_name in client.scan_iter(match=old_prefix + "*"))
        if name[len(old_prefix) :].isdigit()
    )
    moved = 0
    for gen in gens:
        old = k.key(f"bkt:{gen}")
        elements: list[bytes] = client.lrange(old, 0, -1)  # type: ignore[assignment]
        head = struct.pack(">I", gen)
        pipe = client.pipeline(transaction=True)
        if elements:
            pipe.rpush(k.buckets, *(head + e for e in elements))
        pipe.delete(old)
        pipe.execute()
        moved += len(elements)
    client.hset(k.meta, "format", 2)
    log.warning(
        "source %s/%s: migrated its Redis layout from format 1 to 2 (%d bucket lists, %d elements)",
        k.topology, k.source, len(gens), moved,
    )


def migrate_2_to_3(store: SourceStore) -> int:
    """Move a format-2 source's pending records into chunks (see the module notes); returns how many."""
    k = store.keys
    client = store.client
    num_channels = int(client.hget(k.meta, "num_channels") or 1)
    if client.hget(k.meta, "migrating") != b"3":
        # every record these index is in `pend` and is filed again below; done once (the flag)
        pipe = client.pipeline(transaction=False)
        pipe.delete(k.buckets, k.bcnt, k.key("expq"))
        for c in range(num_channels):
            pipe.xtrim(k.channel(c), maxlen=0)
        pipe.hset(k.meta, "migrating", 3)
        pipe.execute()
    moved = 0
    while True:
        cursor = 0
        entries: list[tuple[bytes, bytes]] = []
        while True:
            reply: Any = client.hscan(k.pend, cursor, count=_MIGRATE_BATCH)
            cursor, batch = int(reply[0]), reply[1]
            entries.extend(batch.items())
            while len(entries) >= _MIGRATE_BATCH:
                moved += _move(store, entries[:_MIGRATE_BATCH], num_channels)
                entries = entries[_MIGRATE_BATCH:]
            if cursor == 0:
                break
        if entries:
            moved += _move(store, entries, num_channels)
        if not client.hlen(k.pend):
            break
    pipe = client.pipeline(transaction=False)
    pipe.hset(k.meta, "format", FORMAT_VERSION)
    pipe.hdel(k.meta, "migrating")
    pipe.execute()
    log.warning("source %s/%s: migrated its Redis layout from format 2 to %d (%d pending records moved into "
                "chunks under new ids)", k.topology, k.source, FORMAT_VERSION, moved)
    return moved


def _move(store: SourceStore, entries: list[tuple[bytes, bytes]], num_channels: int) -> int:
    """One MIGRATE call (or more, if a drawn chunk id is in use) for format-2 ``pend`` entries."""
    olds: list[int] = []
    parsed: list[tuple[SemiDeserializedRecord | None, bytes, int]] = []  # (record, stored frame, channel)
    for sid_raw, value in entries:
        frame = value[_PEND_PREFIX:]
        try:
            rec = _SERIALIZER.decode(frame)
        except FrameError:
            rec = None
        channel = rec.channel if rec is not None and rec.channel is not None else (
            struct.unpack_from(">H", frame, OFFSET_CHANNEL)[0] if len(frame) >= OFFSET_CHANNEL + 2 else 0)
        if not 0 <= channel < num_channels:
            channel = 0
        olds.append(struct.unpack(">q", sid_raw)[0])
        parsed.append((rec, frame, channel))
    k = store.keys
    for _ in range(8):
        channels = [ch for _, _, ch in parsed]
        sids = assign_sids(channels)
        cids = new_ids(len(parsed))
        frames = [
            # an undecodable frame moves as it is: the reader refuses it and dead-letters the record
            frame if rec is None
            else _SERIALIZER.encode(dataclasses.replace(rec, record_id=RecordId(sid, cid), channel=ch))
            for (rec, frame, ch), sid, cid in zip(parsed, sids, cids, strict=True)
        ]
        packed = pack_record_chunks(frames, sids, cids, channels)
        old_of = dict(zip(sids, olds, strict=True))
        old_blob = b"".join(struct.pack(f">{c.records}q", *(old_of[s] for s in c.sids)) for c in packed)
        reply = store.run(
            MIGRATE,
            [*store.state_keys, k.pend, *store.channel_keys(num_channels)],
            [k.prefix, num_channels, b"".join(c.blob for c in packed), old_blob],
        )
        if not isinstance(reply, list):
            return int(reply)
    msg = f"source {k.topology}/{k.source}: the layout migration kept drawing chunk ids in use"
    raise ConfigError(msg)
