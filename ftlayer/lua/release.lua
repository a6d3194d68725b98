-- release: give up the rotator lease if the caller holds it.
-- KEYS: lease
-- ARGV: owner
--   owner: the owner token
-- Returns: 1 if released, 0 otherwise.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
