"""The frame layout is defined once: the Lua reads frames through names generated from ftlayer.records.frames."""

from __future__ import annotations

import re
import struct

import pytest
import redis

from ftlayer.records import chunks, frames
from ftlayer.records.frames import SemiDeserializedSerializer
from ftlayer.records.ids import RecordId
from ftlayer.records.record import SemiDeserializedRecord
from ftlayer.scripting import lua_source
from ftlayer.scripting.lua_layout import LAYOUT

# numbers that would be a frame or pend-value offset written out by hand
HARD_CODED = re.compile(
    r"string\.sub\((?:v|frame|frames\[i\]|f), *\d"
    r"|struct\.unpack\('>I[24]', *(?:v|frame), *\d"
    r"|\blen < *\d"
    r"|\bpos \+ (?:47|49|55)\b"
)


def _layout_values() -> dict[str, int]:
    out: dict[str, int] = {}
    for names, values in re.findall(r"local ([A-Z_, ]+) = ([0-9, ]+)\n", LAYOUT):
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
        "FL_REASON": frames.FAILED_PREFIX + 1,
        "HDR": chunks.STATE_HEADER.size,
        "CK_N": 11,
        "CIN_HEAD": chunks.CHUNK_IN_HEADER.size,
        "KEY_BYTES": chunks.CHUNK_KEY_BYTES,
        "CHUNK_MAX": chunks.CHUNK_MAX_RECORDS,
        "FLAG_REFILED": chunks.FLAG_REFILED,
        "FLAG_SEEN": chunks.FLAG_SEEN,
    }
    assert "local CK_HEAD = '>I4I4I2I2I2I2B'" in LAYOUT  # STATE_HEADER in Lua's struct spelling


@pytest.mark.parametrize("name", lua_source.script_names())
def test_every_script_starts_with_the_layout_and_spells_no_offset(name: str) -> None:
    body = lua_source.load(name).text
    assert body.startswith(lua_source.SHEBANG + LAYOUT)
    found = HARD_CODED.findall(body[len(lua_source.SHEBANG + LAYOUT):])
    assert not found, f"{name} reads a frame at a hard-coded offset: {found}"


def test_lua_reads_each_field_where_the_encoder_wrote_it(redis_client: redis.Redis) -> None:
    rec = SemiDeserializedRecord(7, RecordId(-5 << 16, 123456789), -42, -5, 3, b"\x81\xa1k\x01", 9)
    frame = SemiDeserializedSerializer().encode(rec)
    state = chunks.STATE_HEADER.pack(77, 76, 9, 1000, 999, 2, 3) + b"\x05"
    lua = LAYOUT + """
local f, st = ARGV[1], ARGV[2]
local gen, egen, ch, n, left, partials, flags = struct.unpack(CK_HEAD, st)
return {string.sub(f, F_SID, F_SID + 7), string.sub(f, F_CID, F_CID + 7),
        struct.unpack('>I2', f, F_REPLAY), struct.unpack('>I2', f, F_CHANNEL),
        gen, egen, ch, n, left, partials, flags, struct.unpack('>I2', st, CK_N), string.byte(st, HDR + 1)}
"""
    got = redis_client.eval(lua, 0, frame, state)  # type: ignore[no-untyped-call]
    sid, cid, replay, channel, *header = got
    assert struct.unpack(">q", sid)[0] == -5 << 16
    assert struct.unpack(">q", cid)[0] == 123456789
    assert (replay, channel) == (3, 9)
    assert header == [77, 76, 9, 1000, 999, 2, 3, 1000, 5]
