"""Ingest: run a user source on the driver and persist its records before Spark sees them.

A user source is plain Python, one of:

- an iterable or iterator of records (ends when exhausted);
- a callable returning a record, an iterable of records, or None (nothing now);
  raising StopIteration ends it;
- an object with ``open()``, ``poll()`` (an iterable of records, possibly
  empty) and ``close()``; ``poll`` returning None ends it.

The :class:`Ingestor` thread pulls records, gives each a RecordId and key hash
(the source's key selector), routes it to a channel (fields by that key, else
round-robin) and persists it in batches of at most ``flush_batch_size`` (or
``ingest_batch_records``, if smaller),
waiting at most ``linger_s`` to fill a batch. A record becomes visible to
Spark only after its batch is persisted. Backpressure: while ``max_pending``
records are pending, the thread waits, so a fast source cannot flood Redis.
Pending records are counted (a round trip) before a batch when the count is
older than ``PENDING_RECOUNT_S`` or when the last count plus what this thread
persisted since could have reached ``max_pending``; in between, that sum is an
upper bound of what this thread added, so a lone ingest thread never persists
past ``max_pending`` by more than one batch, and several writers of one source
overshoot by at most what the others persist in ``PENDING_RECOUNT_S``.

Optional hooks of a source object (sources that can confirm upstream):

- ``ack(values)``: called on the ingest thread once the values are safe: every
  value of a batch, in the order the source gave them, after the batch was
  persisted (durable as the durability mode promises; FT off: after it was
  put in the in-driver feed, which promises nothing) or, for a value ingest
  rejects, after it was dead-lettered. Each value is acked exactly once per
  ingest thread; a value is never acked before it is safe. A source confirms
  upstream here (an HTTP 2xx, an MQTT PUBACK, a committed file offset, a
  queue ack); see :mod:`runtime.driver.webhook`. An exception from ``ack`` stops
  ingest like an exception from the source.
- ``waits_when_idle = True`` (an attribute): the source's ``poll()`` blocks by
  itself while nothing comes (a push source waiting on a condition), so ingest
  polls it again at once after an idle poll instead of sleeping ``linger_s``.
  A request/response source (the webhook) returns an idle poll as soon as what
  it handed over waits for its confirmation, and the sleep would add to every
  answer's latency.
- ``ingest_paused(reason)``: called when ingest starts waiting (``reason`` says
  why: backpressure, or Redis unreachable) and with None when it goes on, so a
  push source can refuse new work meanwhile (the webhook answers 503).

Loss window of a source without ``ack``: values ingest took from the source
and had not persisted yet are lost if the driver process dies: at most one
batch (at most ``flush_batch_size`` values, or ``ingest_batch_records`` if
that is smaller: set it to 1 to hold one value at a time, at the cost of one
persist call per record), plus whatever the source itself buffers.

Contract on errors: an exception from the user source (or a hook) stops ingest
and is kept in ``Ingestor.error`` (the query keeps running and drains what was
persisted; ``FTQuery.drained()`` then raises instead of reporting drained).
A :class:`~ftlayer.errors.DurabilityError` (a WAITAOF that timed out in 'waitaof'
mode: the batch reached the server, its fsync is unconfirmed) stops ingest and
is kept in ``Ingestor.error``, never retried: a stalled disk is for an operator.
That batch is not confirmed upstream, and the records read after it are not
sent (counted in ``abandoned``): a source that can resend them does.
In the 'replicated' modes an unconfirmed WAIT is transient (a failover, a new
primary without its replica yet): ingest pauses (``paused`` says "durability")
and retries the same records, which PERSIST skips if already filed, until a
replica confirms them. Any other Redis error (unreachable, restarting, a script refused) never stops ingest:
it pauses (``Ingestor.paused`` says why; counted in ``Ingestor.pauses``) and
retries with backoff, holding the batch, for as long as the outage lasts, so
nothing read from the source is dropped while the process lives, unless
``stop()`` is called while Redis is unreachable: the batch held then (at most
one batch, never reported as persisted nor acked) is
abandoned, logged and counted in ``Ingestor.abandoned``, unless Redis answers (and, in the
'replicated' modes, a replica confirms) within ``stop_grace_s`` (5 s) of ``stop()``: the batch
in hand is retried that long first (a persist whose reply was lost may have reached the server:
counted as abandoned, never acked, it is at worst a duplicate when the source sends it again, never
a loss). A record whose key selector
raises, whose value cannot be serialized, or (with ``check``) that the check
refuses is never persisted for processing: it is handed to the destination's
``reject`` (FT on: a dead letter with the reason, ``ftlayer dlq`` shows it;
FT off: dropped, logged and counted) and ingest goes on with the next record.

``check`` (optional): called with the packed payloads of each batch, it returns
``{index: reason}`` of those that must not be persisted; a schema declared at
ingest is one (:class:`runtime.spark.schema_check.SchemaCheck`: a record that
does not fit the schema the query reads is dead-lettered here, at once, with
the reason ``ingest: does not fit the schema: ...``, instead of being failed
by each read and replayed until its budget is spent). A batch the check passes
whole costs the check only; one with a misfit is sorted out record by record.
An exception from the check stops ingest like an exception from the source.

Where batches go is pluggable (:mod:`runtime.driver.destinations`): an :class:`FTLayer` (FT on)
is wrapped in a :class:`~runtime.driver.destinations.PersistDestination`; with FT off the
topology passes a ``runtime.driver.feed.FeedDestination`` (an in-memory feed, no Redis). Any
object with the :class:`~runtime.driver.destinations.BatchDestination` attributes works; key
hashing and channel routing stay here, the same for both. The kinds of user source are adapted
in :mod:`runtime.driver.source_adapters`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal

import redis
from redis.backoff import ExponentialBackoff

from ftlayer.errors import DurabilityError, FTLayerError, IngestCheckError, SerializationError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.logs import logger_for
from partitioners.factory import partitioner_for, source_strategy
from runtime.driver.destinations import BatchDestination, PersistDestination
from runtime.driver.ingest_batch import HeldBatch, KeySelector, PayloadCheck, prepare
from runtime.driver.iterable_batches import iterable_batches
from runtime.driver.source_adapters import is_plain_iterable, source_polls
from runtime.sources import AckingSource, PausableSource

__all__ = ["RETRYABLE", "Ingestor", "KeySelector", "PayloadCheck"]

log = logger_for(__name__)

# errors of the destination that pause ingest instead of stopping it: an outage, a server
# restarting or loading its AOF, a script refused (raw redis-py errors included: a command
# outside a script, such as HLEN, WAITAOF or XADD, raises them unwrapped)
RETRYABLE: tuple[type[BaseException], ...] = (FTLayerError, redis.RedisError)
# waits between retries while paused: 25 ms doubling to 2 s (redis-py's backoff)
PAUSE_BACKOFF = ExponentialBackoff(cap=2.0, base=0.0125)
# how long a batch in hand when stop() comes is still retried: a failover or a restart that
# ends within it loses nothing (a query restarted after its source's primary died stops the
# ingest thread while the new primary's replica is still catching up)
STOP_GRACE_S = 5.0
# how old a count of pending records may be before the next batch counts again (module notes):
# counting before every batch was a second round trip per persist, a third of a small batch's
# time (the webhook's batches are a few requests)
PENDING_RECOUNT_S = 0.05


class Ingestor:
    """Driver-side thread that persists one source's records (see module contract)."""

    def __init__(
        self,
        layer: FTLayer | BatchDestination,
        source: Any,
        *,
        key: KeySelector | None = None,
        partitioning: str | None = None,
        linger_s: float = 0.02,
        check: PayloadCheck | None = None,
    ) -> None:
        dest: BatchDestination = PersistDestination(layer) if isinstance(layer, FTLayer) else layer
        self.destination = dest
        self.source = source
        self.key = key
        self.check = check
        self.linger_s = linger_s
        strategy = partitioning or source_strategy(key is not None)  # as the FT service replays
        self.partitioner = partitioner_for(strategy, dest.num_channels)
        self.batch_size = dest.batch_size
        self.max_pending = dest.max_pending
        self.ingested = 0
        self.rejected = 0  # records set aside by reject() (key selector raised, not serializable)
        self.abandoned = 0  # records read but never persisted: stop() came during an outage, or the check failed
        self.error: BaseException | None = None  # why ingest stopped for good (the source or a hook raised)
        self.paused: str | None = None  # why ingest waits right now (backpressure, Redis unreachable)
        self.pauses = 0  # how many times it started waiting for Redis to come back
        self.durability_retries = 0  # persists retried because no replica confirmed them (replicated modes)
        self._pause_kind: str | None = None
        # pending at the last count plus what this thread persisted since (an upper bound of the
        # pending count while this thread is the source's only writer), and when it was counted
        self._pending_bound: int | None = None
        self._counted_at = 0.0
        self.stop_grace_s = STOP_GRACE_S
        self._stop = threading.Event()
        self._stopped_at: float | None = None  # monotonic time of stop(): its grace runs from here
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._ack_hook: Callable[[list[Any]], None] | Literal[False] | None = None  # the source's ack; False: none
        self._held: HeldBatch | None = None  # the batch being persisted, until its put returns

    @property
    def done(self) -> bool:
        """True once the source ended (or failed) and everything read was persisted."""
        return self._done.is_set()

    # --- pauses and hooks (see the module notes) --------------------------------------
    def _report(self, state: str, detail: str = "") -> None:
        report = getattr(self.destination, "report_state", None)
        if report is None:
            return
        try:
            report(state, detail)
        except RETRYABLE:  # best effort: the next change of state writes again
            log.debug("could not record ingest state %s of %s", state, self.destination.label)

    def _pause(self, kind: str, detail: str) -> None:
        """Ingest waits (``kind``: "outage" or "backpressure"); tell the source and status once per change."""
        self.paused = f"{kind}: {detail}"
        if kind == self._pause_kind:
            return
        self._pause_kind = kind
        if kind == "outage":
            self.pauses += 1
            log.warning("ingest of %s paused: %s; retrying until it answers", self.destination.label, detail)
        else:  # an outage cannot be recorded in Redis; backpressure can
            self._report("paused", self.paused)
        self._tell_source(self.paused)

    def _resume(self) -> None:
        if self._pause_kind is None:
            return
        if self._pause_kind == "outage":
            log.warning("ingest of %s resumed after the outage", self.destination.label)
        self.paused = self._pause_kind = None
        self._report("running")
        self._tell_source(None)

    def _tell_source(self, reason: str | None) -> None:
        if isinstance(self.source, PausableSource):  # not per batch: a pause is rare
            try:
                self.source.ingest_paused(reason)
            except Exception:  # advisory only: a broken hook must not stop ingest
                log.exception("ingest_paused hook of the source of %s failed", self.destination.label)

    def _ack(self, values: list[Any]) -> None:
        """The source's ``ack`` hook, if any, with values that are now safe (see the module notes)."""
        if values:
            if self._ack_hook is None:  # looked up once: a runtime_checkable isinstance costs ~30 us a call
                self._ack_hook = self.source.ack if isinstance(self.source, AckingSource) else False
            hook = self._ack_hook
            if hook is not False:
                hook(values)

    def _channels(self, hashes: Any) -> Sequence[int]:
        """Channels of key hashes: a numpy array on the fast path, a list when sorted out one by one."""
        if isinstance(hashes, list):
            return self.partitioner.select_channels(hashes)
        channels: Sequence[int] = self.partitioner.select_channel_array(hashes)
        return channels

    def _reject(self, value: Any, exc: BaseException | None, *, reason: str = "") -> None:
        if exc is not None:
            what = "cannot be serialized" if isinstance(exc, SerializationError) else "key selector raised"
            reason = f"ingest: {what}: {type(exc).__name__}: {exc}"
        log.warning("record rejected by ingest of %s (%s)", self.destination.label, reason)
        self._retrying("dead-lettering a rejected record", lambda: self.destination.reject(value, reason))
        self.rejected += 1  # once it is set aside: an attempt that gives up (stop()) is not counted

    def _given_up(self) -> bool:
        """True once ``stop()`` came and its grace has run out (a retry loop then raises)."""
        at = self._stopped_at
        return self._stop.is_set() and (at is None or time.monotonic() - at >= self.stop_grace_s)

    def _backoff(self, failures: int) -> None:
        delay = PAUSE_BACKOFF.compute(failures)
        if self._stop.is_set():  # within the grace: wait, but not past it
            at = self._stopped_at if self._stopped_at is not None else time.monotonic()
            time.sleep(max(0.0, min(delay, at + self.stop_grace_s - time.monotonic())))
        else:
            self._stop.wait(delay)

    def _retrying(self, what: str, call: Callable[[], None]) -> None:
        """``call()`` until it succeeds: a Redis error pauses ingest and is retried with backoff
        for as long as it lasts; only ``stop()`` ends the wait, once its grace has run out (the
        error is then raised)."""
        failures = 0
        while True:
            try:
                call()
            except DurabilityError as exc:  # the write reached the server, its wait is unconfirmed
                if not getattr(self.destination, "retry_durability", False) or self._given_up():
                    raise
                failures += 1
                self.durability_retries += 1
                if failures == 1:
                    log.warning("%s of %s: %s; retrying the same records", what, self.destination.label, exc)
                self._pause("durability", f"{what}: {exc}")
                self._backoff(failures)
            except RETRYABLE as exc:
                if self._given_up():
                    raise
                failures += 1
                if failures == 1:
                    log.warning("%s of %s failed (%s: %s); retrying with backoff", what,
                                self.destination.label, type(exc).__name__, exc)
                self._pause("outage", f"{what}: {type(exc).__name__}: {exc}")
                self._backoff(failures)
            else:
                self._resume()
                return

    def _persist(self, values: list[Any]) -> None:
        """Persist ``values`` (rejects dead-lettered first): the batch is held until its put returns, so
        an attempt at the same values after a failure files no dead letter twice
        (:mod:`runtime.driver.ingest_batch`)."""
        held = self._held
        if held is None or not held.holds(values):
            held = self._held = HeldBatch(values)
        payloads, hashes, channels, columns = prepare(held, key=self.key, check=self.check,
                                                      channels_of=self._channels, reject=self._reject)
        if payloads:
            # columns only when a check made them: a destination without columns keeps its 3-argument put
            put = self.destination.put
            self._retrying("persist", (lambda: put(payloads, hashes, channels)) if columns is None
                           else (lambda: put(payloads, hashes, channels, columns=columns)))
            self.ingested += len(payloads)
            if self._pending_bound is not None:
                self._pending_bound += len(payloads)
        self._held = None

    def _wait_for_room(self) -> None:
        """Wait while ``max_pending`` records are pending (backpressure) or Redis cannot say; no
        round trip while a recent count shows room (see the module notes)."""
        bound = self._pending_bound
        if (bound is not None and bound < self.max_pending and self._pause_kind is None
                and time.monotonic() - self._counted_at < PENDING_RECOUNT_S):
            return
        failures = 0
        while not self._stop.is_set():
            try:
                pending = self.destination.pending_count()
            except RETRYABLE as exc:
                failures += 1
                self._pending_bound = None
                self._pause("outage", f"counting pending records: {type(exc).__name__}: {exc}")
                self._stop.wait(PAUSE_BACKOFF.compute(failures))
                continue
            failures = 0
            self._pending_bound, self._counted_at = pending, time.monotonic()
            if pending < self.max_pending:
                self._resume()
                return
            self._pause("backpressure", f"{pending} records pending (max_pending {self.max_pending})")
            time.sleep(0.02)

    def run(self) -> None:
        """Ingest until the source ends or ``stop()``; usable without the thread (tests).

        A poll's records are taken whole (:func:`source_polls`); a batch is persisted once it
        holds ``batch_size`` records (at most that many per persist: the rest waits for the next),
        at an idle poll, or once its first record waited ``linger_s``. An iterable source is cut
        into such batches by :func:`~runtime.driver.iterable_batches.iterable_batches` (the same
        rules, no per-record step here), each persisted as it comes."""
        batch: list[Any] = []
        monotonic, stopped = time.monotonic, self._stop.is_set  # once per poll: no attribute lookups
        batch_size, linger_s = self.batch_size, self.linger_s
        # a source whose poll() itself waits while idle (waits_when_idle) is polled again at once
        idle_s = 0.0 if getattr(self.source, "waits_when_idle", False) else linger_s
        started = monotonic()
        whole = is_plain_iterable(self.source)  # its polls are whole batches, persisted as they come
        polls = (iterable_batches(self.source, self._stop, batch_size, linger_s) if whole
                 else source_polls(self.source, self._stop))
        self._report("running")
        try:
            for got in polls:
                if got:
                    if not batch:
                        started = monotonic()
                        batch = list(got)  # our own list: the source may keep or reuse the one it returned
                    else:
                        batch += got
                while batch and (whole or len(batch) >= batch_size or not got or monotonic() - started >= linger_s):
                    take = batch if len(batch) <= batch_size else batch[:batch_size]
                    self._wait_for_room()
                    try:
                        self._persist(take)
                    except DurabilityError:
                        batch = batch[len(take):]  # the records sent reached the server (see below)
                        self._held = None  # that batch is done with: never matched again
                        raise
                    batch = batch[len(take):] if len(batch) > len(take) else []
                    self._ack(take)
                if not got and idle_s:
                    time.sleep(idle_s)
                if stopped():
                    break
        except DurabilityError as exc:
            self._durability_failed(exc)
            # what reached the server is not persisted again (it would be duplicated under new
            # ids); the records never sent are left to _finish, which abandons them (ingest stops)
        except IngestCheckError as exc:  # nothing of the batch persisted or confirmed: _finish leaves it
            self.error = exc
        except Exception as exc:
            if self._stop.is_set() and isinstance(exc, RETRYABLE):
                pass  # stop() during an outage: _finish abandons the batch held (module contract)
            else:  # a broken user source (or hook) stops ingest, not the query
                self.error = exc
                if isinstance(exc, FTLayerError):  # ftlayer's own source saying why (an MQTT subscription
                    # refused on a reconnect): the message is the whole story, a traceback only noise
                    # before the CLI's error line
                    log.log(logging.ERROR, "source of %s stopped ingest: %s: %s", self.destination.label,
                            type(exc).__name__, exc)
                else:
                    log.exception("user source of %s failed; ingest stopped", self.destination.label)
        finally:
            self._finish(batch)

    def _finish(self, batch: list[Any]) -> None:
        """Persist (and ack) the batch still held, record the final state, mark done."""
        try:
            while batch:  # at most batch_size records a persist, as in run()
                if isinstance(self.error, (IngestCheckError, DurabilityError)):
                    self._abandon(batch, self.error)  # ingest stops on these: nothing more is sent
                    break
                take, batch = batch[:self.batch_size], batch[self.batch_size:]
                try:
                    self._persist(take)
                except DurabilityError as exc:  # take reached the server: only the rest was never sent
                    self._held = None
                    self._durability_failed(exc)
                    self._abandon(batch, exc)
                    break
                except IngestCheckError as exc:
                    self.error = self.error or exc
                    self._abandon(take + batch, exc)
                    break
                except RETRYABLE:  # stop() during an outage: see the module contract
                    held = self._held
                    set_aside = len(held.rejected) if held is not None and held.holds(take) else 0  # dead-lettered
                    lost = len(take) + len(batch) - set_aside
                    self.abandoned += lost
                    log.exception("ingest of %s stopped while Redis was unreachable: %d records read from the "
                                  "source were never persisted", self.destination.label, lost)
                    break
                else:
                    self._ack(take)
        except Exception as exc:  # the source's ack hook raised
            self.error = self.error or exc
            log.exception("ack hook of the source of %s failed; ingest stopped", self.destination.label)
        finally:
            if self.error is not None:
                self._report("error", f"{type(self.error).__name__}: {self.error}")
            else:
                self._report("stopped" if self._stop.is_set() else "ended")
            self._done.set()

    def _abandon(self, values: list[Any], why: BaseException) -> None:
        """Ingest stops on ``why`` with ``values`` read from the source and never sent: counted in
        ``abandoned``, never confirmed upstream (a source that can resend them does)."""
        if values:
            self.abandoned += len(values)
            log.error("ingest of %s stopped (%s: %s): %d records read from the source were not persisted nor "
                      "confirmed", self.destination.label, type(why).__name__, why, len(values))

    def _durability_failed(self, exc: DurabilityError) -> None:
        """'waitaof' unconfirmed: stop and report, never loop (see the module contract)."""
        self.error = self.error or exc
        log.error("ingest of %s stopped: %s", self.destination.label, exc)

    def start(self) -> Ingestor:
        self._thread = threading.Thread(target=self.run, name="ftlayer-ingest", daemon=True)
        self._thread.start()
        return self

    def request_stop(self) -> None:
        """Ask the thread to stop (returns at once): it stops reading the source, and a batch in
        hand is still retried for ``stop_grace_s`` before it is abandoned. Idempotent."""
        if self._stopped_at is None:
            self._stopped_at = time.monotonic()
        self._stop.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        """:meth:`request_stop`, then wait up to ``timeout_s`` for the thread to end."""
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout_s)
