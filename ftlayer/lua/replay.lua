-- replay: re-persist failed records under new ids, or dead-letter them.
-- KEYS: ck, ci, cf, xv, live, gen, bcnt, failed, due, stats, bkt, dlq, ch:*[num_channels], rpl?
--   ch:*: the channel streams ch:0 .. ch:<num_channels - 1>; rpl (optional): replaced links
-- ARGV: prefix, num_channels, replays, olds, dead, now_ms, link_ttl_ms?, timed_out?
--   replays: persist input, chunks of the new records; olds: per chunk, per index, the failed
--   record's old sid, 8 bytes; dead: n x [old sid 8]; link_ttl_ms (with rpl); timed_out: the old
--   sids among olds that failed by timeout (n x [sid 8], with rpl)
-- Returns: {replayed, dead-lettered}, or {-1, chunk id} if a new chunk id is in use (nothing
-- written: the caller draws new ids). An old id no longer in `failed` (another replayer took it)
-- leaves a hole in its new chunk, so each failure is replayed at most once.
-- With rpl, a record that failed by timeout leaves the link old sid -> new sid (and the time):
-- its batch may still commit (a DataFrame batch that ran past its hold), and BATCH_SETTLE then
-- settles the copy instead. No link where FLUSH left its NO_LINK mark (a row function failed the
-- record after its timeout: its batch's output lacks it, so the copy must count). Each call that
-- writes links sweeps at least as many (HSCAN from the cursor kept in field `~`) and drops those
-- (and marks) older than the ttl: the hash stays bounded by the timeout rate times the ttl; the
-- whole hash expires a ttl after the last link.

--@include lib/keys.lua

--@include lib/counts.lua

--@include lib/chunk.lua

--@include lib/filing.lua

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
  if timed[old] and redis.call('HSETNX', K_RPL, old, chunk_sid(c, i) .. stamp) == 1 then
    links = links + 1  -- (a NO_LINK mark already there: a row function failed it late, FLUSH)
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
