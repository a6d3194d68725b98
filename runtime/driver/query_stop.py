"""Stop a streaming query between micro-batches, so that no running task is killed.

Spark's ``StreamingQuery.stop()`` interrupts the micro-batch it is running: its tasks are
killed (executors log ``TaskKilledException`` with a stack trace), a data source write aborts
its commit ("Aborting commit" at ERROR) and the jobs of a ``foreachBatch`` function fail. Nothing
is lost by that: the batch never reached Spark's commit log, so ftlayer acks none of its records
(they are acked at the commit) and a restart on the same checkpoint re-runs it. But the log of a
clean shutdown then reads like a crash, and the batch's work is thrown away.

:func:`stop_query` waits until no trigger is active (the batch that was running committed, or
failed) and stops the query then, while it sleeps before its next trigger: the interrupt lands
in that sleep and kills nothing. If a trigger is still active when ``grace_s`` runs out (a batch
that takes longer, or a query with the default trigger that always has new data) it stops the
query all the same, as ``stop()`` does, and says so in its return value.

Works with a classic ``StreamingQuery`` and a Spark Connect one (both have ``status`` and
``isActive``), and with :class:`runtime.query.FTQuery`-like handles exposing the same. Idempotent:
a query already stopped is stopped again (a no-op in Spark) and counts as stopped between batches.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_STOP_GRACE_S", "stop_query", "trigger_active"]

DEFAULT_STOP_GRACE_S = 10.0  # how long stop_query waits for the running micro-batch to end
_POLL_S = 0.01  # Spark's own polling delay between triggers is 10 ms: look at least as often


def trigger_active(query: Any) -> bool:
    """Whether ``query`` is running a trigger now (planning or running a micro-batch)."""
    status = query.status
    active = status.get("isTriggerActive") if isinstance(status, dict) else getattr(status, "isTriggerActive", None)
    return bool(active)


def stop_query(query: Any, grace_s: float = DEFAULT_STOP_GRACE_S, *, poll_s: float = _POLL_S,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Stop ``query`` between two micro-batches, waiting up to ``grace_s`` for the running one.

    Returns True if the query was stopped with no trigger active (nothing interrupted), False if
    ``grace_s`` ran out first and the running trigger was interrupted (Spark re-runs that batch
    on a restart: nothing is lost either way). ``grace_s`` = 0 stops at once, as ``stop()`` does.
    A query that ends (or fails) while this waits is stopped all the same (a no-op).
    """
    if grace_s < 0:
        msg = f"stop_query: grace_s must be >= 0, got {grace_s!r}"
        raise ValueError(msg)
    deadline = clock() + grace_s
    quiet = True
    while query.isActive and trigger_active(query):
        if clock() >= deadline:
            quiet = False
            break
        sleep(poll_s)
    query.stop()
    return quiet
