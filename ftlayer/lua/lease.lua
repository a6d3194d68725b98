-- lease: acquire or renew the rotator lease.
-- KEYS: lease
-- ARGV: owner, ttl_ms
--   owner: the owner token
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
