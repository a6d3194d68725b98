"""DeadLetters: records set aside after ``max_replays`` failures, with their reason.

Entries live in the source's ``dlq`` stream and are never deleted implicitly:
only :meth:`DeadLetters.purge` removes them, and only the ids it is given.
Each entry carries the old source record id, the time of the last failure and
of dead-lettering, the last reason (a traceback for exceptions) and the frame
(payload, key hash, origin id, replay count).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from ftlayer.errors import FrameError
from ftlayer.store import SourceStore
from serialization.frames import SemiDeserializedRecord, SemiDeserializedSerializer

_SERIALIZER = SemiDeserializedSerializer()


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered record. ``record`` is None if its frame could not be decoded."""

    entry_id: str
    source_record_id: int
    failed_ms: int
    dead_ms: int
    reason: str
    record: SemiDeserializedRecord | None
    frame: bytes

    @property
    def origin_id(self) -> int | None:
        return self.record.origin_id if self.record else None

    @property
    def replay_count(self) -> int | None:
        return self.record.replay_count if self.record else None


def _parse(entry_id: bytes, fields: dict[bytes, bytes]) -> DeadLetter:
    frame = fields.get(b"frame", b"")
    try:
        record: SemiDeserializedRecord | None = _SERIALIZER.decode(frame)
    except FrameError:
        record = None
    return DeadLetter(
        entry_id=entry_id.decode(),
        source_record_id=struct.unpack(">q", fields[b"sid"])[0],
        failed_ms=int(fields.get(b"failed_ms", b"0")),
        dead_ms=int(fields.get(b"dead_ms", b"0")),
        reason=fields.get(b"reason", b"").decode("utf-8", "replace"),
        record=record,
        frame=frame,
    )


class DeadLetters:
    """Read and manage one source's dead-letter stream."""

    def __init__(self, store: SourceStore) -> None:
        self.store = store

    def count(self) -> int:
        """Dead letters currently kept."""
        return int(self.store.client.xlen(self.store.keys.dlq))

    def list(self, count: int = 100, after: str = "-") -> list[DeadLetter]:
        """Up to ``count`` dead letters, oldest first, with entry ids greater than ``after``."""
        start = after if after == "-" else f"({after}"
        raw: list[tuple[bytes, dict[bytes, bytes]]] = self.store.client.xrange(  # type: ignore[assignment]
            self.store.keys.dlq, min=start, max="+", count=count
        )
        return [_parse(eid, fields) for eid, fields in raw]

    def get(self, entry_id: str) -> DeadLetter | None:
        """One dead letter by entry id, or None."""
        raw: list[tuple[bytes, dict[bytes, bytes]]] = self.store.client.xrange(  # type: ignore[assignment]
            self.store.keys.dlq, min=entry_id, max=entry_id, count=1
        )
        return _parse(*raw[0]) if raw else None

    def purge(self, entry_ids: Sequence[str]) -> int:
        """Delete exactly the given entries; returns how many existed."""
        if not entry_ids:
            return 0
        return int(self.store.client.xdel(self.store.keys.dlq, *entry_ids))
