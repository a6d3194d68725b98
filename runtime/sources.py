"""The source contract: what :meth:`runtime.topology.Topology.source` accepts, declared.

A source is one of:

- an **iterable** (a list, a generator, any ``__iter__``): ingest reads it to the end;
- a **callable** taking no argument (and not iterable): called again and again; it returns one
  value, a list or tuple of values, or None when it has nothing right now (ingest idles a
  moment), and raises ``StopIteration`` when it is done;
- a :class:`PollSource`: ``open()`` once (optional), then ``poll()`` returns an iterable of
  values (empty when idle) or None when done, and ``close()`` (optional) runs at the end,
  whatever happened.

Any of them may also be an :class:`AckingSource` and/or a :class:`PausableSource`: ingest
then calls ``ack(values)`` once the values are safe (persisted as the durability mode
promises, or dead-lettered), each value exactly once per ingest thread and in the order
given, and ``ingest_paused(reason)`` when it starts waiting (backpressure, Redis unreachable)
and ``ingest_paused(None)`` when it goes on. A source that can confirm upstream (an HTTP 2xx,
an MQTT PUBACK, a file offset) confirms in ``ack``, so nothing it confirmed is lost;
:class:`runtime.driver.webhook.WebhookSource` is one. A source without ``ack`` can lose what
ingest took but had not persisted when the driver dies (at most one ingest batch; see
``ingest_batch_records``).

The protocols are ``runtime_checkable``: ingest tests them with ``isinstance``, so a class needs
no base class, only the methods.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol, Union, runtime_checkable

__all__ = ["AckingSource", "PausableSource", "PollSource", "Source", "is_source"]


@runtime_checkable
class PollSource(Protocol):
    """A source that is polled: ``poll()`` returns an iterable of values, empty when idle, None when done.

    ``open()`` and ``close()`` are optional (ingest calls them when present).
    """

    def poll(self) -> Iterable[Any] | None: ...


@runtime_checkable
class AckingSource(Protocol):
    """A source that confirms upstream: ``ack(values)`` once the values are safe (see the module contract)."""

    def ack(self, values: list[Any]) -> None: ...


@runtime_checkable
class PausableSource(Protocol):
    """A source told when ingest waits (``reason``) and when it goes on (None), e.g. to answer 503."""

    def ingest_paused(self, reason: str | None) -> None: ...


Source = Union[Iterable[Any], Callable[[], Any], PollSource]  # noqa: UP007 - a runtime alias on Python 3.10


def is_source(obj: object) -> bool:
    """True if ``obj`` is one of the three kinds of source (iterable, callable, poll source)."""
    return isinstance(obj, (PollSource, Iterable)) or callable(obj)
