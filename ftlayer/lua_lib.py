"""The Lua library the scripts of :mod:`ftlayer.scripts` share: layouts, counts, chunks.

Nothing here runs alone. Each script is assembled from these pieces (in this
order, where it needs them): :data:`LAYOUT`, :data:`STATE_KEYS`,
:data:`COMMON`, :data:`CHUNK_LIB`, :data:`PERSIST_LIB`, :data:`CLOCK`.

Representation of 64-bit values: Redis Lua numbers are doubles and its ``bit``
library is 32-bit, so ids and ack values never become Lua numbers. They travel
and are stored as 8-byte big-endian strings, and XOR is done on the two 32-bit
halves (``struct.unpack('>I4I4')`` then ``bit.bxor``), which is exact.

Layouts are defined once, in Python: :data:`LAYOUT` declares Lua locals
generated from the constants of ``ftlayer.frames`` and ``ftlayer.chunks``
(1-based offsets), so no script spells an offset as a number
(``tests/ftlayer/test_frame_layout.py`` checks it).

**Chunks** (``ftlayer.chunks``): a chunk is loaded into a Lua table
(``chunk_load``) holding its header fields and its settled bitmap as a table of
byte values; records are settled by flipping a bit of that table
(``chunk_settle``) and the state is written back once per chunk (``chunk_save``),
or the chunk's three fields are deleted when its last record settles. The ack
value of a pending record is its initial value (``ci``, read lazily once per
chunk) unless a partial XOR was applied to it, which then lives in ``xv`` (a
tree split over several flushes); ``partials`` counts those per chunk, so a
chunk without any never looks there. A record's frame is found by walking the
length prefixes of the chunk's frames once per chunk (only failing records need
frames in a script).

Counting: every change to the pending-record count (``LIVE``) and to a bucket
generation's live-chunk count (``bucket_done``) is gathered during a script and
applied once by ``settle_counts``, which every script that settles or files
records calls before it returns.
"""

from __future__ import annotations

from ftlayer.chunks import (
    CHUNK_IN_HEADER,
    CHUNK_KEY_BYTES,
    CHUNK_MAX_RECORDS,
    FLAG_REFILED,
    FLAG_SEEN,
    STATE_HEADER,
)
from ftlayer.frames import (
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
-- frame, chunk and failed-value layouts, generated from ftlayer.frames and ftlayer.chunks (1-based)
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

# KEYS[1..11] of every script that changes record state (ftlayer.store.SourceStore.state_keys).
STATE_KEYS = r"""
local K_CK, K_CI, K_CF, K_XV, K_LIVE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_GEN, K_BCNT, K_FAILED, K_DUE, K_STATS, K_BKT = KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local CH_BASE = #KEYS  -- scripts that persist set it to where their channel streams start
"""

# Buckets and counts. A script that calls bucket_done or changes LIVE calls settle_counts before it returns.
COMMON = r"""
local LEFT_BUCKET, LIVE = {}, 0
local function bucket_done(g)
  -- a chunk filed in bucket g left it (all its records settled, or it was re-filed elsewhere)
  LEFT_BUCKET[g] = (LEFT_BUCKET[g] or 0) + 1
end

local HEAD_DROP_MAX = 1024  -- bucket elements one call may drop (bounded script time)

local function drop_done_heads()
  -- pop the head elements of `bkt` whose bucket has no live chunk left. Elements are in
  -- generation order, so buckets that completed leave from the head; one behind an older
  -- bucket still live waits for it (or for EXPIRE)
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

local function settle_counts()
  -- one HINCRBY per bucket touched and one INCRBY of the pending count (not per record)
  local emptied = false
  for g, n in pairs(LEFT_BUCKET) do
    if redis.call('HINCRBY', K_BCNT, g, -n) <= 0 then
      redis.call('HDEL', K_BCNT, g)
      emptied = true
    end
  end
  LEFT_BUCKET = {}
  if LIVE ~= 0 then
    redis.call('INCRBY', K_LIVE, LIVE)
    LIVE = 0
  end
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
"""

CHUNK_LIB = r"""
local function chunk_load(key)
  -- the chunk named key as a table, or nil if it is not pending (all settled, or never filed)
  local st = redis.call('HGET', K_CK, key)
  if not st then return nil end
  local c = {key = key}
  c.gen, c.egen, c.ch, c.n, c.left, c.partials, c.flags = struct.unpack(CK_HEAD, st)
  c.bits = {string.byte(st, HDR + 1, HDR + math.floor((c.n + 7) / 8))}
  return c
end

local function chunk_pending(c, i)
  return i < c.n and bit.band(c.bits[math.floor(i / 8) + 1], P2[i % 8 + 1]) == 0
end

local function chunk_sid(c, i)
  return c.key .. struct.pack('>I2', i)
end

local function chunk_settle(c, i)
  -- record i (pending) completed or failed: it is no longer pending and drops its partial XOR
  local b = math.floor(i / 8) + 1
  c.bits[b] = c.bits[b] + P2[i % 8 + 1]
  c.left = c.left - 1
  c.dirty = true
  LIVE = LIVE - 1
  if c.partials > 0 and redis.call('HDEL', K_XV, chunk_sid(c, i)) == 1 then c.partials = c.partials - 1 end
end

local function chunk_value(c, i)
  -- the ack value of pending record i as two unsigned 32-bit halves
  if c.partials > 0 then
    local v = redis.call('HGET', K_XV, chunk_sid(c, i))
    if v then return struct.unpack('>I4I4', v) end
  end
  if not c.cids then c.cids = redis.call('HGET', K_CI, c.key) end
  return struct.unpack('>I4I4', c.cids, 8 * i + 1)
end

local function chunk_set_partial(c, i, r1, r2)
  -- a delta left record i's tree open: its ack value is now r (two signed halves from bit.bxor)
  if redis.call('HSET', K_XV, chunk_sid(c, i), struct.pack('>i4i4', r1, r2)) == 1 then
    c.partials = c.partials + 1
    c.dirty = true
  end
end

local function chunk_save(c)
  -- write a changed chunk back; a chunk with no pending record left is deleted
  if not c.dirty then return end
  c.dirty = false
  if c.left <= 0 then
    redis.call('HDEL', K_CK, c.key)
    redis.call('HDEL', K_CI, c.key)
    redis.call('HDEL', K_CF, c.key)
    bucket_done(c.gen)
    return
  end
  redis.call('HSET', K_CK, c.key,
    struct.pack(CK_HEAD, c.gen, c.egen, c.ch, c.n, c.left, c.partials, c.flags) .. string.char(unpack(c.bits)))
end

local function chunk_frame(c, i)
  -- the frame of record i ('' if the chunk's frames end before it). The lengths are walked
  -- once per chunk and call; a damaged length gives a damaged frame, which the replayer
  -- cannot decode and dead-letters: never a silent loss
  if not c.offs then
    local fr = redis.call('HGET', K_CF, c.key) or ''
    local offs, pos, size = {}, 1, #fr
    for j = 0, c.n - 1 do
      if pos + 3 > size then break end
      offs[j] = pos
      pos = pos + 4 + struct.unpack('>I4', fr, pos)
    end
    c.fr, c.offs = fr, offs
  end
  local p = c.offs[i]
  if not p then return '' end
  return string.sub(c.fr, p, p + 3 + struct.unpack('>I4', c.fr, p))
end

local function chunk_fail(c, i, reason, now_ms, b_init, b_mult, b_max, no_replay)
  -- move pending record i to `failed`, due for replay after its backoff (due now, with the
  -- NO_REPLAY bit on its stored reason length, if it is to be dead-lettered at once)
  local sid = chunk_sid(c, i)
  local frame = chunk_frame(c, i)
  local rc = 0
  if #frame >= F_HEADER then rc = struct.unpack('>I2', frame, F_REPLAY) end
  local delay = b_init * (b_mult ^ math.min(rc, 64))
  if delay > b_max then delay = b_max end
  local rlen = #reason
  if no_replay then delay = 0; rlen = rlen + NO_REPLAY end
  redis.call('HSET', K_FAILED, sid, struct.pack('>dI2', now_ms, rlen) .. reason .. frame)
  redis.call('ZADD', K_DUE, now_ms + delay, sid)
  chunk_settle(c, i)
  return #frame
end
"""

# Filing new chunks: PERSIST, REPLAY, REQUEUE and MIGRATE. Input format: ftlayer.chunks.CHUNK_IN_HEADER.
PERSIST_LIB = r"""
local function parse_chunks(blob, nch)
  -- split persist input into chunk tables; nil plus an error if one is malformed or off-range
  local out, pos, size, seen = {}, 1, #blob, {}
  while pos <= size do
    if pos + CIN_HEAD - 1 > size then return nil, 'truncated chunk at byte ' .. pos end
    local key = string.sub(blob, pos, pos + KEY_BYTES - 1)
    local n, ch, present, flen = struct.unpack('>I2I2I2I4', blob, pos + KEY_BYTES)
    local b0 = pos + CIN_HEAD
    local c0 = b0 + math.floor((n + 7) / 8)
    local f0 = c0 + 8 * n
    local stop = f0 + flen - 1
    if stop > size then return nil, 'truncated chunk at byte ' .. pos end
    if n < 1 or n > CHUNK_MAX or present > n or flen < 4 * n then return nil, 'bad chunk at byte ' .. pos end
    if ch >= nch then return nil, 'channel ' .. ch .. ' out of range 0..' .. (nch - 1) end
    if seen[key] then return nil, 'chunk at byte ' .. pos .. ' is given twice' end
    seen[key] = true
    out[#out + 1] = {key = key, n = n, ch = ch, present = present, bits = string.sub(blob, b0, c0 - 1),
      cids = string.sub(blob, c0, f0 - 1), frames = string.sub(blob, f0, stop)}
    pos = stop + 1
  end
  return out
end

local function chunk_in_use(chunks)
  -- the first chunk id of the input that pending records of other ids use, or nil. A chunk that
  -- is pending with the very same records (the same initial ack values: a persist repeated) is
  -- set to file nothing (present = 0). One HMGET per 500 chunks, more only where one is pending
  for base = 1, #chunks, 500 do
    local keys = {}
    for j = base, math.min(#chunks, base + 499) do keys[#keys + 1] = chunks[j].key end
    local have = redis.call('HMGET', K_CK, unpack(keys))
    for j = 1, #keys do
      if have[j] then
        local c = chunks[base + j - 1]
        if redis.call('HGET', K_CI, c.key) ~= c.cids then return c.key end
        c.present, c.dup = 0, true
      end
    end
  end
  return nil
end

local function take_records(c, keep)
  -- keep(i) decides each record i of parsed chunk c that is not a hole; one not kept becomes a hole.
  -- A chunk already pending with the same records (chunk_in_use) files nothing and takes nothing
  if c.dup then return end
  local bits, changed = {string.byte(c.bits, 1, -1)}, false
  for i = 0, c.n - 1 do
    local b, m = math.floor(i / 8) + 1, P2[i % 8 + 1]
    if bit.band(bits[b], m) == 0 and not keep(i) then
      bits[b] = bits[b] + m
      c.present = c.present - 1
      changed = true
    end
  end
  if changed then c.bits = string.char(unpack(bits)) end
end

local function read_input(what)
  -- the persist input of ARGV[3] for ARGV[2] channels (CH_BASE set), or nil plus an error reply
  local nch = tonumber(ARGV[2])
  local chunks, err = parse_chunks(ARGV[3], nch)
  err = err or channel_keys_error(nch)
  if err then return nil, redis.error_reply('ftlayer ' .. what .. ': ' .. err) end
  return chunks
end

local function take_by_olds(chunks, olds, take_old)
  -- olds holds an 8-byte id per chunk and index, aligned with the records: take_old(id, chunk,
  -- index) decides each (chunk and index name the new record that replaces the old one)
  local at = 0
  for _, c in ipairs(chunks) do
    local base = at
    take_records(c, function(i) return take_old(string.sub(olds, base + 8 * i + 1, base + 8 * i + 8), c, i) end)
    at = at + 8 * c.n
  end
end

local function store_chunks(chunks)
  -- file parsed chunks in the current bucket and their channel streams; returns records filed, gen.
  -- One HSET per hash per 500 chunks (a call of many one-record chunks stays cheap)
  local gen = tonumber(redis.call('GET', K_GEN) or '0')
  local ids, per_ch, per_n, count = {}, {}, {}, 0
  local st, ci, cf = {}, {}, {}
  local function flush_fields()
    if #st > 0 then
      redis.call('HSET', K_CK, unpack(st))
      redis.call('HSET', K_CI, unpack(ci))
      redis.call('HSET', K_CF, unpack(cf))
      st, ci, cf = {}, {}, {}
    end
  end
  for _, c in ipairs(chunks) do
    if c.present > 0 then
      st[#st + 1] = c.key
      st[#st + 1] = struct.pack(CK_HEAD, gen, gen, c.ch, c.n, c.present, 0, 0) .. c.bits
      ci[#ci + 1] = c.key
      ci[#ci + 1] = c.cids
      cf[#cf + 1] = c.key
      cf[#cf + 1] = c.frames
      if #st >= 1000 then flush_fields() end
      ids[#ids + 1] = c.key
      local t = per_ch[c.ch]
      if t == nil then
        t = {}
        per_ch[c.ch] = t
        per_n[c.ch] = 0
      end
      t[#t + 1] = c.key
      per_n[c.ch] = per_n[c.ch] + c.present
      count = count + c.present
    end
  end
  flush_fields()
  if #ids > 0 then
    redis.call('RPUSH', K_BKT, struct.pack('>I4', gen) .. table.concat(ids))
    redis.call('HINCRBY', K_BCNT, gen, #ids)
    for ch, keys in pairs(per_ch) do
      redis.call('XADD', KEYS[CH_BASE + 1 + ch], '*', 'c', table.concat(keys), 'g', gen, 'n', per_n[ch])
    end
    LIVE = LIVE + count
  end
  return count, gen
end
"""

# The server's CPU time inside a script. TIME cannot serve: the server freezes it for the
# whole script. The bounded scripts (see ftlayer.script_bounds) stop once their budget is spent.
CLOCK = r"""
local function clock_ms()
  return os.clock() * 1000
end
"""
