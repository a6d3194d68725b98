"""Serializers between user values and records: the payload codec and the source-side builder.

:class:`AsSemiDeserializedSerializer` is the one way a source value becomes a
:class:`~ftlayer.records.record.SemiDeserializedRecord` (ingest, the replay bench, the
chaos tools and tests all use it); :class:`AsRecordSerializer` is the
payload-only codec of successors. Frames themselves live in
:mod:`ftlayer.records.frames`, next to the Lua that reads them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ftlayer.errors import FailRecord, KeyHashError, SerializationError
from ftlayer.records.chunks import assign_sids
from ftlayer.records.ids import RecordId, new_ids, new_record_id
from ftlayer.records.keyhash import NO_KEY_HASH, key_hash, pmod
from ftlayer.records.record import SemiDeserializedRecord, is_int_in
from serialization.payload import pack_payload, unpack_payload

__all__ = ["AsRecordSerializer", "AsSemiDeserializedSerializer", "make_record", "make_records"]


class AsRecordSerializer:
    """Payload-only codec for successors: ``pack_payload`` / ``unpack_payload``."""

    __slots__ = ()

    def encode(self, value: Any) -> bytes:
        """See :func:`serialization.payload.pack_payload`."""
        return pack_payload(value)

    def decode(self, data: bytes) -> Any:
        """See :func:`serialization.payload.unpack_payload`."""
        return unpack_payload(data)


class AsSemiDeserializedSerializer:
    """Turns a source's values into :class:`SemiDeserializedRecord` s.

    ``key_selector`` maps a value to its key (str, bytes, int, float, bool,
    None or a tuple of those, see ``ftlayer.records.keyhash``); ``None`` means no key,
    whose hash is ``key_hash(None)`` (42). It is shipped to Spark executors with
    the serializer, so it must be picklable (by cloudpickle for lambdas).
    """

    __slots__ = ("key_selector", "source_id")

    def __init__(self, source_id: int, key_selector: Callable[[Any], Any] | None = None) -> None:
        if not is_int_in(source_id, 0, 0xFFFF):
            msg = f"source_id must be an int in [0, 65535], got {source_id!r}"
            raise SerializationError(msg)
        self.source_id = source_id
        self.key_selector = key_selector

    def __repr__(self) -> str:
        return f"AsSemiDeserializedSerializer({self.source_id}, {self.key_selector!r})"

    def _hash_key(self, value: Any) -> int:
        selector = self.key_selector
        if selector is None:
            return NO_KEY_HASH
        try:
            return key_hash(selector(value))
        except FailRecord:
            raise  # the user asked to fail this record; that is not a key error
        except Exception as exc:
            msg = (
                f"key selector of source {self.source_id} failed on a value of type "
                f"{type(value).__qualname__!r}: {type(exc).__name__}: {exc}"
            )
            raise KeyHashError(msg) from exc

    def serialize(
        self,
        value: Any,
        record_id: RecordId,
        *,
        channel: int | None = None,
        origin_id: int | None = None,
    ) -> SemiDeserializedRecord:
        """A first-attempt record (``replay_count`` 0) of ``value`` under ``record_id``.

        ``origin_id`` defaults to ``record_id.source_record_id``. Raises
        ``KeyHashError`` (naming the source, cause attached) when the key selector
        raises or returns an unhashable key, ``UnsupportedTypeError`` /
        ``SerializationError`` when ``value`` cannot be packed or a field is out
        of range. ``FailRecord`` raised by the key selector propagates unchanged.
        """
        if not isinstance(record_id, RecordId):
            msg = f"record_id must be a RecordId, got {type(record_id).__name__!r}"
            raise SerializationError(msg)
        khash = self._hash_key(value)
        return SemiDeserializedRecord(
            self.source_id, record_id, khash,
            record_id.source_record_id if origin_id is None else origin_id,
            0, pack_payload(value), channel,
        )


class _SourceShape(Protocol):
    @property
    def source_id(self) -> int: ...
    @property
    def num_channels(self) -> int: ...


def make_record(
    source: _SourceShape, value: Any, *, key: Any = None, channel: int | None = None
) -> SemiDeserializedRecord:
    """A fresh first-attempt record of ``value`` for ``source`` (an FTLayer or anything with
    ``source_id`` and ``num_channels``): new RecordId, ``key_hash(key)``, and ``channel``, which
    defaults to ``pmod(key_hash, num_channels)`` as live key routing does.

    Built by :class:`AsSemiDeserializedSerializer`, so the errors are the same.
    """
    ser = AsSemiDeserializedSerializer(source.source_id, None if key is None else (lambda _v: key))
    rec = ser.serialize(value, new_record_id(), channel=channel)
    if channel is None:
        rec = dataclasses.replace(rec, channel=pmod(rec.key_hash, source.num_channels))
    return rec


def make_records(
    source: _SourceShape, values: Sequence[Any], *, key: Callable[[Any], Any] | None = None,
    channel: int | None = None,
) -> list[SemiDeserializedRecord]:
    """Fresh first-attempt records of ``values`` for ``source``, their ids drawn in chunks per
    channel (``ftlayer.records.chunks.assign_sids``), as ingest draws them: persisting them files one
    chunk per channel (of up to ``CHUNK_TARGET_RECORDS``), not one per record as records made
    one by one with :func:`make_record` are.

    ``key`` is a key selector (called per value); ``channel`` defaults to
    ``pmod(key_hash, num_channels)``, as live key routing does.
    """
    ser = AsSemiDeserializedSerializer(source.source_id, key)
    recs = [ser.serialize(v, RecordId(1 << 16, 1), channel=channel) for v in values]
    channels = [pmod(r.key_hash, source.num_channels) if channel is None else channel for r in recs]
    sids = assign_sids(channels, [48 + len(r.payload) for r in recs])
    cids = new_ids(len(recs))
    return [
        dataclasses.replace(r, record_id=RecordId(sid, cid), origin_id=sid, channel=ch)
        for r, sid, cid, ch in zip(recs, sids, cids, channels, strict=True)
    ]
