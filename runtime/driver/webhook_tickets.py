"""The webhook receiver's tickets: one per request taken, from its offer to its answer.

A :class:`Ticket` holds a request's records while ingest persists them and knows where its answer
goes: a future on the event loop of an HTTP server in a thread of this process, or a request id
over the link to the HTTP front process (:mod:`runtime.driver.webhook_link`). :func:`settle_soon`
answers a batch of them from any thread: one wake-up per loop, one frame per front.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ftlayer.logs import logger_for

if TYPE_CHECKING:
    from runtime.driver.webhook_link import FrontLink

log = logger_for(__name__)


@dataclass(eq=False)
class Ticket:
    """One request's records: handed to ingest, then confirmed by ``ack`` (or abandoned). Answered on
    ``loop`` through ``future`` (the HTTP server in a thread of this process), or over ``link`` by
    ``rid`` (the HTTP front in its own process, :mod:`runtime.driver.webhook_link`)."""

    values: list[Any]
    future: asyncio.Future[bool | None] | None = None  # None: the answer timed out (webhook_http)
    loop: asyncio.AbstractEventLoop | None = None
    link: FrontLink | None = None
    rid: int = 0
    withdrawn: bool = False  # its answer (503) went out already: never counted again
    remaining: int = field(init=False)

    def __post_init__(self) -> None:
        self.remaining = len(self.values)


def settle(tickets: list[Ticket], ok: bool, answered: threading.Event | None = None) -> None:
    """Resolve the tickets' futures (on their loop's thread); then, a turn of the loop later (once the
    handlers woken here have written their answers), set ``answered``."""
    for ticket in tickets:
        if ticket.future is not None and not ticket.future.done():
            ticket.future.set_result(ok)
    if answered is not None and tickets[0].loop is not None:
        tickets[0].loop.call_soon(answered.set)  # after the handlers' wake-ups, scheduled just now


def settle_soon(tickets: list[Ticket], ok: bool, answered_within: float = 0.0) -> None:
    """:func:`settle` from any thread: one wake-up of each loop involved, one frame to each front
    process. With ``answered_within``, wait (at most that long) until each loop of this process has
    run the answers (``HANDOFF_S`` of :mod:`runtime.driver.webhook`; a front process answers on its
    own CPU, unwaited)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Ticket]] = {}
    by_link: dict[FrontLink, list[Ticket]] = {}
    for ticket in tickets:
        if ticket.link is not None:
            by_link.setdefault(ticket.link, []).append(ticket)
        elif ticket.loop is not None:
            by_loop.setdefault(ticket.loop, []).append(ticket)
    for link, group in by_link.items():
        link.settle(group, ok)
    events: list[threading.Event] = []
    for loop, group in by_loop.items():
        answered = threading.Event() if answered_within > 0 else None
        try:
            loop.call_soon_threadsafe(settle, group, ok, answered)
        except RuntimeError:  # the loop is closed: nobody waits for these answers any more
            log.debug("webhook: %d answers dropped with a closed server", len(group))
            continue
        if answered is not None:
            events.append(answered)
    deadline = time.monotonic() + answered_within
    for answered in events:
        answered.wait(max(0.0, deadline - time.monotonic()))
