"""A StreamingQueryListener whose events cross from the JVM as one JSON string each.

PySpark's classic listener bridge hands every event to Python as a JVM object
and builds the Python event from it getter by getter
(``StreamingQueryProgress.fromJObject``): about 35 Py4J round trips per
progress event, more with several sources. Py4J pins the calls to the JVM's
listener thread, and on the Python side each one takes the GIL from the
driver's other threads (ingest among them). Measured on 2 cores
(``scripts/bench e2e``, 500,000 records at a 0.1 s trigger): the two ftlayer
listeners cost the JVM about 5 µs per record and cut FT-on throughput by a
quarter or more.

:class:`JsonEventListener` keeps PySpark's listener contract (the same
``onQuery*`` methods, the same event classes) but converts each event with
one call, ``event.json()`` on the JVM side and ``<Event>.fromJson`` in Python,
the path Spark Connect uses. The events carry the same fields either way
(the JSON form has no ``jprogress`` handle, which ftlayer does not use).
Should the JSON call be missing (a PySpark whose events have no ``json``),
the event is built the usual way, getter by getter; behaviour is the same.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.streaming.listener import (
    JStreamingQueryListener,
    QueryIdleEvent,
    QueryProgressEvent,
    QueryStartedEvent,
    QueryTerminatedEvent,
    StreamingQueryListener,
)

__all__ = ["JsonEventListener"]


def _convert(kind: Any, jevent: Any) -> Any:
    try:
        text = jevent.json()
    except Exception:  # no json() on this JVM event: the getter-by-getter path
        return kind.fromJObject(jevent)
    return kind.fromJson(json.loads(text))


class _JsonBridge(JStreamingQueryListener):
    """The Py4J side: the JVM calls these with its event objects (see the module docstring)."""

    def onQueryStarted(self, jevent: Any) -> None:
        self.pylistener.onQueryStarted(_convert(QueryStartedEvent, jevent))

    def onQueryProgress(self, jevent: Any) -> None:
        self.pylistener.onQueryProgress(_convert(QueryProgressEvent, jevent))

    def onQueryIdle(self, jevent: Any) -> None:
        self.pylistener.onQueryIdle(_convert(QueryIdleEvent, jevent))

    def onQueryTerminated(self, jevent: Any) -> None:
        self.pylistener.onQueryTerminated(_convert(QueryTerminatedEvent, jevent))


class JsonEventListener(StreamingQueryListener):
    """Base of ftlayer's listeners: register with ``spark.streams.addListener`` as any other."""

    @property
    def _jlistener(self) -> Any:
        from pyspark import SparkContext

        made: Any = self.__dict__.get("_jlistenerobj")
        if made is None:
            jvm: Any = SparkContext._jvm
            made = self.__dict__["_jlistenerobj"] = jvm.PythonStreamingQueryListenerWrapper(_JsonBridge(self))
        return made
