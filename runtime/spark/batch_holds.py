"""The holds of one streaming query's micro-batches on one source, kept by the FT source's reader.

Runs in the one long-lived Python process per query in which Spark calls the FT source's
driver-side methods (``partitions``, ``latestOffset``, ``commit``; see ``runtime.spark.ft_source``).
What a hold does is :mod:`ftlayer.acker.holds`; this class decides when holds start, last and end:

- :meth:`begin` when Spark plans a batch (``partitions``): the hold starts with a deadline one
  lease ahead, and the heartbeat thread (started on first use, a daemon) renews it every
  ``lease / 3``, never past ``max_batch_s`` after the batch was planned. A hold that reached
  that bound is dropped with a warning: the batch hangs, and its records time out and replay.
- :meth:`end` once Spark committed the batch (after its records were settled), or when the
  commit listener ended the hold first (a renewal finds it gone and drops it).
- :meth:`carry`: a batch capped by ``max_records_per_batch`` may end inside a stream entry, and
  the entry then counts as read (its chunks' timeouts fail them). Before the batch's hold ends,
  the reader puts the chunks of that entry's unread rest in a *carry* hold, renewed like a
  batch's, which it ends once the next batch (that reads them, under its own hold) committed.
- The process ends with the query (stop, failure, or its driver killed): renewals stop and
  every hold lapses within one lease, so the records time out about as they would have.

Redis errors in the thread are logged and retried at the next beat: a hold that cannot be
renewed lapses, which costs a replay (a duplicate), never a record.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.logs import logger_for

__all__ = ["HOLD_SET_MARGIN_S", "BatchHolds"]

log = logger_for(__name__)

HOLD_SET_MARGIN_S = 600.0  # a hold set outlives the longest hold by this much (then expires)
_REMEMBERED = 64  # settled tags remembered, so a batch is settled once per reader


class BatchHolds:
    """Holds of one query on one source (see the module contract). Thread-safe."""

    def __init__(self, layer: FTLayer, *, max_batch_s: float, lease_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self.layer = layer
        self.max_batch_s = max_batch_s
        self.lease_s = lease_s
        self.clock = clock
        self._active: dict[str, float] = {}  # tag -> when the batch was planned (clock seconds)
        self._settled: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def _deadline_ms(self, started: float, now: float) -> int:
        return int(min(now + self.lease_s, started + self.max_batch_s) * 1000)

    def begin(self, tag: str) -> None:
        """Hold the batch ``tag`` (planned now) and keep renewing it while it runs."""
        now = self.clock()
        with self._lock:
            started = self._active.setdefault(tag, now)  # a re-planned batch keeps its first start
        try:
            self.layer.start_hold(tag, self._deadline_ms(started, now), int(started * 1000))
        except FTLayerError as exc:
            log.warning("could not hold batch %s of %s: %s; its records may time out while it runs",
                        tag, self.layer.keys.prefix, exc)
        self._ensure_thread()

    def carry(self, tag: str, chunks_by_shard: dict[int, list[bytes]], ttl_ms: int) -> None:
        """Hold ``chunks_by_shard`` (shard -> chunk ids) under ``tag`` from now, renewed until :meth:`end`."""
        self.begin(tag)
        for shard, chunks in chunks_by_shard.items():
            self.layer.hold_chunks(tag, shard, chunks, ttl_ms)

    def settled(self, tag: str) -> bool:
        """True if this reader already settled and ended batch ``tag``."""
        with self._lock:
            return tag in self._settled

    def end(self, tag: str) -> None:
        """The batch ``tag`` committed and its records were settled: end its hold."""
        with self._lock:
            self._active.pop(tag, None)
            self._settled[tag] = None
            while len(self._settled) > _REMEMBERED:
                self._settled.popitem(last=False)
        self.layer.end_hold(tag)

    @property
    def active(self) -> list[str]:
        with self._lock:
            return list(self._active)

    def beat(self) -> None:
        """Renew every active hold once (the thread calls this every ``lease / 3``)."""
        now = self.clock()
        with self._lock:
            active = list(self._active.items())
        for tag, started in active:
            if now >= started + self.max_batch_s:
                log.warning("batch %s of %s has run for more than max_batch_s=%g s; its records now time out "
                            "and replay as usual", tag, self.layer.keys.prefix, self.max_batch_s)
                with self._lock:
                    self._active.pop(tag, None)
                continue
            if not self.layer.renew_hold(tag, self._deadline_ms(started, now), int(started * 1000)):
                with self._lock:  # ended by the commit listener
                    self._active.pop(tag, None)

    def _ensure_thread(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(target=self._run, name="ftlayer-batch-holds", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.lease_s / 3):
            try:
                self.beat()
            except Exception as exc:  # never let the thread die: a missed beat only lets holds lapse
                log.warning("could not renew the batch holds of %s: %s", self.layer.keys.prefix, exc)

    def stop(self) -> None:
        """Stop renewing (tests); the holds lapse within one lease."""
        self._stop.set()
