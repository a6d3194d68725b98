"""FTService: the driver-side loop that rotates timeout buckets and runs the replayer.

One thread per driver serves every source of a topology, each shard of a source
on its own (``ftlayer.facade.shard``: own generation, lease and buckets). Each tick it renews
the rotator lease of each shard, rotates a source's buckets when its
rotation interval ``timeout_s / (num_buckets - 1)`` has passed (only while it
holds the lease, so two drivers never rotate the same source twice as fast),
replays every due failure, and trims channel-stream entries whose records
are all done. Rotation and replay state live in Redis, so a
restarted driver resumes where the old one stopped: records still pending
time out and are replayed.

Lease hand-over: a driver that dies keeps its lease until the lease TTL
(``lease_ttl_s``, 3 rotation intervals by default) runs out; during that time
nobody rotates, so the timeout bound of records filed then stretches by up to
the TTL. A clean ``stop()`` releases the lease at once.

Faults: rotations follow a fixed schedule per lease and are made by target
generation (see :meth:`tick`), so a failed or lost rotation or scan never
causes an extra rotation inside an interval, and rotations missed during an
outage are caught up in order when Redis answers again; the timeout bound
then stretches by the outage, never shrinks for records filed on schedule.

Sink outages: while a source's sink breaker is open (``ftlayer.acker.breaker``: an acking point is
retrying a batch whose write failed) its failed records wait instead of being replayed, so an
outage of the sink does not spend their replay budget.

Outages: a tick that fails (Redis unreachable, restarting) is retried with
backoff (redis-py's ExponentialBackoff, up to 2 s between tries) for up to
``outage_budget_s`` (300 s by default) of consecutive failures; then the
service gives up: the thread ends and :attr:`FTService.error` holds a
:class:`~ftlayer.errors.ServiceStoppedError` (``FTQuery.drained()`` raises
it). Nothing is lost while it is down: state is in Redis, and a new service
(or driver) resumes from it.

The clock is injectable and :meth:`tick` is public, so tests drive rotations
without sleeping.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import redis
from redis.backoff import ExponentialBackoff

from ftlayer.acker.breaker import SinkBreaker
from ftlayer.errors import FTLayerError, LeaseLostError, ServiceStoppedError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.shard import Shard
from ftlayer.store.source_store import Clock

log = logging.getLogger(__name__)


class FTService:
    """Rotator and replayer for a set of FTLayers (one per source).

    ``trim_every_s``: how often each source's finished head entries are trimmed
    (``PersistenceLayer.trim_done``; also once more at ``stop()``).
    """

    def __init__(
        self,
        layers: Sequence[FTLayer],
        *,
        clock: Clock | None = None,
        tick_s: float | None = None,
        trim_every_s: float = 2.0,
        lease_ttl_s: float | None = None,
        outage_budget_s: float | None = None,
    ) -> None:
        if not layers:
            msg = "FTService needs at least one source"
            raise FTLayerError(msg)
        self.layers = list(layers)
        # every shard of every source is rotated, scanned, replayed and trimmed on its own (own lease)
        self._units: list[Shard] = [shard for layer in self.layers for shard in layer.shards]
        cfg = self.layers[0].config
        self.clock = clock or time.monotonic
        self.interval_s = cfg.rotation_interval_s
        self.tick_s = tick_s if tick_s is not None else min(0.25, self.interval_s / 4)
        self.lease_ttl_s = lease_ttl_s if lease_ttl_s is not None else max(3 * self.interval_s, 2.0)
        self._schedule: dict[int, tuple[float, int]] = {}  # unit (a shard) -> (lease taken at, gen then)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rotations = 0
        self.errors = 0
        self.paused_ticks = 0  # shard ticks that skipped replays for an open sink breaker
        self.outage_budget_s = outage_budget_s if outage_budget_s is not None else cfg.outage_budget_s
        self.error: ServiceStoppedError | None = None  # set when the service gave up (module notes)
        self.trim_every_s = trim_every_s
        self._last_trim: dict[int, float] = {}

    def tick(self) -> None:
        """One pass: renew leases, rotate the sources that are due, scan, replay due failures.

        Rotation schedule: when this service takes a source's lease at time
        ``t0`` with the source at generation ``g0``, the k-th rotation is due
        at ``t0 + k * interval`` and brings the source to generation ``g0 + k``.
        A tick rotates *to* the generation due now (``ROTATE`` with a target:
        a no-op if it is already there), so a retried or lost call, or a scan
        that failed after its rotation, never rotates twice inside an
        interval, and rotations missed while Redis or this thread was down are
        caught up in one atomic step, oldest expired bucket first. The scan of
        expired buckets runs on every tick while holding the lease, so a scan
        that failed resumes on the next tick where it stopped.
        """
        now = self.clock()
        for i, shard in enumerate(self._units):
            holds = shard.buckets.acquire_lease(self.lease_ttl_s)
            if holds:
                if i not in self._schedule:
                    self._schedule[i] = (now, shard.buckets.current_gen())
                start, base = self._schedule[i]
                due = int((now - start) // self.interval_s)
                if due > 0:
                    try:
                        result = shard.buckets.rotate(use_lease=True, to_gen=base + due, expire=False)
                    except LeaseLostError:
                        self._schedule.pop(i, None)
                        continue
                    self.rotations += result.steps
                shard.buckets.expire_pending()
            else:
                self._schedule.pop(i, None)
            # one bounded replay pass per tick, so a replay storm cannot starve rotation or the lease;
            # none while the source's sink breaker is open (a sink outage: ftlayer.acker.breaker)
            if not self._paused(shard):
                shard.replayer.replay_due()
            # trimming finished head entries is clean-up for a drained source (a running query
            # trims on every batch), and it costs a lookup per chunk of the head entry: not every tick
            if now - self._last_trim.get(i, float("-inf")) >= self.trim_every_s:
                shard.persistence.trim_done()
                self._last_trim[i] = now

    def _paused(self, shard: Shard) -> bool:
        """True while the sink breaker of the shard's source is open (replays wait)."""
        store = shard.store
        paused = SinkBreaker(store.client, store.keys).is_open(store.now_ms())
        if paused:
            self.paused_ticks += 1
        return paused

    def _run(self) -> None:
        backoff = ExponentialBackoff(cap=max(2.0, self.tick_s), base=self.tick_s / 2)
        failing_since: float | None = None
        failures = 0
        while not self._stop.is_set():
            wait = self.tick_s
            try:
                self.tick()
            except (FTLayerError, redis.RedisError) as exc:
                # Redis down or restarting: retry with backoff; state is in Redis, nothing is lost
                self.errors += 1
                failures += 1
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= self.outage_budget_s:
                    names = ", ".join(f"{ly.store.keys.topology}/{ly.store.keys.source}" for ly in self.layers)
                    msg = (f"ftlayer service of {names} gave up: Redis failed for {now - failing_since:.0f} s, "
                           f"beyond outage_budget_s={self.outage_budget_s:g}: {type(exc).__name__}: {exc}")
                    self.error = ServiceStoppedError(msg)
                    self.error.__cause__ = exc
                    log.exception("%s", msg)
                    return
                if failures == 1:
                    log.exception("ftlayer service tick failed; retrying with backoff")
                wait = backoff.compute(failures)
            else:
                if failures:
                    log.warning("ftlayer service is back after %d failed ticks", failures)
                failing_since, failures = None, 0
            self._stop.wait(wait)

    def start(self) -> FTService:
        """Start the background thread (daemon). Idempotent; restarts a service that gave up."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self.error = None
            self._thread = threading.Thread(target=self._run, name="ftlayer-service", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop the thread, trim finished channel entries one last time, release the leases."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        for shard in self._units:
            try:
                shard.persistence.trim_done()
                shard.buckets.release_lease()
            except FTLayerError:
                log.warning("could not release the rotator lease of %s", shard.store.keys.prefix)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

