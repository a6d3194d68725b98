"""All server-side Lua of ftlayer, in one module.

Representation of 64-bit values: Redis Lua numbers are doubles and its ``bit``
library is 32-bit, so ids and ack values never become Lua numbers. They travel
and are stored as 8-byte big-endian strings; XOR is done on the two 32-bit
halves (``struct.unpack('>I4I4')`` then ``bit.bxor``), which is exact.

Layouts are defined once: every script starts with :data:`LAYOUT`, Lua
locals generated from the constants of ``ftlayer.frames`` that the encoder
uses (1-based): ``F_SID``/``F_CID`` (source and current record id, 8 bytes
each), ``F_REPLAY`` and ``F_CHANNEL`` (u16), ``F_HEADER`` and ``F_BODY_MIN``,
and for a ``pend`` value (``ack (8) | bucket gen (u32) | frame``) ``P_GEN``
and ``P_FRAME``, and for a ``failed`` value (``failed_ms f64 | reason
length u16 | reason | frame``) ``FL_REASON``. No script spells an offset as a number
(``tests/ftlayer/test_frame_layout.py`` checks it).

Handed out or not (stalls): a channel stream entry is ``i`` = packed ids, ``g`` =
the bucket gen it was written in (entries are in gen order). ``READ_CHANNEL``
keeps each channel's read watermark in ``rd`` (``"<entry gen> <stream id>"`` of the
newest entry a reader has finished or entered), so ``EXPIRE`` can tell a record that a
task received from one still waiting in its stream, at no per-record cost on reads.

Every key a script touches is in its KEYS (the ``#!lua`` shebang makes the server
check it): the buckets of all generations share one list (``bkt``, elements tagged
with their generation) and a script that persists declares every channel stream.

Every script is idempotent under a client retry: persist skips ids already
present, flushes carry a token, fails and replays act only on entries still in
the state they expect, rotate can be tied to an expected generation.
"""

from __future__ import annotations

from ftlayer.frames import (
    BODY_FIXED_SIZE,
    FAILED_PREFIX,
    HEADER_SIZE,
    OFFSET_CHANNEL,
    OFFSET_CURRENT_RECORD_ID,
    OFFSET_REPLAY_COUNT,
    OFFSET_SOURCE_RECORD_ID,
    PEND_GEN_OFFSET,
    PEND_PREFIX,
)

LAYOUT = f"""
-- frame and pend-value layout, generated from ftlayer.frames (1-based)
local F_SID, F_CID = {OFFSET_SOURCE_RECORD_ID + 1}, {OFFSET_CURRENT_RECORD_ID + 1}
local F_REPLAY, F_CHANNEL = {OFFSET_REPLAY_COUNT + 1}, {OFFSET_CHANNEL + 1}
local F_HEADER, F_BODY_MIN = {HEADER_SIZE}, {BODY_FIXED_SIZE}
local P_GEN, P_FRAME = {PEND_GEN_OFFSET + 1}, {PEND_PREFIX + 1}
local FL_REASON = {FAILED_PREFIX + 1}
"""

# Shared helpers, prepended to the scripts that fail or persist records. They
# expect K_PEND, K_GEN, K_BCNT, K_FAILED, K_DUE, K_STATS, K_BKT and CH_BASE to be set
# (the stream of channel c is KEYS[CH_BASE + 1 + c]; persist_frames writes to it).
# A script that calls bucket_done (directly or through fail_entry) must call
# settle_buckets before it returns.
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

# The server's CPU time inside a script. TIME cannot serve: the server freezes it for the
# whole script. The bounded scripts (see ftlayer.script_bounds) stop once their budget is spent.
_CLOCK = r"""
local function clock_ms()
  return os.clock() * 1000
end
"""

_STATE_KEYS = r"""
local K_PEND, K_GEN, K_BCNT, K_FAILED, K_DUE, K_STATS = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local K_BKT = KEYS[7]
local CH_BASE = #KEYS  -- scripts that persist set it to where their channel streams start
"""

PERSIST = (
    r"""
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
"""
)

FLUSH = (
    r"""
-- flush: apply explicit fails, then XOR deltas, at most once per token.
-- KEYS: pend, gen, bcnt, failed, due, stats, bkt, token key (a hash per micro-batch of a query)
-- ARGV: prefix, use_token ('1'|'0'), token ttl ms, deltas (n x [sid 8][value 8]),
--       fails (n x [sid 8][reason len u16, top bit = no replay][reason]), now ms, backoff initial ms,
--       backoff multiplier, backoff max ms, token field (the task's flush in that batch),
--       completing only ('1': apply a delta only if it completes its record, leave the others
--       untouched; optional, default '0')
-- Returns: {applied (1, or 0 if the token was seen), acked sids (packed 8-byte),
--           late deltas (ids no longer pending), failed count}
-- A delta for an id that is not pending (already acked or failed) is ignored:
-- late acks never resurrect or corrupt a record. A completing-only call needs no token: a
-- delta it applies deletes its record, so the same call again finds nothing to change.
"""
    + _STATE_KEYS
    + _COMMON
    + r"""
if ARGV[2] == '1' then
  if redis.call('HSETNX', KEYS[8], ARGV[10], '1') == 0 then
    redis.call('HINCRBY', K_STATS, 'duplicate_flushes', 1)
    return {0, '', 0, 0}
  end
  redis.call('PEXPIRE', KEYS[8], ARGV[3])  -- safety net: the batch's commit deletes it first
end
local now, b_init, b_mult, b_max = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local fails, failed_n, pos = ARGV[5], 0, 1
while pos + 9 <= #fails do
  local sid = string.sub(fails, pos, pos + 7)
  local rlen = struct.unpack('>I2', fails, pos + 8)
  local no_replay = rlen >= NO_REPLAY
  if no_replay then rlen = rlen - NO_REPLAY end
  local reason = string.sub(fails, pos + 10, pos + 9 + rlen)
  pos = pos + 10 + rlen
  local v = redis.call('HGET', K_PEND, sid)
  if v then
    fail_entry(sid, v, reason, now, b_init, b_mult, b_max, no_replay)
    failed_n = failed_n + 1
  end
end
local deltas, acked, late = ARGV[4], {}, 0
local completing_only = ARGV[11] == '1'
local n = math.floor(#deltas / 16)
for base = 0, n - 1, CHUNK do
  local sids, last = {}, math.min(n - 1, base + CHUNK - 1)
  for i = base, last do sids[#sids + 1] = string.sub(deltas, 16 * i + 1, 16 * i + 8) end
  local vals, done, kv = redis.call('HMGET', K_PEND, unpack(sids)), {}, {}
  for j, sid in ipairs(sids) do
    local v = vals[j]
    if not v then
      late = late + 1
    else
      local a1, a2 = struct.unpack('>I4I4', v)
      local d1, d2 = struct.unpack('>I4I4', deltas, 16 * (base + j - 1) + 9)
      local r1, r2 = bit.bxor(a1, d1), bit.bxor(a2, d2)
      if r1 == 0 and r2 == 0 then
        done[#done + 1] = sid
        bucket_done(struct.unpack('>I4', v, P_GEN))
        acked[#acked + 1] = sid
      elseif not completing_only then
        kv[#kv + 1] = sid
        kv[#kv + 1] = struct.pack('>i4i4', r1, r2) .. string.sub(v, P_GEN)
      end
    end
  end
  if #done > 0 then redis.call('HDEL', K_PEND, unpack(done)) end
  if #kv > 0 then redis.call('HSET', K_PEND, unpack(kv)) end
end
settle_buckets()
if #acked > 0 then redis.call('HINCRBY', K_STATS, 'acked', #acked) end
if late > 0 then redis.call('HINCRBY', K_STATS, 'late_deltas', late) end
if failed_n > 0 then redis.call('HINCRBY', K_STATS, 'failed_explicit', failed_n) end
return {1, table.concat(acked), late, failed_n}
"""
)

PENDING = r"""
-- pending: which of the given records are still pending (neither completed nor failed).
-- KEYS: pend
-- ARGV: prefix, sids (packed 8-byte)
-- Returns: a string with one byte per sid, '1' if pending, else '0'. Read-only.
local sids, out = ARGV[2], {}
for pos = 1, #sids - 7, 8 do
  out[#out + 1] = redis.call('HEXISTS', KEYS[1], string.sub(sids, pos, pos + 7)) == 1 and '1' or '0'
end
return table.concat(out)
"""

ROTATE = r"""
-- rotate: open new timeout buckets up to a target generation; queue the expired ones for scanning.
-- KEYS: gen, lease, expq, bcnt
-- ARGV: owner token ('' = no lease check), num_buckets, expected gen ('' = any),
--       target gen ('' = current gen + 1)
-- Returns: {1, new gen, last expired gen, previous gen} on success; {-1, gen} if the caller
-- does not hold the lease; {-2, gen} if gen differs from the expected one; {0, gen} if gen
-- already reached the target (a retry whose first reply was lost: nothing happens twice).
-- Jumping k generations at once is k rotations in one atomic step: the expired
-- generations are queued oldest first, so missed rotations are caught up in order,
-- and no record can be filed between them. Only gens >= gen + 1 - num_buckets can
-- still hold records (older ones were queued by earlier rotations): O(num_buckets).
local g = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then return {-1, g} end
if ARGV[3] ~= '' and tonumber(ARGV[3]) ~= g then return {-2, g} end
local target = g + 1
if ARGV[4] ~= '' then target = tonumber(ARGV[4]) end
if target <= g then return {0, g} end
redis.call('SET', KEYS[1], target)
local n = tonumber(ARGV[2])
for e = math.max(0, g + 1 - n), math.min(g, target - n) do
  if redis.call('HEXISTS', KEYS[4], e) == 1 then redis.call('RPUSH', KEYS[3], e) end
end
return {1, target, target - n, g}
"""

EXPIRE = (
    r"""
-- expire: fail the still-pending records of expired buckets, in bounded chunks.
-- KEYS: pend, gen, bcnt, failed, due, stats, bkt, expq, rd (read watermarks),
--       ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, now ms, backoff initial ms, backoff multiplier, backoff max ms,
--       max record ids to examine, max value bytes to move, time budget ms
-- Returns: {failed sids (packed 8-byte), expired buckets still queued}
-- A record acked or failed earlier is no longer in pend and is skipped, so a
-- record that completed never expires. Each record fails at most once.
-- Bounded: the call stops at the first limit reached (after at least one id) and
-- pushes the unscanned rest of the bucket element back to the head of `bkt`, so
-- the next call goes on at the next id: no id is skipped or scanned twice.
-- `bkt` holds the elements of every bucket in generation order, so the elements of
-- the oldest queued generation are at its head; an element of an older bucket whose
-- records all completed is dropped unscanned.
-- Stalls: a record whose channel entry no reader has read yet (Spark stalled or
-- behind) is not failed. It keeps its id, ack value and stream entry and is
-- re-filed in the current bucket (counted in `refiled_unread`): a stall never
-- spends the replay budget, and the record is checked again one timeout later.
-- A re-filed record that a task has read since gets one more timeout (it may have
-- been read just now) and then fails as usual: a record read after a stall has at
-- least timeout_s to complete. A bucket element is [gen u32] .. n x [sid 8], or, for
-- re-filed records (length - 4 not a multiple of 8), [gen u32] .. 'R' .. n x [sid 8][entry
-- gen u32, top bit: read at re-filing]; the pushed-back rest of an element keeps its head.
"""
    + _STATE_KEYS
    + _COMMON
    + _CLOCK
    + r"""
local now, b_init, b_mult, b_max = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local max_n, max_b, budget = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local t0, n, bytes, out, stop = clock_ms(), 0, 0, {}, false
local cur = tonumber(redis.call('GET', K_GEN) or '0')
local curb, refiled, kv, unread_n = struct.pack('>I4', cur), {}, {}, 0
local READ_FLAG = 2147483648
local marks, unread_after = {}, {}

local function entry_gen(e)
  local f = e[2]
  for i = 1, #f - 1, 2 do
    if f[i] == 'g' then return tonumber(f[i + 1]) end
  end
  return nil
end

local function handed_out(sid, ch, egen)
  -- has a reader read the entry of channel ch, written in gen egen, that holds sid?
  local m = marks[ch]
  if m == nil then
    m = false
    local raw = redis.call('HGET', KEYS[9], ch)
    if raw then
      local g, id = string.match(raw, '^(%d+) (.+)$')
      m = {tonumber(g), id}
    end
    marks[ch] = m
  end
  if not m then return false end      -- nothing of this channel was ever read
  if egen < m[1] then return true end  -- entries are in gen order
  if egen > m[1] then return false end
  -- same gen as the newest entry read: the entries of that gen after it are unread
  -- (at most one rotation interval of this channel's entries; scanned once per call)
  local set = unread_after[ch]
  if set == nil then
    set = {}
    local after, done = '(' .. m[2], false
    while not done do
      local es = redis.call('XRANGE', KEYS[CH_BASE + 1 + ch], after, '+', 'COUNT', 64)
      done = #es < 64
      for _, en in ipairs(es) do
        if entry_gen(en) ~= m[1] then done = true; break end
        local ids = en[2][2]
        for q = 1, #ids - 7, 8 do set[string.sub(ids, q, q + 7)] = true end
        after = '(' .. en[1]
      end
    end
    unread_after[ch] = set
  end
  return not set[sid]
end

CH_BASE = 9
while not stop do
  local e = redis.call('LINDEX', KEYS[8], 0)
  if not e then break end
  local blob = redis.call('LINDEX', K_BKT, 0)
  local eg = blob and struct.unpack('>I4', blob) or nil
  if eg == nil or eg > tonumber(e) then
    -- no element of queued bucket e is left: it is done
    redis.call('LPOP', KEYS[8])
    redis.call('HDEL', K_BCNT, e)
  elseif redis.call('HEXISTS', K_BCNT, eg) == 0 then
    redis.call('LPOP', K_BKT)  -- an older bucket whose records all completed
  else
    redis.call('LPOP', K_BKT)
    local p, stride, head = 5, 8, string.sub(blob, 1, 4)
    if (#blob - 4) % 8 ~= 0 then p, stride, head = 6, 12, head .. 'R' end  -- re-filed records
    local last = #blob - stride + 1
    while p <= last do
      local sid = string.sub(blob, p, p + 7)
      local egen, seen = eg, false
      if stride == 12 then
        egen = struct.unpack('>I4', blob, p + 8)
        if egen >= READ_FLAG then egen, seen = egen - READ_FLAG, true end
      end
      p, n = p + stride, n + 1
      local v = redis.call('HGET', K_PEND, sid)
      if v and struct.unpack('>I4', v, P_GEN) == eg then
        bytes = bytes + #v
        local ch = struct.unpack('>I2', v, P_FRAME - 1 + F_CHANNEL)
        if ch >= #KEYS - CH_BASE then
          return redis.error_reply('ftlayer expire: channel ' .. ch .. ' has no declared stream key')
        end
        local read = seen or handed_out(sid, ch, egen)
        if read and (seen or stride == 8) then
          fail_entry(sid, v, 'timeout', now, b_init, b_mult, b_max, false)
          out[#out + 1] = sid
        else
          bucket_done(eg)
          if read then egen = egen + READ_FLAG else unread_n = unread_n + 1 end
          refiled[#refiled + 1] = sid .. struct.pack('>I4', egen)
          local a1, a2 = struct.unpack('>i4i4', v)  -- the ack value, kept
          kv[#kv + 1] = sid
          kv[#kv + 1] = struct.pack('>i4i4', a1, a2) .. curb .. string.sub(v, P_FRAME)
          if #kv >= 2 * CHUNK then
            redis.call('HSET', K_PEND, unpack(kv))
            kv = {}
          end
        end
      end
      if n >= max_n or bytes >= max_b or (n % 64 == 0 and clock_ms() - t0 >= budget) then
        stop = true
        break
      end
    end
    -- the unscanned rest stays first in the bucket list, where the next call starts
    if p <= last then redis.call('LPUSH', K_BKT, head .. string.sub(blob, p)) end
  end
end
if #kv > 0 then redis.call('HSET', K_PEND, unpack(kv)) end
if #refiled > 0 then
  redis.call('RPUSH', K_BKT, curb .. 'R' .. table.concat(refiled))
  redis.call('HINCRBY', K_BCNT, cur, #refiled)
end
if unread_n > 0 then redis.call('HINCRBY', K_STATS, 'refiled_unread', unread_n) end
settle_buckets()
drop_done_heads()
if #out > 0 then redis.call('HINCRBY', K_STATS, 'failed_timeout', #out) end
return {table.concat(out), redis.call('LLEN', KEYS[8])}
"""
)

REPLAY = (
    r"""
-- replay: re-persist failed records under new ids, or dead-letter them.
-- KEYS: pend, gen, bcnt, failed, due, stats, bkt, dlq, ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, num_channels, replays (n x [old sid 8][new frame]),
--       dead (n x [old sid 8]), now ms
-- Returns: {replayed, dead-lettered}. An old id no longer in `failed` (another
-- replayer took it) is skipped, so each failure is replayed at most once.
"""
    + _STATE_KEYS
    + _COMMON
    + r"""
CH_BASE = 8
local nch, blob = tonumber(ARGV[2]), ARGV[3]
local key_err = channel_keys_error(nch)
if key_err then return redis.error_reply('ftlayer replay: ' .. key_err) end
local olds, frames, pos = {}, {}, 1
while pos <= #blob do
  if pos + 8 + F_HEADER - 1 > #blob then return redis.error_reply('ftlayer replay: truncated entry at byte ' .. pos) end
  local old = string.sub(blob, pos, pos + 7)
  local len = struct.unpack('>I4', blob, pos + 8)
  local frame = string.sub(blob, pos + 8, pos + 11 + len)
  if len < F_BODY_MIN or #frame ~= len + 4 then
    return redis.error_reply('ftlayer replay: bad frame at byte ' .. pos)
  end
  local ch = struct.unpack('>I2', frame, F_CHANNEL)
  if ch >= nch then return redis.error_reply('ftlayer replay: channel ' .. ch .. ' out of range') end
  olds[#olds + 1] = old
  frames[#frames + 1] = frame
  pos = pos + 12 + len
end
local take = {}
for i, old in ipairs(olds) do
  if redis.call('HDEL', K_FAILED, old) == 1 then
    redis.call('ZREM', K_DUE, old)
    take[#take + 1] = frames[i]
  end
end
local replayed = persist_frames(take)
local dead, dead_n = ARGV[4], 0
for p = 1, #dead - 7, 8 do
  local old = string.sub(dead, p, p + 7)
  local v = redis.call('HGET', K_FAILED, old)
  if v then
    local t, rlen = struct.unpack('>dI2', v)
    if rlen >= NO_REPLAY then rlen = rlen - NO_REPLAY end
    redis.call('XADD', KEYS[8], '*', 'sid', old, 'failed_ms', string.format('%.0f', t),
      'dead_ms', ARGV[5], 'reason', string.sub(v, FL_REASON, FL_REASON - 1 + rlen),
      'frame', string.sub(v, FL_REASON + rlen))
    redis.call('HDEL', K_FAILED, old)
    redis.call('ZREM', K_DUE, old)
    dead_n = dead_n + 1
  end
end
-- always a write, even of 0: a retried call then moves this connection's replication offset past
-- the first call's writes, so the WAIT/WAITAOF that follows it covers them (SourceStore.run_durable)
redis.call('HINCRBY', K_STATS, 'replayed', replayed)
if dead_n > 0 then redis.call('HINCRBY', K_STATS, 'dead_lettered', dead_n) end
return {replayed, dead_n}
"""
)

DEAD_LETTER = r"""
-- dead_letter: set aside one record that never became pending, at most once.
-- KEYS: dlq, stats, guard key (tok:dl:<source_record_id>)
-- ARGV: source_record_id (8 bytes), now ms, reason, frame, guard ttl ms
-- Returns: the dlq entry id. A retried call (the guard exists) appends nothing and
-- returns the entry id of the call that did, so a lost reply cannot add a second entry.
local prev = redis.call('GET', KEYS[3])
if prev then return prev end
local id = redis.call('XADD', KEYS[1], '*', 'sid', ARGV[1], 'failed_ms', ARGV[2], 'dead_ms', ARGV[2],
  'reason', ARGV[3], 'frame', ARGV[4])
redis.call('SET', KEYS[3], id, 'PX', ARGV[5])
redis.call('HINCRBY', KEYS[2], 'dead_lettered', 1)
return id
"""

RESCALE = r"""
-- rescale: change the channel count of a drained source.
-- KEYS: meta, pend, failed, channel streams ch:0 .. ch:<recorded count - 1>
-- ARGV: recorded count (as read by the caller), new count
-- Returns: {1, 0, 0} if the count is now the new one; {0, pending, failed} if records
-- are still in flight (nothing changed); {-1, current count} if the recorded count
-- changed since the caller read it. On success the old channel streams are emptied
-- (they can only name completed records; their last ids stay, so readers never go back).
local cur = redis.call('HGET', KEYS[1], 'num_channels')
if cur ~= ARGV[1] then return {-1, tonumber(cur or '0')} end
local pending, failed = redis.call('HLEN', KEYS[2]), redis.call('HLEN', KEYS[3])
if pending > 0 or failed > 0 then return {0, pending, failed} end
for i = 4, #KEYS do redis.call('XTRIM', KEYS[i], 'MAXLEN', 0) end
redis.call('HSET', KEYS[1], 'num_channels', ARGV[2])
return {1, 0, 0}
"""

READ_CHANNEL = (
    r"""
-- read_channel: the still-pending records of one channel between two stream positions, bounded.
-- KEYS: channel stream, pend, rd (read watermarks)
-- ARGV: start id ('-' = from the beginning), ids of the start entry already read
--       (0 = all of it: the read begins after it; k > 0: it begins at the entry's (k+1)-th id),
--       end id (inclusive, '+' = to the end), max stream entries, max record ids to examine,
--       max value bytes to return, time budget ms, channel number
-- Returns: {cursor id ('' if no entry was read), ids of the cursor entry read (0 = all),
-- value, value, ...} where a value is the record's `pend` value (ack 8 | gen 4 | frame):
-- the reader skips the 12-byte prefix, which saves a copy per record here. Ids no longer
-- pending (completed or failed since) are skipped: a re-run batch re-reads exactly the
-- records of its range that still need processing. The call stops at the first limit
-- reached (after at least one id); passing the cursor back as the start reads on with the
-- next id, so a range is read whole, in order, each id once, however it is chunked.
-- Entries are fetched a few at a time (doubling), so large entries are not copied for nothing.
-- The channel's read watermark (`rd`) moves up to the cursor entry, the last entry this
-- call finished or entered (never back): the records up to it count as handed to a
-- task (see EXPIRE).
"""
    + _CLOCK
    + r"""
local start, skip, last_id = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local max_e, max_n, max_b, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local from = start
if start == '-' then skip = 0 elseif skip == 0 then from = '(' .. start end
local t0, out, n, bytes, ents, fetch, done = clock_ms(), {'', 0}, 0, 0, 0, 4, false
local mark_g = nil
while not done and ents < max_e do
  local entries = redis.call('XRANGE', KEYS[1], from, last_id, 'COUNT', math.min(fetch, max_e - ents))
  if #entries == 0 then break end
  fetch = math.min(fetch * 2, 256)
  for _, e in ipairs(entries) do
    ents = ents + 1
    local ids = e[2][2]
    local total, pos = math.floor(#ids / 8), 0
    if skip > 0 and e[1] == start then pos = skip end
    skip = 0
    while pos < total do
      local k, sids = math.min(total - pos, 500, max_n - n), {}
      for i = pos, pos + k - 1 do sids[#sids + 1] = string.sub(ids, 8 * i + 1, 8 * i + 8) end
      local vals, used = redis.call('HMGET', KEYS[2], unpack(sids)), k
      for j = 1, k do
        local v = vals[j]
        if v then
          out[#out + 1] = v
          bytes = bytes + #v
          if bytes >= max_b then used = j; break end
        end
      end
      pos, n = pos + used, n + used
      if n >= max_n or bytes >= max_b or clock_ms() - t0 >= budget then done = true; break end
    end
    out[1] = e[1]
    mark_g = '2147483648'  -- an entry written without its gen: count everything before it as read
    local f = e[2]
    for i = 1, #f - 1, 2 do
      if f[i] == 'g' then mark_g = f[i + 1] end
    end
    if pos < total then out[2] = pos else out[2] = 0 end
    if done then break end
  end
  from = '(' .. out[1]
end
if mark_g then
  local mark = redis.call('HGET', KEYS[3], ARGV[8])
  local newer = not mark
  if mark then
    local mm, ms = string.match(mark, ' (%d+)-(%d+)$')
    local lm, ls = string.match(out[1], '^(%d+)-(%d+)$')
    mm, ms, lm, ls = tonumber(mm), tonumber(ms), tonumber(lm), tonumber(ls)
    newer = lm > mm or (lm == mm and ls > ms)
  end
  if newer then redis.call('HSET', KEYS[3], ARGV[8], mark_g .. ' ' .. out[1]) end
end
return out
"""
)

LEASE = r"""
-- lease: acquire or renew the rotator lease.
-- KEYS: lease
-- ARGV: owner token, ttl ms
-- Returns: 1 if the caller holds the lease now, 0 if another owner does.
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

RELEASE = r"""
-- release: give up the rotator lease if the caller holds it.
-- KEYS: lease
-- ARGV: owner token
-- Returns: 1 if released, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

REQUEUE = (
    r"""
-- requeue: move dead letters back into their channel streams as new source records.
-- KEYS: pend, gen, bcnt, failed, due, stats, bkt, dlq, ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, num_channels, entries (n x [entry id length u16][entry id][new frame])
-- Returns: entries requeued. Per entry, atomically: if XDEL removed the dead letter, its
-- new frame is persisted like a new record (pend, current bucket, channel stream); an
-- entry already gone (purged, requeued elsewhere) is skipped; one whose new
-- source_record_id is already pending stays in the dlq (never lost).
-- Error (nothing written) if an entry is malformed or a channel >= num_channels.
"""
    + _STATE_KEYS
    + _COMMON
    + r"""
CH_BASE = 8
local nch, blob = tonumber(ARGV[2]), ARGV[3]
local key_err = channel_keys_error(nch)
if key_err then return redis.error_reply('ftlayer requeue: ' .. key_err) end
local ids, frames, pos = {}, {}, 1
while pos <= #blob do
  local idlen = pos + 1 + F_HEADER <= #blob and struct.unpack('>I2', blob, pos) or 0
  local fpos = pos + 2 + idlen
  if idlen == 0 or fpos + F_HEADER - 1 > #blob then
    return redis.error_reply('ftlayer requeue: truncated at byte ' .. pos)
  end
  local len = struct.unpack('>I4', blob, fpos)
  local frame = string.sub(blob, fpos, fpos + 3 + len)
  if len < F_BODY_MIN or #frame ~= len + 4 then
    return redis.error_reply('ftlayer requeue: bad frame at byte ' .. pos)
  end
  local ch = struct.unpack('>I2', frame, F_CHANNEL)
  if ch >= nch then return redis.error_reply('ftlayer requeue: channel ' .. ch .. ' out of range') end
  ids[#ids + 1] = string.sub(blob, pos + 2, pos + 1 + idlen)
  frames[#frames + 1] = frame
  pos = fpos + 4 + len
end
local take, seen = {}, {}
for i, eid in ipairs(ids) do
  local sid = string.sub(frames[i], F_SID, F_SID + 7)
  if not seen[sid] and redis.call('HEXISTS', K_PEND, sid) == 0 and redis.call('XDEL', KEYS[8], eid) == 1 then
    seen[sid] = true
    take[#take + 1] = frames[i]
  end
end
local count = persist_frames(take)
redis.call('HINCRBY', K_STATS, 'requeued', count)  -- even 0: see REPLAY (a retry's wait covers the first call)
return count
"""
)

TRIM_DONE = (
    r"""
-- trim_done: drop the head of a channel stream whose records are all done, bounded.
-- KEYS: channel stream, pend
-- ARGV: max stream entries to examine, max record ids to examine, time budget ms
-- Returns: {entries removed, 1 if a limit stopped the call before a pending record or the
-- end of the stream (call again to go on), else 0}. Stops at the first entry that still
-- names a pending record. Safe at any time: an entry whose records are all completed or
-- failed would be read as empty anyway (readers skip ids not in pend), and readers
-- address ranges by stream id, which trimming does not change. An entry is removed only
-- once all its ids were checked, so a call cut short removes only whole finished entries.
"""
    + _CLOCK
    + r"""
local max_e, max_n, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t0, n, ents, fetch, from = clock_ms(), 0, 0, 4, '-'
local done_upto, keep, more = nil, false, 0
while not keep and ents < max_e do
  local entries = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', math.min(fetch, max_e - ents))
  if #entries == 0 then break end
  fetch = math.min(fetch * 2, 256)
  for _, e in ipairs(entries) do
    local sids = e[2][2]
    local left = math.floor(#sids / 8)
    if n > 0 and (n + left > max_n or clock_ms() - t0 >= budget) then more = 1; keep = true; break end
    for p = 1, #sids - 7, 8 do
      if redis.call('HEXISTS', KEYS[2], string.sub(sids, p, p + 7)) == 1 then keep = true; break end
    end
    if keep then break end
    n, ents, done_upto = n + left, ents + 1, e[1]
  end
  if done_upto then from = '(' .. done_upto end
end
if not keep and ents >= max_e then more = 1 end
if not done_upto then return {0, more} end
local ms, seq = string.match(done_upto, '(%d+)-(%d+)')
return {redis.call('XTRIM', KEYS[1], 'MINID', ms .. '-' .. (tonumber(seq) + 1)), more}
"""
)


BATCH_SETTLE = (
    r"""
-- batch_settle: ack (or fail) every still-pending record a micro-batch's read tasks emitted.
-- KEYS: pend, gen, bcnt, failed, due, stats, bkt, batch key (dfb:<query>:<batch>)
-- ARGV: prefix, mode ('ack' | 'fail'), max list elements to take in this call, fail reason,
--       now ms, backoff initial ms, backoff multiplier, backoff max ms
-- Returns: {records settled in this call, list elements left}. The caller repeats
-- until nothing is left (bounded work per call: each element holds at most 4096 ids).
-- An id no longer pending (acked, failed by a row function or a timeout) is skipped,
-- so an id listed twice (a retried task) settles once and a failed record is never acked.
"""
    + _STATE_KEYS
    + _COMMON
    + r"""
local mode, budget, reason = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now, b_init, b_mult, b_max = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local settled, seen = 0, {}
while budget > 0 do
  local blob = redis.call('LPOP', KEYS[8])
  if not blob then break end
  budget = budget - 1
  local n = math.floor(#blob / 8)
  for base = 0, n - 1, CHUNK do
    local sids = {}
    for i = base, math.min(n - 1, base + CHUNK - 1) do
      local sid = string.sub(blob, 8 * i + 1, 8 * i + 8)
      if not seen[sid] then seen[sid] = true; sids[#sids + 1] = sid end
    end
    if #sids > 0 then
      local vals, done = redis.call('HMGET', K_PEND, unpack(sids)), {}
      for j, sid in ipairs(sids) do
        local v = vals[j]
        if v then
          if mode == 'fail' then
            fail_entry(sid, v, reason, now, b_init, b_mult, b_max, false)
          else
            done[#done + 1] = sid
            bucket_done(struct.unpack('>I4', v, P_GEN))
          end
          settled = settled + 1
        end
      end
      if #done > 0 then redis.call('HDEL', K_PEND, unpack(done)) end
    end
  end
end
settle_buckets()
if settled > 0 then
  redis.call('HINCRBY', K_STATS, mode == 'fail' and 'failed_explicit' or 'acked', settled)
end
return {settled, redis.call('LLEN', KEYS[8])}
"""
)


#: Every script the store may run; each gets :data:`LAYOUT` in front of it.
SCRIPT_NAMES = (
    "PERSIST", "FLUSH", "ROTATE", "EXPIRE", "REPLAY", "READ_CHANNEL", "LEASE", "RELEASE", "TRIM_DONE", "REQUEUE",
    "DEAD_LETTER", "RESCALE", "BATCH_SETTLE", "PENDING",
)
#: First line of every script: a ``#!lua`` shebang makes the server hold a script to the
#: keys it declares (a cluster refuses any other key; Redis >= 7.0 or Valkey needed).
SHEBANG = "#!lua\n"
for _name in SCRIPT_NAMES:
    globals()[_name] = SHEBANG + LAYOUT + globals()[_name]
