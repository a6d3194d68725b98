"""One entry of a source's dead-letter stream as read: :class:`DeadLetter`.

Each entry carries the old source record id, the time of the last failure and of
dead-lettering, the last reason (a traceback for exceptions) and the frame (payload, key hash,
origin id, replay count). A frame that cannot be decoded is kept as bytes, its record None.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ftlayer.errors import FrameError
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer

__all__ = ["DeadLetter", "parse_entry"]

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


def parse_entry(entry_id: bytes, fields: dict[bytes, bytes]) -> DeadLetter:
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
