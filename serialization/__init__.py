"""Record serialization: the msgpack payload codec and the 48-byte frame format.

``serialization.payload`` packs record values (msgpack plus a few ext types);
``ftlayer.records.frames`` wraps a packed payload with the record's ids, key hash,
replay count and channel in a checksummed, self-delimiting frame that Lua
scripts in Redis can read at fixed offsets.
"""

from ftlayer.records.frames import (
    BODY_FIXED_SIZE,
    FRAME_VERSION,
    HEADER_SIZE,
    MAX_PAYLOAD_BYTES,
    NO_CHANNEL,
    OFFSET_BODY_LEN,
    OFFSET_CHANNEL,
    OFFSET_CRC,
    OFFSET_CURRENT_RECORD_ID,
    OFFSET_FLAGS,
    OFFSET_KEY_HASH,
    OFFSET_ORIGIN_ID,
    OFFSET_PAYLOAD,
    OFFSET_REPLAY_COUNT,
    OFFSET_SOURCE_ID,
    OFFSET_SOURCE_RECORD_ID,
    OFFSET_VERSION,
    SemiDeserializedRecord,
    SemiDeserializedSerializer,
)
from serialization.payload import MAX_INT_DIGITS, MAX_TUPLE_DEPTH, pack_payload, unpack_payload
from serialization.serializers import AsRecordSerializer, AsSemiDeserializedSerializer, make_record

__all__ = [
    "BODY_FIXED_SIZE",
    "FRAME_VERSION",
    "HEADER_SIZE",
    "MAX_INT_DIGITS",
    "MAX_PAYLOAD_BYTES",
    "MAX_TUPLE_DEPTH",
    "NO_CHANNEL",
    "OFFSET_BODY_LEN",
    "OFFSET_CHANNEL",
    "OFFSET_CRC",
    "OFFSET_CURRENT_RECORD_ID",
    "OFFSET_FLAGS",
    "OFFSET_KEY_HASH",
    "OFFSET_ORIGIN_ID",
    "OFFSET_PAYLOAD",
    "OFFSET_REPLAY_COUNT",
    "OFFSET_SOURCE_ID",
    "OFFSET_SOURCE_RECORD_ID",
    "OFFSET_VERSION",
    "AsRecordSerializer",
    "AsSemiDeserializedSerializer",
    "SemiDeserializedRecord",
    "SemiDeserializedSerializer",
    "make_record",
    "pack_payload",
    "unpack_payload",
]
