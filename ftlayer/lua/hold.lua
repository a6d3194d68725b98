-- hold: start, renew or end the hold of a running micro-batch (timeouts follow progress).
-- KEYS: holds, hld:*
--   hld:<tag>: the set of the chunks the batch read
-- ARGV: op, tag, deadline_ms, started_ms
--   op: 'start' | 'renew' | 'end'
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
