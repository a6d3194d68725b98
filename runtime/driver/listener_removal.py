"""Unregister a StreamingQueryListener without the Spark Connect client's removal deadlock.

On a classic session this is ``spark.streams.removeListener(listener)``.

On a Spark Connect session the listeners run in the client: one thread per session
(``StreamingQueryListenerBus._query_event_handler``) reads the server's event stream and calls
every listener under the bus's lock (``post_to_all``). Removing the *last* listener (pyspark
4.3, ``StreamingQueryListenerBus.remove``) asks the server to end that stream and then joins the
thread **while holding the same lock**: if an event arrives in between (a query stopped just
before, so its termination event is on the way), the thread waits for the lock and the removal
waits for the thread, for ever (seen in ``tests/runtime/connect``: ``ftlayer.stop_all()`` right
after ``query.stop()`` hung).

:func:`remove_listener` therefore hides the thread from pyspark's removal (its
``_execution_thread``, which pyspark only joins if set) when the listener is the last one, lets
pyspark send the removal and drop the listener, and joins the thread itself once the lock is free
(bounded by ``join_s``). A bus without that attribute (another pyspark) is left to pyspark.
"""

from __future__ import annotations

from typing import Any

from ftlayer.logs import logger_for

__all__ = ["remove_listener"]

log = logger_for(__name__)


def _is_connect(spark: Any) -> bool:
    # as runtime.spark.connect.is_connect (a floor above this one): told by the class's module
    return type(spark).__module__.startswith("pyspark.sql.connect.")


def remove_listener(spark: Any, listener: Any, join_s: float = 10.0) -> None:
    """``spark.streams.removeListener(listener)``, without the Connect client's deadlock (module notes)."""
    streams = spark.streams
    bus = getattr(streams, "_sqlb", None) if _is_connect(spark) else None
    registered = getattr(bus, "_listener_bus", None)
    if bus is None or not isinstance(registered, list) or not hasattr(bus, "_execution_thread"):
        streams.removeListener(listener)
        return
    last = registered == [listener]
    thread = bus._execution_thread if last else None
    if thread is not None:
        bus._execution_thread = None  # pyspark's remove() then does not join it under its lock
    streams.removeListener(listener)
    if thread is None:
        return
    if listener in registered:  # the server could not be asked (pyspark warned): it stays registered
        bus._execution_thread = thread
        return
    thread.join(join_s)
    if thread.is_alive():
        log.warning("the Spark Connect listener thread did not end within %g s of the last listener's removal", join_s)
