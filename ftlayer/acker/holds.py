"""Holds: the timeouts of records a running micro-batch read follow the batch, not the clock alone.

A record's timeout counts from its persist (``ftlayer.acker.rotating_map``). A micro-batch that takes
longer than ``timeout_s`` (a slow sink, a Delta MERGE, a backlog after a restart) would then see
its records time out and be replayed while it is still processing them: duplicates at the sink
for no failure. Storm answers with ``collector.resetTimeout(tuple)``, called by the user; a hold
does it for every record of the batch, automatically, with an upper bound.

Life of a hold (one per micro-batch and source shard, named by the batch's tag,
``ftlayer.acker.batch_acks.batch_tag``):

- **start**: when Spark plans the batch, the FT source's driver-side reader writes
  ``holds[tag] = "<deadline ms> <started ms>"`` with ``deadline = now + lease``.
- **read**: each read task adds the chunk ids it receives to the set ``hld:<tag>``
  (``READ_CHANNEL``, no extra round trip).
- **renew**: while the batch runs, the reader renews the deadline every ``lease / 3``, never
  past ``started + max_batch_s`` (the bound for a hung batch). A renew never revives a hold
  that was ended (``HOLD`` script, ``renew`` only if the field exists).
- **end**: once Spark committed the batch (the batch's records were settled first), or the
  query ended, the hold and its set are deleted.

Contract of the timeout check (``EXPIRE``): a chunk that would fail by timeout is re-filed in
the current bucket instead when it is in the set of a hold whose deadline lies ahead (counted
in ``refiled_held``). So while a batch runs and renews its hold, none of the records it read
times out; once the hold ended (or lapsed: the reader died, or ``max_batch_s`` passed), such a
record fails at its next expiry, within ``timeout_s * (1 + 1/(num_buckets - 1))``. Records not
in a running batch keep the usual bound ``T .. T(1 + 1/(n-1))`` after persist. A hold is a
postponement only: it never completes, fails or loses a record, so a hold left behind (its
reader killed) costs at most one lease of extra wait. Lapsed holds are deleted by the FT
service (:meth:`Holds.clean`) once they are ``STALE_AFTER_S`` past their deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftlayer.scripting.lua_script import LuaScript
from ftlayer.store.source_store import SourceStore

__all__ = ["CARRY_PREFIX", "STALE_AFTER_S", "Hold", "Holds", "hold_lease_s"]

STALE_AFTER_S = 60.0  # a hold this far past its deadline is garbage (its reader is gone)
MIN_LEASE_S, MAX_LEASE_S = 2.0, 10.0


def hold_lease_s(rotation_interval_s: float) -> float:
    """How far ahead a renewal moves a hold's deadline: one rotation interval, within 2..10 s.

    A reader that dies leaves its holds to lapse within this time, so its records time out
    about as they would have without the hold.
    """
    return max(MIN_LEASE_S, min(rotation_interval_s, MAX_LEASE_S))


@dataclass(frozen=True)
class Hold:
    """One hold as stored: its batch tag, deadline and start (ms, the writer's clock)."""

    tag: str
    deadline_ms: int
    started_ms: int

    def live(self, now_ms: int) -> bool:
        return self.deadline_ms > now_ms


def parse_hold(tag: bytes | str, raw: bytes | str) -> Hold | None:
    """A ``holds`` field and value as a :class:`Hold`; None if the value is malformed."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    name = tag.decode() if isinstance(tag, bytes) else tag
    parts = text.split()
    try:
        deadline = int(parts[0])
        started = int(parts[1]) if len(parts) > 1 else deadline
    except (IndexError, ValueError):
        return None
    return Hold(name, deadline, started)


#: Tag prefix of a carry hold: the unread rest of a stream entry a committed batch ended inside,
#: held until the next batch committed (``runtime.spark.batch_holds``); not a running batch.
CARRY_PREFIX = "carry-"


# The script this module runs (ftlayer.scripting.lua_script: its KEYS and ARGV, checked at each call)
HOLD = LuaScript("HOLD", keys=("holds", "hld:*"), argv=("op", "tag", "deadline_ms", "started_ms"))


class Holds:
    """The holds of one source shard (see the module contract). All calls are idempotent."""

    def __init__(self, store: SourceStore) -> None:
        self.store = store

    def _call(self, op: str, tag: str, deadline_ms: int = 0, started_ms: int = 0) -> bool:
        k = self.store.keys
        return bool(self.store.run(HOLD, [k.holds, k.held(tag)], [op, tag, deadline_ms, started_ms]))

    def start(self, tag: str, deadline_ms: int, started_ms: int) -> None:
        """Hold batch ``tag`` until ``deadline_ms`` (its read tasks add their chunks)."""
        self._call("start", tag, deadline_ms, started_ms)

    def renew(self, tag: str, deadline_ms: int, started_ms: int) -> bool:
        """Move the deadline of a hold that still exists; False if it was ended meanwhile."""
        return self._call("renew", tag, deadline_ms, started_ms)

    def end(self, tag: str) -> None:
        """Delete the hold and its set: the batch's records time out as usual from now on."""
        self._call("end", tag)

    def add(self, tag: str, chunk_ids: list[bytes], ttl_ms: int) -> None:
        """Put chunks in the set of hold ``tag`` as a read task's read would (idempotent: a set)."""
        if not chunk_ids:
            return
        key, client = self.store.keys.held(tag), self.store.client

        def add() -> None:
            pipe = client.pipeline(transaction=False)
            pipe.sadd(key, *chunk_ids)
            pipe.pexpire(key, ttl_ms)
            pipe.execute()

        self.store.ride_out(add)

    def all(self) -> list[Hold]:
        """Every hold of the shard, live or lapsed."""
        raw = self.store.client.hgetall(self.store.keys.holds)
        return [h for h in (parse_hold(t, v) for t, v in raw.items()) if h is not None]

    def end_all(self) -> int:
        """End every hold of the shard (the one query reading the source stopped); returns how many."""
        holds = self.all()
        for hold in holds:
            self.end(hold.tag)
        return len(holds)

    def clean(self, now_ms: int) -> int:
        """Delete holds lapsed for more than :data:`STALE_AFTER_S`; returns how many."""
        stale = [h for h in self.all() if h.deadline_ms < now_ms - STALE_AFTER_S * 1000]
        for hold in stale:
            self.end(hold.tag)
        return len(stale)
