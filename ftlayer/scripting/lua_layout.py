"""The layout constants every Lua script starts with, generated from ``ftlayer.records.frames``
and ``ftlayer.records.chunks``.

Layouts are defined once, in Python: :data:`LAYOUT` declares Lua locals holding
the offsets (1-based) and sizes of frames, chunk states and failed values, so no
script under ``ftlayer/lua/`` spells an offset as a number
(``tests/ftlayer/scripting/test_frame_layout.py`` checks it). The loader
(:mod:`ftlayer.scripting.lua_source`) puts it after the shebang of every script.

Representation of 64-bit values: Redis Lua numbers are doubles and its ``bit``
library is 32-bit, so ids and ack values never become Lua numbers. They travel
and are stored as 8-byte big-endian strings, and XOR is done on the two 32-bit
halves (``struct.unpack('>I4I4')`` then ``bit.bxor``), which is exact.

The ``local`` lines below are also read by ``.luacheckrc`` (the linter learns
the names from here), so each keeps the form ``local NAME[, NAME] = ...``.
"""

from __future__ import annotations

from ftlayer.records.chunks import (
    CHUNK_IN_HEADER,
    CHUNK_KEY_BYTES,
    CHUNK_MAX_RECORDS,
    FLAG_REFILED,
    FLAG_SEEN,
    STATE_HEADER,
)
from ftlayer.records.frames import (
    BODY_FIXED_SIZE,
    FAILED_PREFIX,
    HEADER_SIZE,
    OFFSET_CHANNEL,
    OFFSET_CURRENT_RECORD_ID,
    OFFSET_REPLAY_COUNT,
    OFFSET_SOURCE_RECORD_ID,
)

# Lua's struct spells the state header as Python's struct does, with explicit widths.
_CK_HEAD = STATE_HEADER.format.replace("I", "I4").replace("H", "I2")
# 1-based offset of the chunk's record count `n` in its state: after gen u32, egen u32, channel u16
_CK_N = 4 + 4 + 2 + 1

LAYOUT = f"""
-- frame, chunk and failed-value layouts, generated from ftlayer.records.frames and ftlayer.records.chunks (1-based)
local F_SID, F_CID = {OFFSET_SOURCE_RECORD_ID + 1}, {OFFSET_CURRENT_RECORD_ID + 1}
local F_REPLAY, F_CHANNEL = {OFFSET_REPLAY_COUNT + 1}, {OFFSET_CHANNEL + 1}
local F_HEADER, F_BODY_MIN = {HEADER_SIZE}, {BODY_FIXED_SIZE}
local FL_REASON = {FAILED_PREFIX + 1}
local HDR, CK_N, CIN_HEAD = {STATE_HEADER.size}, {_CK_N}, {CHUNK_IN_HEADER.size}
local KEY_BYTES, CHUNK_MAX = {CHUNK_KEY_BYTES}, {CHUNK_MAX_RECORDS}
local FLAG_REFILED, FLAG_SEEN = {FLAG_REFILED}, {FLAG_SEEN}
local CK_HEAD = '{_CK_HEAD}'
local P2 = {{1, 2, 4, 8, 16, 32, 64, 128}}
"""
