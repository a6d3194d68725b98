"""All server-side Lua scripts of ftlayer, in one module (their shared library: ``ftlayer.lua_lib``).

The state they work on is layout format 3 (``ftlayer.keys``): records live in
*chunks* (``ftlayer.chunks``), one ``ck``/``ci``/``cf`` entry per chunk, so
filing, reading and timing out cost a few operations per chunk and an ack a
few Lua steps on numbers per record, with no per-record key, field or string.

Handed out or not (stalls): a channel stream entry is ``c`` = the packed chunk
ids, ``g`` = the bucket gen it was written in (entries are in gen order), ``n``
= its record count. ``READ_CHANNEL`` keeps each channel's read watermark in
``rd`` (``"<entry gen> <stream id>"`` of the newest entry a reader has finished
or entered), so ``EXPIRE`` can tell a chunk that a task received from one still
waiting in its stream, at no per-record cost on reads.

Every key a script touches is in its KEYS (the ``#!lua`` shebang makes the
server check it): the buckets of all generations share one list (``bkt``,
elements tagged with their generation) and a script that files records declares
every channel stream.

Every script is idempotent under a client retry: persist skips a call whose
token exists, flushes carry a token, fails and replays act only on records
still in the state they expect, rotate can be tied to an expected generation.
"""

from __future__ import annotations

from ftlayer.lua_lib import CHUNK_LIB, CLOCK, COMMON, LAYOUT, PERSIST_LIB, STATE_KEYS

_STATE = STATE_KEYS + COMMON + CHUNK_LIB

PERSIST = (
    r"""
-- persist: file a batch of source records, chunk by chunk, atomically, at most once per call token.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, call token (tok:p:<hash of the input>),
--       ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, num_channels, chunks (ftlayer.chunks persist input, concatenated), token ttl ms
-- Returns: {records filed, bucket gen}; {-1, chunk id} if a chunk id of the input is already in
-- use (nothing is written: the caller draws new ids). A retried call (its token exists) files
-- nothing: its records were filed by the first call and may since have been read, processed and
-- acked. A call whose writes a failover lost lost its token with them, so its retry files them again.
-- Error (nothing written) if a chunk is malformed or its channel >= num_channels.
"""
    + _STATE
    + PERSIST_LIB
    + r"""
CH_BASE = 12
local chunks, bad = read_input('persist')
if not chunks then return bad end
if redis.call('EXISTS', KEYS[12]) == 1 then
  redis.call('HINCRBY', K_STATS, 'persisted', 0)  -- a write all the same: see the note in REPLAY
  return {0, tonumber(redis.call('GET', K_GEN) or '0')}
end
local used = chunk_in_use(chunks)
if used then return {-1, used} end
redis.call('SET', KEYS[12], '1', 'PX', ARGV[4])
local count, gen = store_chunks(chunks)
settle_counts()
redis.call('HINCRBY', K_STATS, 'persisted', count)  -- even 0: see REPLAY (a retry's wait covers the first call)
return {count, gen}
"""
)

FLUSH = (
    r"""
-- flush: apply explicit fails, then XOR deltas, at most once per token.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, token key (a hash per micro-batch)
-- ARGV: prefix, use_token ('1'|'0'), token ttl ms, deltas (n x [sid 8][value 8], sorted by sid so
--       the records of a chunk come together), fails (n x [sid 8][reason len u16, top bit = no
--       replay][reason]), now ms, backoff initial ms, backoff multiplier, backoff max ms, token
--       field (the task's flush in that batch), completing only ('1': apply a delta only if it
--       completes its record, leave the others untouched; optional, default '0')
-- Returns: {applied (1, or 0 if the token was seen), the deltas that did not complete their record,
--           as [position u32][status u8] each (status 0: the record is not pending (late), 2: applied,
--           its tree still open, 3: not applied (completing only)); every other delta completed its
--           record; late deltas, failed count}
-- A delta for a record that is not pending (already completed or failed) is ignored: late acks
-- never resurrect or corrupt a record. A completing-only call needs no token: a delta it applies
-- settles its record, so the same call again finds nothing to change.
-- Cost: per chunk touched, two HGETs and one HSET (or three HDELs when its last record settles);
-- per delta, a few Lua steps on numbers (plus an HGET/HDEL in `xv` in a chunk whose trees are split).
"""
    + _STATE
    + r"""
if ARGV[2] == '1' then
  if redis.call('HSETNX', KEYS[12], ARGV[10], '1') == 0 then
    redis.call('HINCRBY', K_STATS, 'duplicate_flushes', 1)
    return {0, '', 0, 0}
  end
  redis.call('PEXPIRE', KEYS[12], ARGV[3])  -- safety net: the batch's commit deletes it first
end
local now, b_init, b_mult, b_max = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local fails, failed_n, pos, cache = ARGV[5], 0, 1, {}
while pos + 9 <= #fails do
  local sid = string.sub(fails, pos, pos + 7)
  local rlen = struct.unpack('>I2', fails, pos + 8)
  local no_replay = rlen >= NO_REPLAY
  if no_replay then rlen = rlen - NO_REPLAY end
  local reason = string.sub(fails, pos + 10, pos + 9 + rlen)
  pos = pos + 10 + rlen
  local key, i = string.sub(sid, 1, KEY_BYTES), struct.unpack('>I2', sid, KEY_BYTES + 1)
  local c = cache[key]
  if c == nil then
    c = chunk_load(key) or false
    cache[key] = c
  end
  if c and chunk_pending(c, i) then
    chunk_fail(c, i, reason, now, b_init, b_mult, b_max, no_replay)
    failed_n = failed_n + 1
  end
end
for _, c in pairs(cache) do
  if c then chunk_save(c) end
end
local deltas, completing_only = ARGV[4], ARGV[11] == '1'
local others, acked_n, late = {}, 0, 0  -- others: [position u32][status u8] of deltas that did not complete
local c, bits, cids, hi0, lo0 = nil, nil, nil, -1, -1
for j = 0, math.floor(#deltas / 16) - 1 do
  local p = 16 * j + 1
  local hi, lo, i, d1, d2 = struct.unpack('>I4I2I2I4I4', deltas, p)
  if hi ~= hi0 or lo ~= lo0 then
    if c then chunk_save(c) end
    hi0, lo0 = hi, lo
    c = chunk_load(string.sub(deltas, p, p + KEY_BYTES - 1))
    if c then bits, cids = c.bits, nil end
  end
  local s = 0
  if c and i < c.n then
    local b, m = bit.rshift(i, 3) + 1, P2[bit.band(i, 7) + 1]
    local v = bits[b]
    if bit.band(v, m) == 0 then
      local a1, a2
      if c.partials > 0 then
        a1, a2 = chunk_value(c, i)
      else  -- the common case, inline: the initial value
        if not cids then
          cids = redis.call('HGET', K_CI, c.key)
          c.cids = cids
        end
        a1, a2 = struct.unpack('>I4I4', cids, 8 * i + 1)
      end
      if a1 == d1 and a2 == d2 then  -- both read unsigned: equal halves XOR to 0
        if c.partials > 0 then
          chunk_settle(c, i)
        else
          bits[b] = v + m
          c.left = c.left - 1
          c.dirty = true
          LIVE = LIVE - 1
        end
        s = 1
        acked_n = acked_n + 1
      elseif completing_only then
        s = 3
      else
        chunk_set_partial(c, i, bit.bxor(a1, d1), bit.bxor(a2, d2))
        s = 2
      end
    end
  end
  if s ~= 1 then
    if s == 0 then late = late + 1 end
    others[#others + 1] = struct.pack('>I4B', j, s)
  end
end
if c then chunk_save(c) end
settle_counts()
if acked_n > 0 then redis.call('HINCRBY', K_STATS, 'acked', acked_n) end
if late > 0 then redis.call('HINCRBY', K_STATS, 'late_deltas', late) end
if failed_n > 0 then redis.call('HINCRBY', K_STATS, 'failed_explicit', failed_n) end
return {1, table.concat(others), late, failed_n}
"""
)

PENDING = r"""
-- pending: which of the given records are still pending (neither completed nor failed).
-- KEYS: ck
-- ARGV: prefix, sids (packed 8-byte)
-- Returns: a string with one byte per sid, '1' if pending, else '0'. Read-only; one HGET per chunk.
local sids, out, cache = ARGV[2], {}, {}
for pos = 1, #sids - 7, 8 do
  local key = string.sub(sids, pos, pos + KEY_BYTES - 1)
  local i = struct.unpack('>I2', sids, pos + KEY_BYTES)
  local st = cache[key]
  if st == nil then
    st = redis.call('HGET', KEYS[1], key) or false
    cache[key] = st
  end
  local p = '0'
  if st and i < struct.unpack('>I2', st, CK_N)
      and bit.band(string.byte(st, HDR + math.floor(i / 8) + 1), P2[i % 8 + 1]) == 0 then
    p = '1'
  end
  out[#out + 1] = p
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
-- expire: fail the still-pending records of expired buckets, in bounded chunks of work.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, expq, rd (read watermarks),
--       holds, hld:<tag> of each hold the caller found live (h of them),
--       ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, now ms, backoff initial ms, backoff multiplier, backoff max ms,
--       max records to examine, max frame bytes to move, time budget ms, h, the h hold tags
-- Returns: {failed sids (packed 8-byte), expired buckets still queued}; {'', -1} (nothing done)
-- if `holds` has a live hold the caller did not declare: it reads `holds` again and calls again.
-- A record acked or failed earlier is no longer pending and is skipped, so a record that
-- completed never expires. Each record fails at most once. A bucket element is [gen u32] ..
-- k x [chunk id 6]; a chunk whose state names a newer gen was re-filed and is skipped here.
-- Bounded: the call stops at the first limit reached (after at least one chunk) and pushes the
-- unscanned rest of the bucket element back to the head of `bkt`, so the next call goes on at
-- the next chunk: none is skipped or scanned twice. `bkt` holds the elements of every bucket in
-- generation order, so the elements of the oldest queued generation are at its head; an element
-- of an older bucket whose chunks all settled is dropped unscanned.
-- Stalls: a chunk whose channel entry no reader has read yet (Spark stalled or behind) is not
-- failed. It keeps its ids, ack values and stream entry and is re-filed in the current bucket
-- (its records counted in `refiled_unread`): a stall never spends the replay budget, and the
-- chunk is checked again one timeout later. A re-filed chunk that a task has read since gets one
-- more timeout (it may have been read just now; flag SEEN) and then fails as usual: a record
-- read after a stall has at least timeout_s to complete.
-- Holds (timeouts follow progress): a chunk that would fail but that a running micro-batch
-- read (it is in the `hld:<tag>` set of a hold whose deadline lies ahead) is re-filed in the
-- current bucket instead (flags REFILED and SEEN, counted in `refiled_held`): it fails at its
-- first expiry after the hold ended, unless the batch settled it first.
"""
    + _STATE
    + CLOCK
    + r"""
local now, b_init, b_mult, b_max = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local max_n, max_b, budget = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local t0, n, bytes, out, stop = clock_ms(), 0, 0, {}, false
local cur = tonumber(redis.call('GET', K_GEN) or '0')
local refiled, unread_n = {}, 0
local marks, unread_after = {}, {}

local function entry_gen(e)
  local f = e[2]
  for i = 1, #f - 1, 2 do
    if f[i] == 'g' then return tonumber(f[i + 1]) end
  end
  return nil
end

local function entry_chunks(e)
  local f = e[2]
  for i = 1, #f - 1, 2 do
    if f[i] == 'c' then return f[i + 1] end
  end
  return ''
end

local function handed_out(key, ch, egen)
  -- has a reader read the entry of channel ch, written in gen egen, that holds chunk key?
  local m = marks[ch]
  if m == nil then
    m = false
    local raw = redis.call('HGET', KEYS[13], ch)
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
        local ids = entry_chunks(en)
        for q = 1, #ids - KEY_BYTES + 1, KEY_BYTES do set[string.sub(ids, q, q + KEY_BYTES - 1)] = true end
        after = '(' .. en[1]
      end
    end
    unread_after[ch] = set
  end
  return not set[key]
end

local nh = tonumber(ARGV[9] or '0')
local held_sets, held_n = {}, 0
do
  local declared = {}
  for j = 1, nh do declared[ARGV[9 + j]] = 14 + j end
  local all = redis.call('HGETALL', KEYS[14])
  for i = 1, #all - 1, 2 do
    local deadline = tonumber(string.match(all[i + 1], '^(%d+)'))
    if deadline and deadline > now then
      local at = declared[all[i]]
      if not at then return {'', -1} end
      held_sets[#held_sets + 1] = at
    end
  end
end

local function held(key)
  for _, at in ipairs(held_sets) do
    if redis.call('SISMEMBER', KEYS[at], key) == 1 then return true end
  end
  return false
end

CH_BASE = 14 + nh
while not stop do
  local e = redis.call('LINDEX', KEYS[12], 0)
  if not e then break end
  local blob = redis.call('LINDEX', K_BKT, 0)
  local eg = blob and struct.unpack('>I4', blob) or nil
  if eg == nil or eg > tonumber(e) then
    -- no element of queued bucket e is left: it is done
    redis.call('LPOP', KEYS[12])
    redis.call('HDEL', K_BCNT, e)
  elseif redis.call('HEXISTS', K_BCNT, eg) == 0 then
    redis.call('LPOP', K_BKT)  -- an older bucket whose chunks all settled
  else
    redis.call('LPOP', K_BKT)
    local p, last = 5, #blob - KEY_BYTES + 1
    while p <= last do
      local c = chunk_load(string.sub(blob, p, p + KEY_BYTES - 1))
      p = p + KEY_BYTES
      if c and c.gen == eg then
        n = n + c.n
        if c.ch >= #KEYS - CH_BASE then
          return redis.error_reply('ftlayer expire: channel ' .. c.ch .. ' has no declared stream key')
        end
        local seen = bit.band(c.flags, FLAG_SEEN) ~= 0
        local read = seen or handed_out(c.key, c.ch, c.egen)
        local due = read and (seen or bit.band(c.flags, FLAG_REFILED) == 0)
        local hold = due and #held_sets > 0 and held(c.key)
        if due and not hold then
          for i = 0, c.n - 1 do
            if chunk_pending(c, i) then
              bytes = bytes + chunk_fail(c, i, 'timeout', now, b_init, b_mult, b_max, false)
              out[#out + 1] = chunk_sid(c, i)
            end
          end
          chunk_save(c)
        else
          bucket_done(eg)
          if not read then unread_n = unread_n + c.left end
          if hold then held_n = held_n + c.left end
          c.gen = cur
          c.flags = FLAG_REFILED + (read and FLAG_SEEN or 0)
          c.dirty = true
          chunk_save(c)
          refiled[#refiled + 1] = c.key
        end
      end
      if n >= max_n or bytes >= max_b or clock_ms() - t0 >= budget then
        stop = true
        break
      end
    end
    -- the unscanned rest stays first in the bucket list, where the next call starts
    if p <= last then redis.call('LPUSH', K_BKT, string.sub(blob, 1, 4) .. string.sub(blob, p)) end
  end
end
if #refiled > 0 then
  redis.call('RPUSH', K_BKT, struct.pack('>I4', cur) .. table.concat(refiled))
  redis.call('HINCRBY', K_BCNT, cur, #refiled)
end
if unread_n > 0 then redis.call('HINCRBY', K_STATS, 'refiled_unread', unread_n) end
if held_n > 0 then redis.call('HINCRBY', K_STATS, 'refiled_held', held_n) end
settle_counts()
drop_done_heads()
if #out > 0 then redis.call('HINCRBY', K_STATS, 'failed_timeout', #out) end
return {table.concat(out), redis.call('LLEN', KEYS[12])}
"""
)

REPLAY = (
    r"""
-- replay: re-persist failed records under new ids, or dead-letter them.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, dlq, ch:0 .. ch:<num_channels - 1>,
--       optionally rpl (replaced links)
-- ARGV: prefix, num_channels, replays (persist input: chunks of the new records),
--       olds (per chunk, per index: the failed record's old sid, 8 bytes), dead (n x [old sid 8]), now ms,
--       link ttl ms (with rpl), the old sids among olds that failed by timeout (n x [sid 8], with rpl)
-- Returns: {replayed, dead-lettered}, or {-1, chunk id} if a new chunk id is in use (nothing
-- written: the caller draws new ids). An old id no longer in `failed` (another replayer took it)
-- leaves a hole in its new chunk, so each failure is replayed at most once.
-- With rpl, a record that failed by timeout leaves the link old sid -> new sid (and the time):
-- its batch may still commit (a DataFrame batch that ran past its hold), and BATCH_SETTLE then
-- settles the copy instead. Each call that writes links sweeps at least as many (HSCAN from
-- the cursor kept in field `~`) and drops those older than the ttl: the hash stays bounded by
-- the timeout rate times the ttl; the whole hash expires a ttl after the last link.
"""
    + _STATE
    + PERSIST_LIB
    + r"""
CH_BASE = 12
local K_RPL = KEYS[CH_BASE + tonumber(ARGV[2]) + 1]
local chunks, bad = read_input('replay')
if not chunks then return bad end
local used = chunk_in_use(chunks)
if used then return {-1, used} end
local links, now_s, timed = 0, ARGV[6], {}
if K_RPL then  -- the caller read the reasons: no copy of each failed value into Lua here
  local t = ARGV[8] or ''
  for p = 1, #t - 7, 8 do timed[string.sub(t, p, p + 7)] = true end
end
local stamp = struct.pack('>d', tonumber(now_s))
take_by_olds(chunks, ARGV[4], function(old, c, i)
  if redis.call('HDEL', K_FAILED, old) == 0 then return false end
  redis.call('ZREM', K_DUE, old)
  if timed[old] then
    redis.call('HSET', K_RPL, old, chunk_sid(c, i) .. stamp)
    links = links + 1
  end
  return true
end)
if links > 0 then
  local now, ttl = tonumber(now_s), tonumber(ARGV[7])
  local r = redis.call('HSCAN', K_RPL, redis.call('HGET', K_RPL, '~') or '0', 'COUNT', links + 16)
  local f = r[2]
  for j = 1, #f - 1, 2 do
    if #f[j] == 8 and #f[j + 1] == 16 and now - struct.unpack('>d', f[j + 1], 9) > ttl then
      redis.call('HDEL', K_RPL, f[j])
    end
  end
  redis.call('HSET', K_RPL, '~', r[1])
  redis.call('PEXPIRE', K_RPL, ttl)  -- and all of it once no timeout was replayed for a ttl
end
local replayed = store_chunks(chunks)
local dead, dead_n = ARGV[5], 0
for p = 1, #dead - 7, 8 do
  local old = string.sub(dead, p, p + 7)
  local v = redis.call('HGET', K_FAILED, old)
  if v then
    local t, rlen = struct.unpack('>dI2', v)
    if rlen >= NO_REPLAY then rlen = rlen - NO_REPLAY end
    redis.call('XADD', KEYS[12], '*', 'sid', old, 'failed_ms', string.format('%.0f', t),
      'dead_ms', ARGV[6], 'reason', string.sub(v, FL_REASON, FL_REASON - 1 + rlen),
      'frame', string.sub(v, FL_REASON + rlen))
    redis.call('HDEL', K_FAILED, old)
    redis.call('ZREM', K_DUE, old)
    dead_n = dead_n + 1
  end
end
settle_counts()
-- always a write, even of 0: a retried call then moves this connection's replication offset past
-- the first call's writes, so the WAIT/WAITAOF that follows it covers them (SourceStore.run_durable)
redis.call('HINCRBY', K_STATS, 'replayed', replayed)
if dead_n > 0 then redis.call('HINCRBY', K_STATS, 'dead_lettered', dead_n) end
return {replayed, dead_n}
"""
)

REQUEUE = (
    r"""
-- requeue: move dead letters back into their channel streams as new source records.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, dlq, ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, num_channels, chunks (persist input of the new records),
--       entry ids (per chunk, per index: [entry id length u16][entry id], length 0 for a hole)
-- Returns: records requeued, or {-1, chunk id} if a new chunk id is in use (nothing written).
-- Per record, atomically: if XDEL removed the dead letter, its new frame is filed like a new
-- record (chunk, current bucket, channel stream); an entry already gone (purged, requeued
-- elsewhere) leaves a hole. Error (nothing written) if the input is malformed.
"""
    + _STATE
    + PERSIST_LIB
    + r"""
CH_BASE = 12
local chunks, bad = read_input('requeue')
if not chunks then return bad end
local ids, pos, eids = ARGV[4], 1, {}
for _, c in ipairs(chunks) do
  local mine = {}
  for i = 0, c.n - 1 do
    if pos + 1 > #ids then return redis.error_reply('ftlayer requeue: entry ids end at byte ' .. pos) end
    local len = struct.unpack('>I2', ids, pos)
    mine[i] = string.sub(ids, pos + 2, pos + 1 + len)
    pos = pos + 2 + len
  end
  eids[#eids + 1] = mine
end
local used = chunk_in_use(chunks)
if used then return {-1, used} end
for k, c in ipairs(chunks) do
  take_records(c, function(i)
    local eid = eids[k][i]
    return eid ~= '' and redis.call('XDEL', KEYS[12], eid) == 1
  end)
end
local count = store_chunks(chunks)
settle_counts()
redis.call('HINCRBY', K_STATS, 'requeued', count)  -- even 0: see REPLAY (a retry's wait covers the first call)
return count
"""
)

MIGRATE = (
    r"""
-- migrate: move records of a layout-format-2 source (one `pend` entry each) into chunks.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, pend, ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, num_channels, chunks (persist input of the records under new ids),
--       olds (per chunk, per index: the record's format-2 sid, 8 bytes)
-- Returns: records moved; {-1, chunk id} if a new chunk id is in use while some old id is still in
-- `pend` (nothing written: draw new ids). Per record, atomically: if HDEL removed the old entry,
-- the record is filed under its new id; else (moved by an earlier call) it is a hole. A retried
-- call whose records all moved returns 0.
"""
    + _STATE
    + PERSIST_LIB
    + r"""
CH_BASE = 12
local chunks, bad = read_input('migrate')
if not chunks then return bad end
local olds = ARGV[4]
local used = chunk_in_use(chunks)
if used then
  for p = 1, #olds - 7, 8 do
    if redis.call('HEXISTS', KEYS[12], string.sub(olds, p, p + 7)) == 1 then return {-1, used} end
  end
  return 0
end
take_by_olds(chunks, olds, function(old) return redis.call('HDEL', KEYS[12], old) == 1 end)
local count = store_chunks(chunks)
settle_counts()
return count
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
-- rescale: empty the channel streams of a drained shard, so its channel count may change.
-- KEYS: ck, failed, live, channel streams ch:0 .. ch:<recorded count - 1>
-- ARGV: (none)
-- Returns: {1, 0, 0} if the shard is drained (nothing pending, nothing failed and waiting for a
-- replay) and its streams are now empty; {0, pending records, failed} if records are still in
-- flight (nothing changed). Emptied streams can only name settled chunks; their last ids stay,
-- so readers never go back. The caller then changes the count in `meta` (META_CAS).
local chunks, failed = redis.call('HLEN', KEYS[1]), redis.call('HLEN', KEYS[2])
if chunks > 0 or failed > 0 then return {0, tonumber(redis.call('GET', KEYS[3]) or '0'), failed} end
for i = 4, #KEYS do redis.call('XTRIM', KEYS[i], 'MAXLEN', 0) end
return {1, 0, 0}
"""

META_CAS = r"""
-- meta_cas: set a field of a source's meta if it still holds the value the caller read.
-- KEYS: meta
-- ARGV: field, expected value, new value
-- Returns: 1 if set, 0 if the field held something else (nothing changed).
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
"""

READ_CHANNEL = (
    r"""
-- read_channel: the chunks of one channel between two stream positions that still hold pending
-- records, bounded.
-- KEYS: channel stream, ck, cf, rd (read watermarks), optionally hld:<tag> (the running
--       batch's hold set)
-- ARGV: start id ('-' = from the beginning), chunks of the start entry already read
--       (0 = all of it: the read begins after it; k > 0: it begins at the entry's (k+1)-th chunk),
--       end id (inclusive, '+' = to the end), max stream entries, max records to examine,
--       max frame bytes to return, time budget ms, channel number, hold set ttl ms (with KEYS[5]),
--       start chunk id ('' = none: with skip 0 the read begins at that chunk of the start entry,
--       which it includes), end chunk id ('' = none: the end entry is read up to that chunk, included)
-- Returns: {cursor id ('' if no entry was read), chunks of the cursor entry read (0 = all),
-- chunk id, state, frames, chunk id, state, frames, ...}: per chunk still pending, its id, its
-- `ck` state (header and settled bitmap) and its `cf` frames, as stored. The reader skips the
-- settled records itself (no work per record here), so a re-run batch re-reads exactly the
-- records of its range that still need processing. The call stops at the first limit reached
-- (after at least one chunk); passing the cursor back as the start reads on with the next chunk,
-- so a range is read whole, in order, each chunk once, however it is cut. Entries are fetched a
-- few at a time (doubling).
-- The channel's read watermark (`rd`) moves up to the cursor entry, the last entry this call
-- finished or entered (never back): its chunks count as handed to a task (see EXPIRE).
-- With a hold set, every chunk returned joins it: EXPIRE postpones their timeouts while the
-- hold lasts (a re-read adds nothing new: it is a set).
"""
    + CLOCK
    + r"""
local start, skip, last_id = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local max_e, max_n, max_b, budget = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local start_chunk, end_chunk = ARGV[10] or '', ARGV[11] or ''
local from = start
if start == '-' then
  skip = 0
elseif skip == 0 and start_chunk == '' then
  from = '(' .. start
end

local function chunk_pos(ids, key)
  for q = 1, #ids - KEY_BYTES + 1, KEY_BYTES do
    if string.sub(ids, q, q + KEY_BYTES - 1) == key then return (q - 1) / KEY_BYTES end
  end
  return nil
end
local t0, out, n, bytes, ents, fetch, done = clock_ms(), {'', 0}, 0, 0, 0, 4, false
local mark_g = nil
while not done and ents < max_e do
  local entries = redis.call('XRANGE', KEYS[1], from, last_id, 'COUNT', math.min(fetch, max_e - ents))
  if #entries == 0 then break end
  fetch = math.min(fetch * 2, 256)
  for _, e in ipairs(entries) do
    ents = ents + 1
    local f, ids, g = e[2], '', nil
    for i = 1, #f - 1, 2 do
      if f[i] == 'c' then ids = f[i + 1] elseif f[i] == 'g' then g = f[i + 1] end
    end
    local total, pos = math.floor(#ids / KEY_BYTES), 0
    if skip > 0 and e[1] == start then
      pos = skip
    elseif start_chunk ~= '' and e[1] == start then
      pos = chunk_pos(ids, start_chunk) or 0
    end
    skip = 0
    local stop_at = total
    if end_chunk ~= '' and e[1] == last_id then stop_at = (chunk_pos(ids, end_chunk) or (total - 1)) + 1 end
    while pos < stop_at do
      local key = string.sub(ids, KEY_BYTES * pos + 1, KEY_BYTES * (pos + 1))
      pos = pos + 1
      local st = redis.call('HGET', KEYS[2], key)
      if not st then n = n + 1 end  -- a settled chunk costs one look-up: count it as one record
      if st then
        local fr = redis.call('HGET', KEYS[3], key) or ''
        out[#out + 1] = key
        out[#out + 1] = st
        out[#out + 1] = fr
        bytes = bytes + #fr
        n = n + struct.unpack('>I2', st, CK_N)
      end
      if n >= max_n or bytes >= max_b or clock_ms() - t0 >= budget then done = true; break end
    end
    out[1] = e[1]
    mark_g = g or '2147483648'  -- an entry written without its gen: count everything before it as read
    if pos < stop_at then out[2] = pos else out[2] = 0 end
    if done then break end
  end
  from = '(' .. out[1]
end
if mark_g then
  local mark = redis.call('HGET', KEYS[4], ARGV[8])
  local newer = not mark
  if mark then
    local mm, ms = string.match(mark, ' (%d+)-(%d+)$')
    local lm, ls = string.match(out[1], '^(%d+)-(%d+)$')
    mm, ms, lm, ls = tonumber(mm), tonumber(ms), tonumber(lm), tonumber(ls)
    newer = lm > mm or (lm == mm and ls > ms)
  end
  if newer then redis.call('HSET', KEYS[4], ARGV[8], mark_g .. ' ' .. out[1]) end
end
if KEYS[5] and #out > 2 then
  local batch = {}
  for i = 3, #out, 3 do
    batch[#batch + 1] = out[i]
    if #batch == 1000 then redis.call('SADD', KEYS[5], unpack(batch)); batch = {} end
  end
  if #batch > 0 then redis.call('SADD', KEYS[5], unpack(batch)) end
  redis.call('PEXPIRE', KEYS[5], ARGV[9])
end
return out
"""
)

TOUCH = (
    r"""
-- touch: restart the timeouts of records a slow operator is still processing (Storm's resetTimeout).
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt
-- ARGV: prefix, source record ids (n x 8 bytes)
-- Returns: the chunks re-filed. Timeouts are per chunk: each still-pending chunk the ids fall in
-- moves to the current bucket with its flags cleared, so none of its records fails before
-- timeout_s from now unless it is acked or failed first. An id no longer pending is skipped, and
-- a chunk already in the current bucket stays: touching is idempotent.
"""
    + _STATE
    + r"""
local cur = tonumber(redis.call('GET', K_GEN) or '0')
local seen, moved, blob = {}, {}, ARGV[2]
for p = 1, #blob - 7, 8 do
  local key = string.sub(blob, p, p + KEY_BYTES - 1)
  if not seen[key] then
    seen[key] = true
    local c = chunk_load(key)
    if c and c.gen ~= cur then
      bucket_done(c.gen)
      c.gen, c.flags, c.dirty = cur, 0, true
      chunk_save(c)
      moved[#moved + 1] = key
    end
  end
end
if #moved > 0 then
  redis.call('RPUSH', K_BKT, struct.pack('>I4', cur) .. table.concat(moved))
  redis.call('HINCRBY', K_BCNT, cur, #moved)
end
settle_counts()
return #moved
"""
)

HOLD = r"""
-- hold: start, renew or end the hold of a running micro-batch (timeouts follow progress).
-- KEYS: holds, hld:<tag>
-- ARGV: op ('start' | 'renew' | 'end'), tag, deadline ms, started ms
-- start: holds[tag] = "<deadline> <started>"; renew: the same, only while holds[tag] exists (a
-- hold that was ended stays ended, so a late heartbeat cannot revive it); end: delete holds[tag]
-- and the set of the chunks the batch read.
-- Returns: 1 if the hold exists after the call, else 0.
local op, tag = ARGV[1], ARGV[2]
if op == 'end' then
  redis.call('HDEL', KEYS[1], tag)
  redis.call('DEL', KEYS[2])
  return 0
end
if op == 'renew' and redis.call('HEXISTS', KEYS[1], tag) == 0 then return 0 end
redis.call('HSET', KEYS[1], tag, ARGV[3] .. ' ' .. ARGV[4])
return 1
"""

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

TRIM_DONE = (
    r"""
-- trim_done: drop the head of a channel stream whose chunks are all settled, bounded.
-- KEYS: channel stream, ck
-- ARGV: max stream entries to examine, max chunks to examine, time budget ms
-- Returns: {entries removed, 1 if a limit stopped the call before a pending chunk or the
-- end of the stream (call again to go on), else 0}. Stops at the first entry that still
-- names a pending chunk. Safe at any time: an entry whose chunks all settled would be read
-- as empty anyway (readers skip chunks not in ck), and readers address ranges by stream id,
-- which trimming does not change. An entry is removed only once all its chunks were checked,
-- so a call cut short removes only whole finished entries.
"""
    + CLOCK
    + r"""
local max_e, max_n, budget = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local t0, n, ents, fetch, from = clock_ms(), 0, 0, 4, '-'
local done_upto, keep, more = nil, false, 0
while not keep and ents < max_e do
  local entries = redis.call('XRANGE', KEYS[1], from, '+', 'COUNT', math.min(fetch, max_e - ents))
  if #entries == 0 then break end
  fetch = math.min(fetch * 2, 256)
  for _, e in ipairs(entries) do
    local f, ids = e[2], ''
    for i = 1, #f - 1, 2 do
      if f[i] == 'c' then ids = f[i + 1] end
    end
    local left = math.floor(#ids / KEY_BYTES)
    if n > 0 and (n + left > max_n or clock_ms() - t0 >= budget) then more = 1; keep = true; break end
    for p = 1, #ids - KEY_BYTES + 1, KEY_BYTES do
      if redis.call('HEXISTS', KEYS[2], string.sub(ids, p, p + KEY_BYTES - 1)) == 1 then keep = true; break end
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
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, batch key (dfb:<tag>),
--       optionally rpl (replaced links, written by REPLAY)
-- ARGV: prefix, mode ('ack' | 'fail'), max list elements to take in this call, fail reason,
--       now ms, backoff initial ms, backoff multiplier, backoff max ms
-- Returns: {records settled in this call, list elements left, late completions}. The caller
-- repeats until nothing is left (bounded work per call: an element names at most a few chunks).
-- An element is k x [chunk id 6][bitmap length u16][bitmap of the records emitted]. A record no
-- longer pending (acked, failed by a row function) is skipped, so a record listed twice (a retried
-- task) settles once and a failed record is never acked.
-- A late completion ('ack' only, with rpl): a listed record that failed by *timeout* (its batch
-- ran past its hold) is in the committed output all the same, so its replay must not count
-- again: still waiting in `failed`, it leaves it (counted acked); already replayed, the copy it
-- links to (rpl, followed through further timeouts) is settled if still pending, so the reader
-- skips it. A copy already handed to a later batch cannot be recalled (the batches of one query
-- run one after another, and this runs before the next is planned).
"""
    + _STATE
    + r"""
local mode, budget, reason = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now, b_init, b_mult, b_max = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local K_RPL = KEYS[13]
local settled, late_n = 0, 0
local function complete_late(sid, depth)
  -- sid was emitted by the committed batch and is no longer pending: cancel its timeout's replay
  local v = redis.call('HGET', K_FAILED, sid)
  if v then
    local rlen = struct.unpack('>I2', v, FL_REASON - 2)
    if rlen == 7 and string.sub(v, FL_REASON, FL_REASON + 6) == 'timeout' then
      redis.call('HDEL', K_FAILED, sid)
      redis.call('ZREM', K_DUE, sid)
      return 1
    end
    return 0
  end
  local link = redis.call('HGET', K_RPL, sid)
  if not link or depth > 64 then return 0 end
  redis.call('HDEL', K_RPL, sid)
  local nsid = string.sub(link, 1, 8)
  local nc = chunk_load(string.sub(nsid, 1, KEY_BYTES))
  local ni = struct.unpack('>I2', nsid, KEY_BYTES + 1)
  if nc and chunk_pending(nc, ni) then
    chunk_settle(nc, ni)
    chunk_save(nc)
    return 1
  end
  return complete_late(nsid, depth + 1)  -- the copy timed out too: follow it
end
local function late_bits(key, byte_no, bits)
  for k = 0, 7 do
    if bit.band(bits, P2[k + 1]) ~= 0 then
      late_n = late_n + complete_late(key .. struct.pack('>I2', 8 * (byte_no - 1) + k), 0)
    end
  end
end
local check_late = mode == 'ack' and K_RPL ~= nil
while budget > 0 do
  local blob = redis.call('LPOP', KEYS[12])
  if not blob then break end
  budget = budget - 1
  local pos = 1
  while pos + KEY_BYTES + 1 <= #blob do
    local key = string.sub(blob, pos, pos + KEY_BYTES - 1)
    local nb = struct.unpack('>I2', blob, pos + KEY_BYTES)
    local b0 = pos + KEY_BYTES + 2
    pos = b0 + nb
    local c = chunk_load(key)
    if not c and check_late then  -- every record of the chunk settled: some may have timed out
      for b = 1, nb do
        local emitted = string.byte(blob, b0 + b - 1)
        if emitted ~= 0 then late_bits(key, b, emitted) end
      end
    end
    if c then
      for b = 1, math.min(nb, #c.bits) do
        local emitted = string.byte(blob, b0 + b - 1)
        if check_late then
          local gone = bit.band(emitted, c.bits[b], 255)
          if gone ~= 0 then late_bits(key, b, gone) end
        end
        local todo = bit.band(emitted, bit.bnot(c.bits[b]), 255)
        if todo ~= 0 then
          for k = 0, 7 do
            local i = 8 * (b - 1) + k
            if bit.band(todo, P2[k + 1]) ~= 0 and i < c.n then
              if mode == 'fail' then
                chunk_fail(c, i, reason, now, b_init, b_mult, b_max, false)
              else
                chunk_settle(c, i)
              end
              settled = settled + 1
            end
          end
        end
      end
      chunk_save(c)
    end
  end
end
settle_counts()
if settled + late_n > 0 then
  redis.call('HINCRBY', K_STATS, mode == 'fail' and 'failed_explicit' or 'acked', settled + late_n)
end
if late_n > 0 then redis.call('HINCRBY', K_STATS, 'late_completions', late_n) end
return {settled, redis.call('LLEN', KEYS[12]), late_n}
"""
)


#: Every script the store may run; each gets the shebang and :data:`~ftlayer.lua_lib.LAYOUT` in front.
SCRIPT_NAMES = (
    "PERSIST", "FLUSH", "ROTATE", "EXPIRE", "REPLAY", "READ_CHANNEL", "LEASE", "RELEASE", "TRIM_DONE", "REQUEUE",
    "DEAD_LETTER", "RESCALE", "BATCH_SETTLE", "PENDING", "MIGRATE", "META_CAS", "HOLD", "TOUCH",
)
#: First line of every script: a ``#!lua`` shebang makes the server hold a script to the
#: keys it declares (a cluster refuses any other key; Redis >= 7.0 or Valkey needed).
SHEBANG = "#!lua\n"
for _name in SCRIPT_NAMES:
    globals()[_name] = SHEBANG + LAYOUT + globals()[_name]
