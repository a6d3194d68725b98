"""The record type that frames carry: :class:`SemiDeserializedRecord`.

"Semi-deserialized" means the header (ids, key hash, replay count, channel) is
decoded while the payload stays msgpack bytes, so routing, acking and replay
never pay for unpacking the value. The frame layout lives in
``ftlayer.records.frames``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ftlayer.errors import SerializationError
from ftlayer.records.ids import RecordId

__all__ = ["MAX_PAYLOAD_BYTES", "NO_CHANNEL", "SemiDeserializedRecord", "is_int_in"]

MAX_PAYLOAD_BYTES = 64 * 1024 * 1024  # one record's packed payload; frames and the payload codec share it
NO_CHANNEL = 0xFFFF  # the frame's channel value for "none recorded"; not a valid channel
_U16_MAX = 0xFFFF
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


def _bad_field(name: str, value: object, allowed: str) -> SerializationError:
    # A payload's repr could be 64 MiB long; its length says enough.
    shown = f"{len(value)} bytes" if isinstance(value, bytes) else f"{value!r:.80}"
    msg = f"SemiDeserializedRecord.{name} must be {allowed}, got {shown} ({type(value).__name__})"
    return SerializationError(msg)


def is_int_in(value: object, low: int, high: int) -> bool:
    """Whether ``value`` is an exact ``int`` (not bool) within ``[low, high]``."""
    return type(value) is int and low <= value <= high


def _is_id(value: object) -> bool:
    return type(value) is int and value != 0 and _I64_MIN <= value <= _I64_MAX


@dataclass(frozen=True, slots=True)
class SemiDeserializedRecord:
    """A record whose header is decoded and whose payload is still msgpack bytes.

    Construction validates every field and raises ``SerializationError`` naming
    the field and value: ``source_id`` and ``replay_count`` are ints in
    ``[0, 65535]``; ``record_id`` is a ``RecordId`` of two nonzero signed 64-bit
    ints; ``key_hash`` is a signed 64-bit int; ``origin_id`` a nonzero one;
    ``payload`` is ``bytes`` of at most ``MAX_PAYLOAD_BYTES``; ``channel`` is
    ``None`` or an int in ``[0, 65534]`` (65535 is the frame's "no channel").
    """

    source_id: int
    record_id: RecordId
    key_hash: int
    origin_id: int
    replay_count: int
    payload: bytes
    channel: int | None = None

    def __post_init__(self) -> None:
        # Inlined on purpose: this runs for every record and a helper call per
        # field would double the construction cost. The slow path names the field.
        rid, channel = self.record_id, self.channel
        if not (
            isinstance(rid, RecordId)
            and type(rid[0]) is int
            and type(rid[1]) is int
            and rid[0] != 0 != rid[1]
            and _I64_MIN <= rid[0] <= _I64_MAX
            and _I64_MIN <= rid[1] <= _I64_MAX
            and type(self.source_id) is int
            and 0 <= self.source_id <= _U16_MAX
            and type(self.key_hash) is int
            and _I64_MIN <= self.key_hash <= _I64_MAX
            and type(self.origin_id) is int
            and self.origin_id != 0
            and _I64_MIN <= self.origin_id <= _I64_MAX
            and type(self.replay_count) is int
            and 0 <= self.replay_count <= _U16_MAX
            and type(self.payload) is bytes
            and len(self.payload) <= MAX_PAYLOAD_BYTES
            and (channel is None or (type(channel) is int and 0 <= channel < NO_CHANNEL))
        ):
            raise self._invalid()

    def _invalid(self) -> SerializationError:
        rid, payload = self.record_id, self.payload
        checks = (
            ("record_id", isinstance(rid, RecordId) and _is_id(rid[0]) and _is_id(rid[1]),
             "a RecordId of two nonzero signed 64-bit ints"),
            ("source_id", is_int_in(self.source_id, 0, _U16_MAX), "an int in [0, 65535]"),
            ("key_hash", is_int_in(self.key_hash, _I64_MIN, _I64_MAX), "a signed 64-bit int"),
            ("origin_id", _is_id(self.origin_id), "a nonzero signed 64-bit int"),
            ("replay_count", is_int_in(self.replay_count, 0, _U16_MAX), "an int in [0, 65535]"),
            ("payload", type(payload) is bytes and len(payload) <= MAX_PAYLOAD_BYTES,
             f"bytes of at most MAX_PAYLOAD_BYTES ({MAX_PAYLOAD_BYTES})"),
        )
        for name, ok, allowed in checks:
            if not ok:
                return _bad_field(name, getattr(self, name), allowed)
        return _bad_field("channel", self.channel, "None or an int in [0, 65534]")

    def replayed(self, new_record_id: RecordId, channel: int | None) -> SemiDeserializedRecord:
        """The same record for its next replay: new ids and channel, ``replay_count + 1``.

        Payload, key hash, origin id and source id are kept. A record already
        replayed 65535 times raises ``SerializationError`` (``replay_count``).
        """
        return SemiDeserializedRecord(
            self.source_id, new_record_id, self.key_hash, self.origin_id,
            self.replay_count + 1, self.payload, channel,
        )
