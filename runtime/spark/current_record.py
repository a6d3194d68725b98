"""``ftlayer.reset_timeout()``: a Topology operator restarts the timeout of the record it is processing.

Storm's ``collector.resetTimeout(tuple)``, for operators that know they are slow (a remote call
with its own long retry, a large record). A running micro-batch already holds the records it
read (``ftlayer.acker.holds``, up to ``max_batch_s``); this restarts one record's timeout from now,
whatever the batch does, so it also helps past ``max_batch_s``.

Contract: called from inside an operator function of a Topology (``map``, ``flat_map``,
``filter``, ``map_with_state``), it re-files the record's chunk in the current timeout bucket at once
(one round trip): none of that chunk's records fails by timeout before ``timeout_s`` from now
unless it is acked or failed first. Timeouts are kept per chunk, so the records persisted with
it in one call get the same reprieve. With FT off it does nothing. Called outside an operator
(on the driver, in a DataFrame UDF) it raises :class:`~ftlayer.errors.FTLayerError`.

The handler marks the record it runs the user's function on (:data:`CURRENT`): one task runs at
a time in a Python worker, so a process-wide marker is exact and costs one attribute store per
record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ftlayer.errors import FTLayerError

if TYPE_CHECKING:
    from ftlayer.facade.ft_layer import FTLayer

__all__ = ["CURRENT", "Current", "reset_timeout"]


class Current:
    """The record a handler is processing now: its batch (``src`` and ``sid`` columns) and index."""

    def __init__(self) -> None:
        self.batch: Any = None
        self.index = -1
        self.ft_on = True
        self.layers: Callable[[], dict[int, FTLayer]] | None = None

    def begin(self, batch: Any, ft_on: bool, layers: Callable[[], dict[int, FTLayer]] | None) -> None:
        self.batch, self.ft_on, self.layers, self.index = batch, ft_on, layers, -1

    def end(self) -> None:
        self.batch, self.index = None, -1


CURRENT = Current()


def reset_timeout() -> None:
    """Restart the timeout of the record the calling operator is processing (module contract)."""
    cur = CURRENT
    if cur.batch is None or cur.index < 0:
        msg = ("ftlayer.reset_timeout() restarts the timeout of the record a Topology operator is "
               "processing: call it from inside an operator function")
        raise FTLayerError(msg)
    if not cur.ft_on:
        return
    if cur.layers is None:
        msg = "ftlayer.reset_timeout(): this stage has no FT layer to reach"
        raise FTLayerError(msg)
    src, sid = int(cur.batch.src[cur.index]), int(cur.batch.sid[cur.index])
    cur.layers()[src].reset_timeout([sid])
