"""The demo's input, shared by its Topology and DataFrame pipelines."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

T0 = datetime(2026, 11, 21, tzinfo=timezone.utc)


def click_events(n: int) -> Iterator[str]:
    """Raw click lines, as a socket would deliver them; generated once, never rewound."""
    for i in range(n):
        agent = "bot/1.0" if i % 40 == 7 else "mozilla"
        yield f"{i}|user-{(i * 7919) % 211}|/page/{i % 17}|{agent}|{(T0 + timedelta(seconds=i)).isoformat()}"
