-- expire: fail the still-pending records of expired buckets, in bounded chunks of work.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, expq, rd, holds, hld:*[h], ch:*...
--   rd: read watermarks; hld:<tag> of each of the h holds the caller found live; then the channel
--   streams ch:0 .. ch:<num_channels - 1>
-- ARGV: prefix, now_ms, backoff_initial_ms, backoff_multiplier, backoff_max_ms, max_records, max_bytes,
--       budget_ms, h, hold_tags[h]
--   max_records: records to examine; max_bytes: frame bytes to move; budget_ms: time budget; the h hold tags
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

--@include lib/keys.lua

--@include lib/counts.lua

--@include lib/chunk.lua

--@include lib/clock.lua

--@include lib/entry.lua

local now, b_init, b_mult, b_max = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local max_n, max_b, budget = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local t0, n, bytes, out, stop = clock_ms(), 0, 0, {}, false
local cur = tonumber(redis.call('GET', K_GEN) or '0')
local refiled, unread_n = {}, 0
local marks, unread_after = {}, {}

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
        local ids, g = entry_fields(en)
        if not g or tonumber(g) ~= m[1] then done = true; break end
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
              bytes = bytes + chunk_fail(c, i, TIMEOUT_REASON, now, b_init, b_mult, b_max, false)
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
