"""Riding out Redis outages: a redis-py ``Retry`` bounded by time (the outage budget), not by count.

redis-py's default retry (3 attempts, ~0.7 s) turns a server restart of a few seconds into an
error; in a Spark task that error fails the task, and 4 attempts are spent in about a second, so
the query dies. :class:`OutageRetry` keeps retrying a command that failed with a connection
error or timeout, with exponential backoff (50 ms doubling to ``cap_s``), until it succeeds or
``budget_s`` seconds have passed since its first failure; then the last error is raised.

Safe because every ftlayer call is idempotent under a client retry: scripts skip known ids,
flushes carry tokens, fails and replays check state, reads and trims are repeatable. Only
errors that mean "no answer" are retried (``ConnectionError``, which includes
``BusyLoadingError`` while a restarted server loads its AOF, and ``TimeoutError``); a command
the server refused is raised at once.

Who uses it (``FTConfig.outage_budget_s``, default 300 s): clients in Spark's Python processes
(the FT source, operator and sink flushes, keyed state) and the driver-side foreachBatch sink.
The ingest thread and the FT service keep redis-py's short retry and run their own loops
(ingest pauses for as long as it takes; the service gives up after the same budget), so that
``stop()`` stays prompt.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar

from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

T = TypeVar("T")

# 50 ms, 100 ms, ... up to 1 s between attempts: a restarted server is used within a second
DEFAULT_CAP_S = 1.0
DEFAULT_BASE_S = 0.025


class OutageRetry(Retry):
    """A redis-py Retry that gives up after ``budget_s`` seconds of failures, not N attempts.

    ``clock`` and ``sleep`` are injectable for tests. The count-based ``retries`` of the base
    class is -1 (unbounded); the time budget is the bound. ``errors`` replaces the errors
    retried (default: connection errors and timeouts).

    Not for ``redis.RedisCluster``: its command loop runs ``1 + get_retries()`` attempts, so
    -1 would run none. A cluster client keeps a count-based Retry, and ``SourceStore.run``
    rides out failovers and slot migrations with an ``OutageRetry`` of its own.
    """

    def __init__(
        self,
        budget_s: float,
        *,
        cap_s: float = DEFAULT_CAP_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        errors: tuple[type[Exception], ...] = (),
    ) -> None:
        super().__init__(
            ExponentialBackoff(cap=cap_s, base=DEFAULT_BASE_S), -1,
            supported_errors=errors or (RedisConnectionError, RedisTimeoutError, socket.timeout),
        )
        self.budget_s = budget_s
        self._clock = clock
        self._sleep = sleep
        # a Retry belongs to one connection (redis-py deep-copies it into each), used by one
        # thread at a time: plain attributes suffice for the nesting below
        self._depth = 0
        self._since: float | None = None

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, OutageRetry):
            return NotImplemented
        return super().__eq__(other) and self.budget_s == other.budget_s

    __hash__ = Retry.__hash__

    def call_with_retry(
        self,
        do: Callable[[], T],
        fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        """``do()`` until it succeeds, or raise its last error once the budget is spent.

        redis-py nests calls (a command's retry loop reconnects through the connection's
        own loop, with the same Retry object): nested calls share the time of the first
        failure, so one outage spends one budget, not one per level.
        """
        self._backoff.reset()  # type: ignore[no-untyped-call]
        failures = 0
        self._depth += 1
        try:
            while True:
                try:
                    return do()
                except self._supported_errors as error:
                    if is_retryable and not is_retryable(error):
                        raise
                    failures += 1
                    if with_failure_count:
                        fail(error, failures)
                    else:
                        fail(error)
                    now = self._clock()
                    if self._since is None:
                        self._since = now
                    give_up_at = self._since + self.budget_s
                    if now >= give_up_at:
                        raise
                    self._sleep(min(self._backoff.compute(failures), give_up_at - now))
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._since = None
