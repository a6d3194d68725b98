-- Chunks (ftlayer.records.chunks). chunk_load reads a chunk into a Lua table holding its header fields
-- and its settled bitmap as a table of byte values; records are settled by flipping a bit of that
-- table (chunk_settle) and the state is written back once per chunk (chunk_save), or the chunk's
-- three fields are deleted when its last record settles. The ack value of a pending record is its
-- initial value (ci, read lazily once per chunk) unless a partial XOR was applied to it, which then
-- lives in xv (a tree split over several flushes); `partials` counts those per chunk, so a chunk
-- without any never looks there. A record's frame is found by walking the length prefixes of the
-- chunk's frames once per chunk (only failing records need frames in a script).
-- Needs lib/keys.lua and lib/counts.lua before it.

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
  -- cannot decode and dead-letters: never a silent loss. The walk stops after n entries: the
  -- chunk CRC that may follow them (ftlayer.records.chunk_crc) is never read here
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

local TIMEOUT_REASON = 'timeout'  -- the reason EXPIRE fails a record with (ftlayer.acker.replayer.TIMEOUT_REASON)

local function failed_by_timeout(v)
  -- whether `failed` value v (FAILED_PREFIX, reason, frame) is a timeout's, waiting for its replay
  return struct.unpack('>I2', v, FL_REASON - 2) == #TIMEOUT_REASON
    and string.sub(v, FL_REASON, FL_REASON + #TIMEOUT_REASON - 1) == TIMEOUT_REASON
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
