"""An iterable source cut into ingest batches, with no per-record step outside one tight loop.

:class:`~runtime.driver.ingest.Ingestor` takes a poll source's records a poll at a time; an
iterable source (a list, a generator) gives one record per ``next()``, and handing each on as a
list of one through two generator layers to the ingest loop cost about as much as packing it.
:func:`iterable_batches` pulls the records itself and hands over whole batches.

Contract (what the ingest loop relies on; each list it yields is to be persisted at once):

- A list is yielded once it holds ``batch_size`` records, or when a record arrives at least
  ``linger_s`` after the list's first one (``clock``), as the ingest loop did per record: a
  source that blocks in ``next()`` holds its list meanwhile, as before.
- A ``None`` from the source means "nothing now": the list held so far is yielded, then ``[]``.
- Whenever the caller has control, this generator holds no record: every yield hands over
  all it pulled (so a caller that stops consuming, on ``stop``, loses nothing it was not given).
- ``stop`` set: the list held is yielded and the generator ends.
- The source raises: the list held is yielded first, then the exception is raised on the next
  resumption (records pulled before a source broke are persisted, as before).
- The source ends: the list held is yielded, then the generator ends.

A ``list`` or ``tuple`` source is in memory: its records are all there at once, so it is cut into
slices of ``batch_size`` (C speed; 0.16 against 0.03 µs a record, 2026-11-27) with ``stop`` checked
between slices, and linger never fires, as in the record-at-a-time loop where no clock reading
between two list items reaches ``linger_s``. A slice holding a ``None`` (found by identity, never
by ``==``, which a record type may define as it likes) goes through the record-at-a-time loop, so
``None`` keeps its meaning. A list that grows while it is ingested is read to its end, as its
iterator would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import repeat
from operator import is_
from typing import Any

__all__ = ["iterable_batches"]


def iterable_batches(source: Iterable[Any], stop: threading.Event, batch_size: int, linger_s: float, *,
                     clock: Callable[[], float] = time.monotonic) -> Iterator[list[Any]]:
    """The records of ``source`` in lists of at most ``batch_size`` (module contract)."""
    if type(source) in (list, tuple):
        return _sequence_batches(source, stop, batch_size, linger_s, clock)  # type: ignore[arg-type]
    return _iterator_batches(source, stop, batch_size, linger_s, clock)


def _sequence_batches(source: Sequence[Any], stop: threading.Event, batch_size: int, linger_s: float,
                      clock: Callable[[], float]) -> Iterator[list[Any]]:
    """A list's or tuple's records, sliced (module notes)."""
    at = 0
    while at < len(source) and not stop.is_set():
        part = list(source[at : at + batch_size])
        at += len(part)
        if any(map(is_, part, repeat(None))):
            yield from _iterator_batches(part, stop, batch_size, linger_s, clock)
        else:
            yield part


def _iterator_batches(source: Iterable[Any], stop: threading.Event, batch_size: int, linger_s: float,
                      clock: Callable[[], float]) -> Iterator[list[Any]]:
    """Any source's records, one ``next()`` at a time (module contract)."""
    it = iter(source)
    stopped = stop.is_set
    batch: list[Any] = []
    append = batch.append
    started = 0.0
    while True:
        try:
            value = next(it)
        except StopIteration:
            break
        except BaseException:
            if batch:
                yield batch  # what was pulled before the source broke is still persisted
            raise
        if value is None:
            if batch:
                yield batch
                batch = []
                append = batch.append
            yield []
        else:
            if not batch:
                started = clock()
            append(value)
            if len(batch) >= batch_size or clock() - started >= linger_s:
                yield batch
                batch = []
                append = batch.append
        if stopped():
            break
    if batch:
        yield batch
