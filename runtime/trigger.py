"""The trigger of a topology's streaming query, chosen with the keywords of PySpark's ``trigger()``.

``Topology.start(spark, processingTime="0.5 seconds")`` (the default, every half second),
``availableNow=True`` or ``once=True``; at most one of them. ``trigger_interval_s`` is the older
float form of ``processingTime``. A continuous trigger is refused: ``mapInArrow`` stages need
micro-batches.

Finite triggers (``availableNow``, ``once``) process what is persisted when the query starts and
then the query terminates. ftlayer persists a source's records itself, so for these triggers
``start()`` first lets ingest run to the end of every source (see :func:`finite`), then starts the
query: a finite source is then processed completely. Records that fail during such a run are
replayed into the channel streams and wait, persisted, for the next run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ftlayer.errors import TopologyError

DEFAULT_PROCESSING_TIME = "500 milliseconds"
_INTERVAL_RE = re.compile(
    r"^\s*(?:interval\s+)?\d+(?:\.\d+)?\s*(?:milliseconds?|ms|seconds?|secs?|s|minutes?|mins?|hours?|h|days?)\s*$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Trigger:
    """One validated trigger: ``kind`` is ``processingTime``, ``availableNow`` or ``once``."""

    kind: str
    interval: str = ""

    @property
    def finite(self) -> bool:
        """The query processes what is available at its start, then terminates."""
        return self.kind in ("availableNow", "once")

    def writer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``DataStreamWriter.trigger``."""
        if self.kind == "processingTime":
            return {"processingTime": self.interval}
        return {self.kind: True}

    def __str__(self) -> str:
        return f"processingTime={self.interval!r}" if self.kind == "processingTime" else f"{self.kind}=True"


def trigger_from(
    *,
    processing_time: str | None = None,
    available_now: bool = False,
    once: bool = False,
    trigger_interval_s: float | None = None,
    continuous: str | None = None,
) -> Trigger:
    """The trigger the ``start()`` keywords ask for; :class:`TopologyError` unless at most one is given."""
    if continuous is not None:
        msg = "continuous triggers are not supported: ftlayer's stages need micro-batches (use processingTime)"
        raise TopologyError(msg)
    given = [
        name for name, on in (
            ("processingTime", processing_time is not None), ("availableNow", available_now), ("once", once),
            ("trigger_interval_s", trigger_interval_s is not None),
        ) if on
    ]
    if len(given) > 1:
        msg = f"give at most one trigger, got {', '.join(given)}"
        raise TopologyError(msg)
    if available_now:
        return Trigger("availableNow")
    if once:
        return Trigger("once")
    if trigger_interval_s is not None:
        if not trigger_interval_s > 0:
            msg = f"trigger_interval_s={trigger_interval_s!r}: expected a number of seconds > 0"
            raise TopologyError(msg)
        return Trigger("processingTime", f"{round(trigger_interval_s * 1000)} milliseconds")
    if processing_time is None:
        return Trigger("processingTime", DEFAULT_PROCESSING_TIME)
    if not isinstance(processing_time, str) or not _INTERVAL_RE.match(processing_time):
        msg = f"processingTime={processing_time!r}: expected an interval such as '0.5 seconds' or '500 milliseconds'"
        raise TopologyError(msg)
    return Trigger("processingTime", processing_time.strip())
