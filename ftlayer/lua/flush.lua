-- flush: apply explicit fails, then XOR deltas, at most once per token.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, tok:*, rpl?
--   tok:* is the token key (a hash per micro-batch); rpl (optional): the replaced links (REPLAY)
-- ARGV: prefix, use_token, token_ttl_ms, deltas, fails, now_ms, backoff_initial_ms, backoff_multiplier,
--       backoff_max_ms, token_field, completing_only?, link_ttl_ms?
--   use_token: '1'|'0'; deltas: n x [sid 8][value 8], sorted by sid so the records of a chunk come
--   together; fails: n x [sid 8][reason len u16, top bit = no replay][reason]; token_field: the task's
--   flush in that batch; completing_only: '1': apply a delta only if it completes its record, leave
--   the others untouched (optional, default '0'); link_ttl_ms: the rpl ttl (with rpl)
-- Returns: {applied (1, or 0 if the token was seen), the deltas that did not complete their record,
--           as [position u32][status u8] each (status 0: the record is not pending (late), 2: applied,
--           its tree still open, 3: not applied (completing only)); every other delta completed its
--           record; late deltas, failed count}
-- A delta for a record that is not pending (already completed or failed) is ignored: late acks
-- never resurrect or corrupt a record. A fail for a record no longer pending is late too, but with
-- rpl it is not forgotten: if its timeout fired first (the record waits in `failed` for that
-- replay, or was replayed and linked to its copy), its rpl field becomes the no-copy mark
-- (NO_LINK and the time), so BATCH_SETTLE never completes it late (its batch's output lacks it:
-- a row function failed it) and REPLAY links no copy to it; its replay goes ahead. Any other late
-- fail writes nothing. A completing-only call needs no token: a delta it applies
-- settles its record, so the same call again finds nothing to change.
-- Cost: per chunk touched, two HGETs and one HSET (or three HDELs when its last record settles);
-- per delta, a few Lua steps on numbers (plus an HGET/HDEL in `xv` in a chunk whose trees are split).

--@include lib/keys.lua

--@include lib/counts.lua

--@include lib/chunk.lua

if ARGV[2] == '1' then
  if redis.call('HSETNX', KEYS[12], ARGV[10], '1') == 0 then
    redis.call('HINCRBY', K_STATS, 'duplicate_flushes', 1)
    return {0, '', 0, 0}
  end
  redis.call('PEXPIRE', KEYS[12], ARGV[3])  -- safety net: the batch's commit deletes it first
end
local now, b_init, b_mult, b_max = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local fails, failed_n, pos, cache = ARGV[5], 0, 1, {}
local K_RPL, no_link = KEYS[13], nil
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
  elseif K_RPL then  -- late: if its timeout fired first (waiting in `failed`, or linked to its copy), mark it
    local link = redis.call('HGET', K_RPL, sid)
    local waiting = not link and redis.call('HGET', K_FAILED, sid)
    if (link and string.sub(link, 1, 8) ~= NO_LINK) or (waiting and failed_by_timeout(waiting)) then
      no_link = no_link or (NO_LINK .. struct.pack('>d', now / 1000))
      redis.call('HSET', K_RPL, sid, no_link)
    end
  end
end
if no_link then redis.call('PEXPIRE', K_RPL, ARGV[12]) end
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
