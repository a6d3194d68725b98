"""User sources adapted for ingest: the three kinds of source as one stream of records or polls.

A user source is an iterable of records, a callable returning a record, a list of records or
None (nothing now; ``StopIteration`` ends it), or a poll source (``open()``, ``poll()``,
``close()``; :class:`runtime.sources.PollSource`). :func:`source_polls` hands ingest a poll source's
``poll()`` results whole, and the others' records one list each; :func:`source_iterator` gives
records one by one, ``None`` for "nothing now". A ``None`` inside a poll is "nothing", never a
record (found by identity: a record type's ``==`` may return anything). :func:`is_plain_iterable`
tells ingest when :func:`runtime.driver.iterable_batches.iterable_batches` can cut the source itself.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from itertools import repeat
from operator import is_
from typing import Any

from runtime.sources import PollSource

__all__ = ["is_plain_iterable", "source_iterator", "source_polls"]


def is_plain_iterable(source: Any) -> bool:
    """Is ``source`` an iterable of records (neither a poll source nor a callable source)?"""
    return not isinstance(source, PollSource) and not (callable(source) and not isinstance(source, Iterable))


def source_iterator(source: Any, stop: threading.Event) -> Iterator[Any]:
    """Adapt any supported user source to an iterator that yields records or None (idle)."""
    if isinstance(source, PollSource):
        for values in _polls(source, stop):
            if values:
                yield from values
            else:
                yield None
    elif callable(source) and not isinstance(source, Iterable):
        while not stop.is_set():
            try:
                got = source()
            except StopIteration:
                return
            if got is None:
                yield None
            elif isinstance(got, (list, tuple)):
                yield from got
            else:
                yield got
    else:
        yield from source


def source_polls(source: Any, stop: threading.Event) -> Iterator[list[Any]]:
    """:func:`source_iterator` a poll at a time: lists of records, [] when idle. A poll source's
    ``poll()`` result is passed on whole, so ingest handles a request
    or a delivery of many records with one step instead of one per record; any other source
    yields its records one list each, as :func:`source_iterator` yields them."""
    if isinstance(source, PollSource):
        yield from _polls(source, stop)
        return
    for value in source_iterator(source, stop):
        yield [] if value is None else [value]


def _polls(source: PollSource, stop: threading.Event) -> Iterator[list[Any]]:
    """A poll source's ``poll()`` results until it returns None or ``stop`` is set, between its
    optional ``open()`` and ``close()``; a None inside a poll is "nothing", never a record."""
    opener = getattr(source, "open", None)  # optional in the contract
    if callable(opener):
        opener()
    try:
        while not stop.is_set():
            got = source.poll()
            if got is None:
                return
            values = got if type(got) is list else list(got)
            if any(map(is_, values, repeat(None))):  # identity: a record's == may be anything (numpy)
                values = [v for v in values if v is not None]
            yield values
    finally:
        closer = getattr(source, "close", None)
        if callable(closer):
            closer()
