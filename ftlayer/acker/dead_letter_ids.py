"""Dead-letter entry ids as a source's callers see them: stream ids, qualified by shard on a sharded source.

Contract: an entry id is a stream id ``<ms>-<seq>``; on a source with several shards (each
keeping its own dlq stream, where two shards may hand out the same stream id) it is
``<stream id>@<shard>``. A malformed id, or one naming no shard of the source, raises
:class:`DeadLetterError` naming it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from ftlayer.errors import FTLayerError

__all__ = [
    "DeadLetterError",
    "by_entry_shard",
    "check_entry_ids",
    "entry_order",
    "qualify",
    "shard_cursor",
    "unqualify",
]

_ENTRY_ID_RE = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}(@[0-9]{1,2})?$")


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
