-- batch_settle: ack (or fail) every still-pending record a micro-batch's read tasks emitted.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, dfb:*, rpl?, dfs:*?
--   dfb:* is the batch key (dfb:<tag>); rpl (optional) the replaced links, written by REPLAY;
--   dfs:* (optional, with rpl) the batch's read notes (dfs:<tag>, written by READ_CHANNEL)
-- ARGV: prefix, mode, max_elements, reason, now_ms, backoff_initial_ms, backoff_multiplier, backoff_max_ms
--   mode: 'ack' | 'fail'; max_elements: list elements to take in this call; reason: the fail reason
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
-- Completed late only if every read of the batch handed the record on (dfs:<tag>): not a record a
-- read found no longer pending, nor any record of a chunk that some read of its partition did not
-- return (a foreachBatch function's second action, a task's retry, a re-run after a restart: the
-- output may come from that read); their replays write them. dfs:<tag> goes with the batch key.
-- A record a row function failed after its timeout is not completed late either: FLUSH left the
-- NO_LINK mark in its rpl field.

--@include lib/keys.lua

--@include lib/counts.lua

--@include lib/chunk.lua

local mode, budget, reason = ARGV[2], tonumber(ARGV[3]), ARGV[4]
local now, b_init, b_mult, b_max = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local K_RPL, K_DFS = KEYS[13], KEYS[14]
local settled, late_n = 0, 0
local MASKS = {}
local function not_handed_on(key, byte_no)
  -- the bits of byte byte_no of chunk key that some read of the batch did not hand on (255: all)
  if not K_DFS then return 0 end
  local m = MASKS[key]
  if m == nil then
    m = redis.call('HGET', K_DFS, key) or ''
    local v = tonumber(redis.call('HGET', K_DFS, 'n' .. key) or '')
    if m ~= '*' and v then
      local ch = math.floor(v / 16777216)
      local reads = tonumber(redis.call('HGET', K_DFS, 'r' .. ch) or '0')
      if v - ch * 16777216 < reads then m = '*' end  -- a read of its partition did not return it
    end
    MASKS[key] = m
  end
  if m == '*' then return 255 end
  return string.byte(m, byte_no) or 0
end
local function complete_late(sid, depth)
  -- sid was emitted by the committed batch and is no longer pending: cancel its timeout's replay
  local link = redis.call('HGET', K_RPL, sid)
  if link and string.sub(link, 1, 8) == NO_LINK then return 0 end  -- a row function failed it
  local v = redis.call('HGET', K_FAILED, sid)
  if v then
    if failed_by_timeout(v) then
      redis.call('HDEL', K_FAILED, sid)
      redis.call('ZREM', K_DUE, sid)
      return 1
    end
    return 0
  end
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
  bits = bit.band(bits, bit.bnot(not_handed_on(key, byte_no)), 255)
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
local left = redis.call('LLEN', KEYS[12])
if left == 0 and K_DFS then redis.call('DEL', K_DFS) end
return {settled, left, late_n}
