"""Layout format 2 as ftlayer wrote it before chunks: its PERSIST script, verbatim, to write old state.

The migration tests (``test_layout.py``) need a source exactly as the older
ftlayer left it: one ``pend`` hash entry per record (ack value | bucket gen |
frame), bucket elements of 8-byte ids, channel entries ``i`` = packed ids. This
module keeps that writer; nothing in the package uses it.
"""

from __future__ import annotations

from typing import Any

from ftlayer.frames import (
    BODY_FIXED_SIZE,
    FAILED_PREFIX,
    HEADER_SIZE,
    OFFSET_CHANNEL,
    OFFSET_CURRENT_RECORD_ID,
    OFFSET_REPLAY_COUNT,
    OFFSET_SOURCE_RECORD_ID,
)
from ftlayer.layer import FTLayer

LAYOUT = f"""
local F_SID, F_CID = {OFFSET_SOURCE_RECORD_ID + 1}, {OFFSET_CURRENT_RECORD_ID + 1}
local F_REPLAY, F_CHANNEL = {OFFSET_REPLAY_COUNT + 1}, {OFFSET_CHANNEL + 1}
local F_HEADER, F_BODY_MIN = {HEADER_SIZE}, {BODY_FIXED_SIZE}
local P_GEN, P_FRAME = 9, 13
local FL_REASON = {FAILED_PREFIX + 1}
"""

_COMMON = r"""
local LEFT_BUCKET = {}
local function bucket_done(g)
  -- a record filed in bucket g left `pend`; counted here, applied by settle_buckets
  LEFT_BUCKET[g] = (LEFT_BUCKET[g] or 0) + 1
end

local HEAD_DROP_MAX = 1024  -- bucket elements one call may drop (bounded script time)

local function drop_done_heads()
  -- pop the head elements of `bkt` whose bucket has no pending record left. Elements
  -- are in generation order, so buckets that completed leave from the head; one
  -- behind an older bucket still pending waits for it (or for EXPIRE)
  local live = {}
  for _ = 1, HEAD_DROP_MAX do
    local e = redis.call('LINDEX', K_BKT, 0)
    if not e then return end
    local g = struct.unpack('>I4', e)
    if live[g] == nil then live[g] = redis.call('HEXISTS', K_BCNT, g) == 1 end
    if live[g] then return end
    redis.call('LPOP', K_BKT)
  end
end

local function settle_buckets()
  -- one HINCRBY per bucket touched (not per record); a bucket's count goes with its last record
  local emptied = false
  for g, n in pairs(LEFT_BUCKET) do
    if redis.call('HINCRBY', K_BCNT, g, -n) <= 0 then
      redis.call('HDEL', K_BCNT, g)
      emptied = true
    end
  end
  LEFT_BUCKET = {}
  if emptied then drop_done_heads() end
end

local function channel_keys_error(nch)
  -- nil if KEYS declares a stream for each of nch channels after CH_BASE, else why not
  if #KEYS < CH_BASE + nch then
    return 'KEYS declares ' .. (#KEYS - CH_BASE) .. ' channel streams for ' .. nch .. ' channels'
  end
  return nil
end

local NO_REPLAY = 32768  -- top bit of a reason length: dead-letter without replays

local function fail_entry(sid, v, reason, now_ms, b_init, b_mult, b_max, no_replay)
  -- move a pending record to `failed`, due for replay after its backoff (due now, with the
  -- NO_REPLAY bit on its stored reason length, if it is to be dead-lettered at once)
  local g = struct.unpack('>I4', v, P_GEN)
  redis.call('HDEL', K_PEND, sid)
  bucket_done(g)
  local frame = string.sub(v, P_FRAME)
  local rc = struct.unpack('>I2', frame, F_REPLAY)
  local delay = b_init * (b_mult ^ math.min(rc, 64))
  if delay > b_max then delay = b_max end
  local rlen = #reason
  if no_replay then delay = 0; rlen = rlen + NO_REPLAY end
  redis.call('HSET', K_FAILED, sid, struct.pack('>dI2', now_ms, rlen) .. reason .. frame)
  redis.call('ZADD', K_DUE, now_ms + delay, sid)
end

local function split_frames(blob, nch)
  -- split concatenated frames; nil plus an error if one is malformed or off-range
  local frames, pos, n = {}, 1, #blob
  while pos <= n do
    if pos + F_HEADER - 1 > n then return nil, 'truncated frame at byte ' .. pos end
    local len = struct.unpack('>I4', blob, pos)
    if len < F_BODY_MIN or pos + 3 + len > n then return nil, 'bad frame length at byte ' .. pos end
    local frame = string.sub(blob, pos, pos + 3 + len)
    local ch = struct.unpack('>I2', frame, F_CHANNEL)
    if ch >= nch then return nil, 'channel ' .. ch .. ' out of range 0..' .. (nch - 1) end
    frames[#frames + 1] = frame
    pos = pos + 4 + len
  end
  return frames
end

local CHUNK = 500  -- fields per HMGET/HSET/HDEL: one redis.call costs ~2 us, a field ~0.2 us

local function persist_frames(frames)
  -- file new records: pend entry (ack = current id), bucket, channel stream
  local gen = tonumber(redis.call('GET', K_GEN) or '0')
  local genb = struct.pack('>I4', gen)
  local all, per_ch, count, seen = {}, {}, 0, {}
  for base = 1, #frames, CHUNK do
    local sids = {}
    for i = base, math.min(#frames, base + CHUNK - 1) do sids[#sids + 1] = string.sub(frames[i], F_SID, F_SID + 7) end
    local have, kv = redis.call('HMGET', K_PEND, unpack(sids)), {}
    for j, sid in ipairs(sids) do
      if not have[j] and not seen[sid] then  -- already pending: a retried call
        seen[sid] = true
        local frame = frames[base + j - 1]
        kv[#kv + 1] = sid
        kv[#kv + 1] = string.sub(frame, F_CID, F_CID + 7) .. genb .. frame
        count = count + 1
        all[#all + 1] = sid
        local ch = struct.unpack('>I2', frame, F_CHANNEL)
        local t = per_ch[ch]
        if t == nil then t = {}; per_ch[ch] = t end
        t[#t + 1] = sid
      end
    end
    if #kv > 0 then redis.call('HSET', K_PEND, unpack(kv)) end
  end
  if count > 0 then
    redis.call('RPUSH', K_BKT, genb .. table.concat(all))
    redis.call('HINCRBY', K_BCNT, gen, count)
    for ch, sids in pairs(per_ch) do
      redis.call('XADD', KEYS[CH_BASE + 1 + ch], '*', 'i', table.concat(sids), 'g', gen)
    end
  end
  return count, gen
end
"""


_STATE_KEYS = r"""
local K_PEND, K_GEN, K_BCNT, K_FAILED, K_DUE, K_STATS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local K_BKT = KEYS[7]
local CH_BASE = #KEYS  -- scripts that persist set it to where their channel streams start
"""


PERSIST_V2 = LAYOUT + (r"""
-- persist: file a batch of source records atomically, at most once per call token.
-- KEYS: pend, gen, bcnt, failed, due, stats, bkt, call token (tok:p:<hash of the frames>),
--       ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, num_channels, frames (concatenated frames), token ttl ms
-- Returns: {persisted, bucket gen}. A retried call (its token exists) files nothing: its records
-- were filed by the first call and may since have been read, processed and acked, so "not
-- pending" cannot tell a retry from a new record; ids already in pend are skipped as well.
-- A call whose writes a failover lost lost its token with them, so its retry files them again.
-- Error (nothing written) if a frame is malformed or its channel >= num_channels.
"""
    + _STATE_KEYS
    + _COMMON
    + r"""
CH_BASE = 8
local frames, err = split_frames(ARGV[3], tonumber(ARGV[2]))
err = err or channel_keys_error(tonumber(ARGV[2]))
if err then return redis.error_reply('ftlayer persist: ' .. err) end
if redis.call('SET', KEYS[8], '1', 'NX', 'PX', ARGV[4]) == false then
  redis.call('HINCRBY', K_STATS, 'persisted', 0)  -- a write all the same: see the note in REPLAY
  return {0, tonumber(redis.call('GET', K_GEN) or '0')}
end
local count, gen = persist_frames(frames)
redis.call('HINCRBY', K_STATS, 'persisted', count)  -- even 0: see REPLAY (a retry's wait covers the first call)
return {count, gen}
""")


def persist_v2(layer: FTLayer, frames: list[bytes], *, partial: dict[int, int] | None = None) -> None:
    """File ``frames`` as format 2 did (one call), then set the ack values in ``partial`` (sid ->
    value), as a flush of part of a tree did. The source's ``meta.format`` becomes 2."""
    client: Any = layer.store.client
    k = layer.store.keys
    keys = [k.pend, k.gen, k.bcnt, k.failed, k.due, k.stats, k.buckets, k.token("p:legacy" + str(len(frames))),
            *(k.channel(c) for c in range(layer.num_channels))]
    client.eval(PERSIST_V2, len(keys), *keys, k.prefix, layer.num_channels, b"".join(frames), 60_000)
    for sid, value in (partial or {}).items():
        raw = sid.to_bytes(8, "big", signed=True)
        old = client.hget(k.pend, raw)
        client.hset(k.pend, raw, value.to_bytes(8, "big", signed=True) + old[8:])
    client.hset(k.meta, "format", 2)
