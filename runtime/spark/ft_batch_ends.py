"""Where a capped batch of the FT source ends: whole stream entries, then a cut inside one.

Admission control (where pyspark has it, see :mod:`runtime.spark.admission`; pyspark 4.0
calls ``latestOffset()`` with no arguments and gets the tails, uncapped): with option ``max_records_per_batch`` the
default read limit is ``ReadMaxRows(n)``. ``latestOffset`` then takes whole
stream entries from each channel stream while they fit in its share (``ceil(n /
streams)`` records, counting every record filed in an entry, completed ones
included), and ends the batch inside the entry where the share is reached (a
position after that entry's first records), so a batch holds at most ``n``
records however large one persist call was; a channel stream's trim then keeps
that entry until it has been read whole. Spark's ``ReadAllAvailable`` (e.g. ``Trigger.Once``) always wins
over the option. ``Trigger.AvailableNow`` is supported natively: the tails at
start become the target and batches honour the read limit until they reach it.

A position inside an entry (``"<entry id>@<chunk>:<index>"``, :mod:`runtime.spark.ft_offsets`)
names the last record the batch takes of that entry. These functions read (never write) the
channel streams and chunk states of one source through its ``FTLayer``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.chunks import CHUNK_KEY_BYTES, STATE_HEADER
from runtime.spark.ft_offsets import START_ID, Position, compare_ids

__all__ = ["Offset", "Stream", "capped_end", "cut_entry", "entry_chunks", "stream_name", "text"]

# An offset: channel stream key ("ch<c>", "ch<c>s<shard>" with shards) -> Redis stream id ("<ms>-<seq>").
Offset = dict[str, str]
# One channel stream of one shard: (channel, shard, offset key).
Stream = tuple[int, int, str]


def text(raw: Any) -> str:
    """A Redis reply as ``str``."""
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def stream_name(layer: FTLayer, channel: int, shard: int) -> str:
    """The Redis key of channel ``channel``'s stream in ``shard``."""
    return layer.shards[shard].store.keys.channel(channel)


def capped_end(layer: FTLayer, streams: Sequence[Stream], start: Offset, end: Offset, max_rows: int) -> Offset:
    """Per channel stream, the records of ``(start, end]`` up to ``ceil(max_rows / streams)``: whole
    entries while they fit, then a position inside the entry where the share is reached
    (``runtime.spark.ft_offsets``), so one large persist call no longer makes one large batch."""
    share = max(1, math.ceil(max_rows / len(streams)))
    page = min(share, 1024)  # every entry holds at least one record
    capped = dict(end)
    pos = {k: start[k] for k in capped}
    counted = dict.fromkeys(capped, 0)
    open_ = [(c, s, k) for c, s, k in streams if compare_ids(end[k], start[k]) > 0]
    for c, s, k in list(open_):  # a start inside an entry: the rest of that entry first
        first = Position.parse(start[k])
        if first.chunk is None:
            continue
        cut, got = cut_entry(layer, c, s, first.entry, share, after=first)
        if cut is not None:
            capped[k] = cut
            open_.remove((c, s, k))
        else:
            counted[k], pos[k] = got, first.entry
    while open_:
        pipe = layer.client.pipeline(transaction=False)
        for c, s, k in open_:
            after = "-" if pos[k] == START_ID else "(" + pos[k]
            pipe.xrange(stream_name(layer, c, s), after, end[k], count=page)
        still_open: list[tuple[int, int, str]] = []
        for (c, s, k), entries in zip(open_, pipe.execute(), strict=True):
            done = len(entries) < page
            for entry_id, fields in entries:
                n = int(fields.get(b"n", b"0"))
                if counted[k] + n > share:  # the share ends inside this entry
                    cut, _ = cut_entry(layer, c, s, text(entry_id), share - counted[k])
                    if cut is not None:
                        capped[k], done = cut, True
                        break
                pos[k] = text(entry_id)
                counted[k] += n
                if counted[k] >= share:
                    done = True
                    break
            if capped[k] != end[k]:
                continue
            if done or compare_ids(pos[k], end[k]) >= 0:
                # trimmed ranges may yield fewer ids; an untouched stream keeps its start
                capped[k] = pos[k] if counted[k] >= share else end[k]
            else:
                still_open.append((c, s, k))
        open_ = still_open
    return capped


def entry_chunks(layer: FTLayer, c: int, shard: int, entry: str) -> list[bytes]:
    """The chunk ids stream entry ``entry`` of channel ``c`` in ``shard`` lists, in order ([] if trimmed)."""
    found: Any = layer.client.xrange(stream_name(layer, c, shard), entry, entry, count=1)
    blob: bytes = found[0][1].get(b"c", b"") if found else b""
    return [blob[i : i + CHUNK_KEY_BYTES] for i in range(0, len(blob) - CHUNK_KEY_BYTES + 1, CHUNK_KEY_BYTES)]


def cut_entry(layer: FTLayer, c: int, shard: int, entry: str, need: int, *,
              after: Position | None = None) -> tuple[str | None, int]:
    """The position inside stream entry ``entry`` after its first ``need`` records (those after
    ``after``, if it points into this entry), or ``(None, records there)`` if it has no more."""
    keys = entry_chunks(layer, c, shard, entry)
    store = layer.shards[shard].store
    states: list[Any] = store.client.hmget(store.keys.chunks, keys) if keys else []
    begun = after is None
    total = 0
    for key, state in zip(keys, states, strict=True):
        first = 0
        if not begun:
            if after is None or key != after.chunk:
                continue
            begun, first = True, after.index + 1
        n = STATE_HEADER.unpack_from(state)[3] if state else 0  # a chunk gone has nothing to read
        take = max(0, n - first)
        if total + take >= need and take > 0:
            index = first + (need - total) - 1
            return str(Position(entry, key, index)) if index < n - 1 or key != keys[-1] else entry, need
        total += take
    return None, total
