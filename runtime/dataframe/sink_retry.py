"""Retry a micro-batch's failed write in place, with its sources' sink breaker open.

Used by both acking points of the DataFrame path: ``acking`` retries the ``foreachBatch``
function on the same batch DataFrame (Spark recomputes it: the same records, minus those
settled meanwhile), the acking writer retries ``fn`` on the task's rows. Contract of
:meth:`SinkRetry.run`:

- **Backoff.** After a failed attempt it waits 0.5 s, doubling up to 10 s, and tries again,
  for at most ``sink_retry_budget_s`` in all; it returns None once an attempt succeeds and
  the last exception when the next wait would pass the budget (``sink_retry_budget_s = 0``:
  one attempt).
- **Nothing times out meanwhile.** The batch is still running, so its hold keeps its records
  from timing out (``ftlayer.acker.holds``; up to ``max_batch_s``), and the query reads nothing new.
- **Nothing is replayed meanwhile.** Every failed attempt opens (renews) the sink breaker of
  every source the batch read (``ftlayer.acker.breaker``), for ``max(10 s, sink_retry_budget_s)``:
  the FT service replays none of their failed records, which would only meet the same broken
  sink. A successful write closes it. Giving up leaves it open: the next batches' writes (new
  records) are the probes, and replays resume when one succeeds, or when the breaker lapses
  (the probe for a query with nothing new to write). So during an outage longer than the budget
  a record spends about one replay per breaker lease, not one per failed batch.
- Redis errors while opening or closing the breaker are logged, never raised: the breaker is
  an optimisation of the replay budget, not part of the promise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from ftlayer.acker.breaker import SinkBreaker
from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError
from ftlayer.keyspace.keys import SourceKeys
from ftlayer.logs import logger_for
from ftlayer.store.connection import client_for

__all__ = ["BACKOFF_INITIAL_S", "BACKOFF_MAX_S", "SinkRetry", "breakers", "close_breakers"]

log = logger_for(__name__)

BACKOFF_INITIAL_S, BACKOFF_MAX_S = 0.5, 10.0
MIN_BREAKER_LEASE_S = 10.0  # an open breaker lasts this long, or one retry budget, after the last failure
_left_open: set[str] = set()  # queries whose last batch gave up with their breakers open (this process)


def breakers(config: FTConfig, sources: Sequence[str]) -> list[SinkBreaker]:
    """The sink breakers of ``topology/source`` names in ``config``'s namespace."""
    client = client_for(config.redis_url, config.connect_timeout_s)
    out = []
    for name in sources:
        topology, _, source = name.partition("/")
        out.append(SinkBreaker(client, SourceKeys(config.namespace, topology, source)))
    return out


def close_breakers(config: FTConfig, sources: Sequence[str]) -> None:
    """Close the sink breakers of ``sources`` (a batch was written); errors are logged."""
    try:
        for breaker in breakers(config, sources):
            breaker.close()
    except Exception as exc:
        log.warning("could not close the sink breakers of %s: %s", ", ".join(sources), exc)


class SinkRetry:
    """Retries one batch's write (see the module contract)."""

    def __init__(self, config: FTConfig, query_id: str, sources: Callable[[], Sequence[str]], *, what: str,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.config = config
        self.query_id = query_id
        self.sources = sources
        self.what = what
        self.clock = clock
        self.sleep = sleep
        self.attempts = 0
        self._opened: list[SinkBreaker] = []

    def run(self, write: Callable[[], object]) -> Exception | None:
        """Call ``write`` until it succeeds or the budget is spent; None or the last exception."""
        start = self.clock()
        budget = self.config.sink_retry_budget_s
        while True:
            self.attempts += 1
            try:
                write()
            except Exception as exc:
                delay = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** (self.attempts - 1))
                if self.clock() - start + delay > budget:
                    if self._opened:
                        _left_open.add(self.query_id)  # the next batch that writes closes it
                    if self.attempts > 1:
                        log.error("%s failed %d times over %.0f s (sink_retry_budget_s=%g); giving up: %s: %s",  # noqa: TRY400
                                  self.what, self.attempts, self.clock() - start, budget, type(exc).__name__, exc)
                    return exc
                self._open(f"{type(exc).__name__}: {exc}")
                log.warning("%s failed (attempt %d; %s: %s); retrying in %.1f s, replays of its sources paused",
                            self.what, self.attempts, type(exc).__name__, exc, delay)
                self.sleep(delay)
                continue
            if self.attempts > 1 or self.query_id in _left_open:
                self._close()
            return None

    def _open(self, error: str) -> None:
        try:
            self._opened = breakers(self.config, self.sources())
            now_ms = int(time.time() * 1000)
            lease = max(MIN_BREAKER_LEASE_S, self.config.sink_retry_budget_s)
            for breaker in self._opened:
                breaker.open(self.query_id, error, now_ms, lease)
        except FTLayerError as exc:
            log.warning("could not open the sink breaker for %s: %s", self.what, exc)
        except Exception as exc:  # redis errors: the breaker is best effort
            log.warning("could not open the sink breaker for %s: %s", self.what, exc)

    def _close(self) -> None:
        _left_open.discard(self.query_id)
        if not self._opened:
            try:
                self._opened = breakers(self.config, self.sources())
            except Exception as exc:
                log.warning("could not close the sink breakers for %s: %s", self.what, exc)
        for breaker in self._opened:
            try:
                breaker.close()
            except Exception as exc:
                log.warning("could not close the sink breaker %s: %s", breaker.key, exc)
        self._opened = []
