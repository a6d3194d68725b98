"""The frame layout is defined once: the Lua reads frames through names generated from ftlayer.frames."""

from __future__ import annotations

import re
import struct

import pytest
import redis

from ftlayer import frames, scripts
from ftlayer.frames import SemiDeserializedSerializer
from ftlayer.ids import RecordId
from ftlayer.record import SemiDeserializedRecord

# numbers that would be a frame or pend-value offset written out by hand
HARD_CODED = re.compile(
    r"string\.sub\((?:v|frame|frames\[i\]|f), *\d"
    r"|struct\.unpack\('>I[24]', *(?:v|frame), *\d"
    r"|\blen < *\d"
    r"|\bpos \+ (?:47|49|55)\b"
)


def _layout_values() -> dict[str, int]:
    out: dict[str, int] = {}
    for names, values in re.findall(r"local ([A-Z_, ]+) = ([0-9, ]+)", scripts.LAYOUT):
        for n, v in zip(names.split(","), values.split(","), strict=True):
            out[n.strip()] = int(v)
    return out


def test_generated_names_are_the_encoders_constants() -> None:
    assert _layout_values() == {
        "F_SID": frames.OFFSET_SOURCE_RECORD_ID + 1,
        "F_CID": frames.OFFSET_CURRENT_RECORD_ID + 1,
        "F_REPLAY": frames.OFFSET_REPLAY_COUNT + 1,
        "F_CHANNEL": frames.OFFSET_CHANNEL + 1,
        "F_HEADER": frames.HEADER_SIZE,
        "F_BODY_MIN": frames.BODY_FIXED_SIZE,
        "P_GEN": frames.PEND_GEN_OFFSET + 1,
        "P_FRAME": frames.PEND_PREFIX + 1,
        "FL_REASON": frames.FAILED_PREFIX + 1,
    }


@pytest.mark.parametrize("name", scripts.SCRIPT_NAMES)
def test_every_script_starts_with_the_layout_and_spells_no_offset(name: str) -> None:
    body = getattr(scripts, name)
    assert body.startswith(scripts.SHEBANG + scripts.LAYOUT)
    found = HARD_CODED.findall(body[len(scripts.SHEBANG + scripts.LAYOUT):])
    assert not found, f"{name} reads a frame at a hard-coded offset: {found}"


def test_lua_reads_each_field_where_the_encoder_wrote_it(redis_client: redis.Redis) -> None:
    rec = SemiDeserializedRecord(7, RecordId(-5, 123456789), -42, -5, 3, b"\x81\xa1k\x01", 9)
    frame = SemiDeserializedSerializer().encode(rec)
    pend = struct.pack(">q", 123456789) + struct.pack(">I", 77) + frame
    lua = scripts.LAYOUT + """
local f = ARGV[1]
local v = ARGV[2]
return {string.sub(f, F_SID, F_SID + 7), string.sub(f, F_CID, F_CID + 7),
        struct.unpack('>I2', f, F_REPLAY), struct.unpack('>I2', f, F_CHANNEL),
        struct.unpack('>I4', v, P_GEN), string.sub(v, P_FRAME)}
"""
    sid, cid, replay, channel, gen, tail = redis_client.eval(lua, 0, frame, pend)  # type: ignore[no-untyped-call]
    assert struct.unpack(">q", sid)[0] == -5
    assert struct.unpack(">q", cid)[0] == 123456789
    assert (replay, channel, gen) == (3, 9, 77)
    assert tail == frame
