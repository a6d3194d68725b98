"""What an ingest thread is doing, kept in the source's ``meta`` hash for ``ftlayer status``.

The driver's :class:`~runtime.driver.ingest.Ingestor` writes three fields of ``<prefix>meta`` on each
change of state (best effort: a write that fails is skipped, the next change writes again):

- ``ingest_state``: ``running``, ``paused`` (backpressure: ``max_pending`` records pending),
  ``ended`` (the source ended and everything read was persisted), ``stopped`` (``stop()`` was
  called), or ``error`` (the source raised, or a hook did: ingest stopped for good);
- ``ingest_detail``: why (the error or the pause reason), empty otherwise;
- ``ingest_since_ms``: wall time of the change.

A pause for a Redis outage is not written (the server cannot take the write); the state goes
back to ``running`` when the server answers again. A driver that died leaves its last state
behind; ``ftlayer status`` shows the rotator lease next to it, which tells a live driver from a
dead one. ``meta`` is bookkeeping, so these fields are not a leak after a drain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ftlayer.store.source_store import SourceStore

FIELDS = ("ingest_state", "ingest_detail", "ingest_since_ms")
STATES = ("running", "paused", "ended", "stopped", "error")
MAX_DETAIL_CHARS = 1000


@dataclass(frozen=True)
class IngestState:
    """One source's last reported ingest state (see the module notes)."""

    state: str
    detail: str
    since_ms: int | None

    @property
    def failed(self) -> bool:
        return self.state == "error"


def write_state(store: SourceStore, state: str, detail: str = "") -> None:
    """Record ``state`` (one of :data:`STATES`) for the source; may raise Redis errors."""
    store.client.hset(store.keys.meta, mapping={
        "ingest_state": state,
        "ingest_detail": detail[:MAX_DETAIL_CHARS],
        "ingest_since_ms": int(time.time() * 1000),
    })


def parse_state(raw: list[Any]) -> IngestState | None:
    """The reply of ``HMGET meta *FIELDS`` as an IngestState, or None if never written."""
    state, detail, since = raw
    if state is None:
        return None

    def text(b: Any) -> str:
        return b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b or "")

    return IngestState(text(state), text(detail), int(since) if since is not None else None)
