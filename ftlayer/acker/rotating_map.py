"""RotatingBucketMap: the timeout map of pending source records, kept in Redis.

After Storm's ``RotatingMap``. Records are filed in the newest of ``n``
buckets when they are persisted (or replayed). ``rotate()`` opens a new bucket
and expires the oldest: every record of the expired bucket that is still
pending fails with reason ``timeout`` and is handed to the replayer, and the
ids are passed to the ``on_expired`` callback.

Expiry bound: with rotations every ``T/(n-1)`` seconds, a record filed just
before a rotation expires after ``n-1`` rotations, one filed just after after
``n``. So a record fails between ``T`` and ``T * (1 + 1/(n-1))`` after it was
persisted. In rotation counts: a record filed in a map of ``k`` buckets expires
exactly on the ``k``-th rotation after it was filed. A record acked or failed
before that is no longer pending and never expires.

Cost: filing is part of the persist call (8 bytes per record in the bucket
list). ``rotate`` is O(1); scanning an expired bucket is O(records filed in
it), done in bounded calls (``ftlayer.scripting.script_bounds``: at most
``scan_max_records`` ids, a few MiB of values and about 20 ms each) that the
caller loops over, so Redis is never blocked for long whatever the backlog.
Buckets are deleted as soon as their last record completes, so a drained
source has no bucket left.

Monitoring: each successful rotation also records when the new bucket opened
(``gtime``: gen -> ms; gen 0 is written when the source registers). The age of
the oldest pending record is then about now - ``gtime[min gen in bcnt]``, an
upper bound accurate to one rotation interval (``ftlayer status`` shows it).

Two rotators (two drivers) must not rotate the same source twice as fast: the
rotating process must hold the source's lease (``acquire_lease``), checked in
the same script as the rotation. Each record fails at most once regardless,
because failing settles it in its chunk in the same script that files it in ``failed``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from ftlayer.acker.holds import Holds
from ftlayer.errors import FTLayerError, LeaseLostError
from ftlayer.scripting.lua_script import STATE_KEYS, LuaScript
from ftlayer.scripting.script_bounds import EXPIRE_MAX_RECORDS, SCRIPT_BUDGET_MS, SCRIPT_MAX_BYTES
from ftlayer.store.id_blobs import unpack_ids
from ftlayer.store.source_store import SourceStore

ExpiredCallback = Callable[[list[int]], None]
log = logging.getLogger(__name__)

# The scripts this module runs (ftlayer.scripting.lua_script: their KEYS and ARGV, checked at each call)
ROTATE = LuaScript("ROTATE", keys=("gen", "lease", "expq", "bcnt"),
                   argv=("owner", "num_buckets", "expected_gen", "target_gen"))
EXPIRE = LuaScript(
    "EXPIRE", keys=(*STATE_KEYS, "expq", "rd", "holds", "hld:*[h]", "ch:*..."),
    argv=("prefix", "now_ms", "backoff_initial_ms", "backoff_multiplier", "backoff_max_ms", "max_records",
          "max_bytes", "budget_ms", "h", "hold_tags[h]"),
)
LEASE = LuaScript("LEASE", keys=("lease",), argv=("owner", "ttl_ms"))
RELEASE = LuaScript("RELEASE", keys=("lease",), argv=("owner",))


@dataclass(frozen=True)
class RotateResult:
    """Outcome of one rotation: the new generation, the ids that failed by timeout, rotations done."""

    rotated: bool
    gen: int
    expired: list[int] = field(default_factory=list)
    steps: int = 0


class RotatingBucketMap:
    """Timeout buckets of one source (see module contract). Not thread-safe per instance."""

    def __init__(
        self,
        store: SourceStore,
        *,
        owner: str | None = None,
        on_expired: ExpiredCallback | None = None,
        scan_max_records: int = EXPIRE_MAX_RECORDS,
    ) -> None:
        self.store = store
        self.num_buckets = store.config.num_buckets
        self.owner = owner or uuid.uuid4().hex
        self.on_expired = on_expired
        self.scan_max_records = scan_max_records

    def current_gen(self) -> int:
        """Rotations so far (the generation new records are filed under)."""
        return int(self.store.client.get(self.store.keys.gen) or 0)

    def acquire_lease(self, ttl_s: float) -> bool:
        """Acquire or renew the rotator lease for ``ttl_s``; False if another owner holds it."""
        k = self.store.keys
        return bool(self.store.run(LEASE, [k.lease], [self.owner, max(1, int(ttl_s * 1000))]))

    def release_lease(self) -> bool:
        """Release the lease if this map holds it (a clean driver shutdown)."""
        return bool(self.store.run(RELEASE, [self.store.keys.lease], [self.owner]))

    def rotate(
        self,
        *,
        use_lease: bool = True,
        expected_gen: int | None = None,
        to_gen: int | None = None,
        expire: bool = True,
    ) -> RotateResult:
        """Open a new bucket and fail the still-pending records of the expired one.

        With ``use_lease`` (the default) the caller must hold the lease, else
        :class:`~ftlayer.errors.LeaseLostError`. With ``expected_gen`` the
        rotation happens only if the current generation equals it (a retry of
        a rotation whose reply was lost does not rotate twice); otherwise the
        result has ``rotated=False``. With ``to_gen`` the map rotates up to
        that generation in one atomic step (every rotation missed in between,
        expired buckets queued oldest first), or does nothing if it is already
        there: calling it again with the same target is a no-op. With
        ``expire=False`` the expired buckets stay queued for
        :meth:`expire_pending` (the FT service scans separately, so a failed
        scan is retried without rotating again).
        """
        k = self.store.keys
        status, gen, *rest = self.store.run(
            ROTATE,
            [k.gen, k.lease, k.expq, k.bcnt],
            [
                self.owner if use_lease else "", self.num_buckets,
                "" if expected_gen is None else expected_gen, "" if to_gen is None else to_gen,
            ],
        )
        if int(status) == -1:
            msg = f"rotator {self.owner} does not hold the lease of {k.prefix!r}"
            raise LeaseLostError(msg)
        if int(status) != 1:
            return RotateResult(False, int(gen))
        self._record_gen_time(int(gen))
        steps = int(gen) - int(rest[1])
        return RotateResult(True, int(gen), self.expire_pending() if expire else [], steps)

    def _record_gen_time(self, gen: int) -> None:
        """Best effort: note when bucket ``gen`` opened (``gtime``) and forget old generations.

        ``gtime`` only feeds monitoring (the age of the oldest pending record),
        so a failed write is logged and never fails the rotation. Generations
        older than ``gen - num_buckets`` have been expired, so their times are
        dropped; a window of ``num_buckets`` such generations is deleted each
        time, which also cleans up after a few rotations whose write was lost.
        """
        key = self.store.keys.key("gtime")
        old = range(max(0, gen - 2 * self.num_buckets), max(0, gen - self.num_buckets))
        try:
            pipe = self.store.client.pipeline(transaction=False)
            pipe.hset(key, str(gen), self.store.now_ms())
            if old:
                pipe.hdel(key, *(str(g) for g in old))
            pipe.execute()
        except (redis.RedisError, FTLayerError) as exc:
            log.warning("could not record the start time of bucket %d of %s: %s", gen, self.store.keys.prefix, exc)

    def expire_pending(self) -> list[int]:
        """Scan queued expired buckets to the end; fail and return still-pending ids.

        One bounded EXPIRE call per chunk (each fails every still-pending id it
        examines, at most once); ``on_expired`` is called per chunk. If a call
        fails, the ids of the chunks before it have failed and the rest stays
        queued: calling this again goes on where it stopped.
        """
        store = self.store
        out: list[int] = []
        if not store.client.llen(store.keys.expq):
            return out  # nothing expired: the common tick
        # a pending record's channel is below the recorded count (a rescale needs a drained source)
        channels = store.channel_keys(store.recorded_channels() or 0)
        holds = Holds(store)
        holds.clean(store.now_ms())
        live = [h.tag for h in holds.all() if h.live(store.now_ms())]
        retries = 0
        while True:
            blob, queued = store.run(
                EXPIRE,
                [*store.state_keys, store.keys.expq, store.keys.read_marks, store.keys.holds,
                 *(store.keys.held(t) for t in live), *channels],
                [
                    store.keys.prefix, store.now_ms(), *store.backoff_args(),
                    self.scan_max_records, SCRIPT_MAX_BYTES, SCRIPT_BUDGET_MS, len(live), *live,
                ],
            )
            if int(queued) < 0:  # a batch started meanwhile: declare its hold and call again
                retries += 1
                if retries > 100:
                    msg = f"EXPIRE on {store.keys.prefix!r}: the holds keep changing; try again later"
                    raise FTLayerError(msg)
                live = [h.tag for h in holds.all() if h.live(store.now_ms())]
                continue
            ids = unpack_ids(blob or b"")
            if ids and self.on_expired is not None:
                self.on_expired(ids)
            out.extend(ids)
            if int(queued) == 0:
                return out
